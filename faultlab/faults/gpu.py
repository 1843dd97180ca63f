"""GPU faults: the GPU itself fails — an Xid/ECC error, a GPU that stays lost, out of memory,
a GPU slowed down by thermal throttling.

They produce the signatures real faults produce, through the channels real faults use:

- inside the victim rank, the exception torch raises for it at the rank's next accelerator
  operation (``faultlab.runtime.gpu`` says where and which: ``torch.AcceleratorError`` with
  torch's ``CUDA error: ...`` text, ``torch.OutOfMemoryError`` with the allocator's message), or
  a compute slowed down ``factor`` times;
- in the node's kernel-log stand-in ``RUN_DIR/gpu/<node>/xid.log`` (``FAULTLAB_XID_LOG``), an
  ``NVRM: Xid (PCI:...): N, ...`` line, kept as evidence after the undo;
- in NVML as ``pynvml`` sees it inside the job's processes (``faultlab.runtime.nvml_overlay``):
  a lost GPU, ECC counters and an Xid event, a recovery action, throttle reasons.

Injecting writes the node's GPU state file ``RUN_DIR/gpu/<node>/state.json``
(``FAULTLAB_GPU_STATE``), which every process of that node reads; undoing removes the fault's
entry. If faultlab is killed, its guard (``faultlab.reaper --gpu-dir``) removes every state file
of the job, so a sticky GPU never outlives the experiment; the Xid logs stay. A memory hog
(``gpu_oom`` on a real device) watches faultlab and exits with it.

``sticky: true`` marks the node's GPU failed until undone: every process started there fails at
its first accelerator use or health check, so restarting in place cannot heal it; faultlab
counts that node's exit as expected (``mark_lost``) — the question is whether the job goes on
without it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, field_validator, model_validator

from faultlab.errors import FaultError
from faultlab.fault_api import Fault, FaultContext, FaultParams, Victim, require
from faultlab.runtime.gpu import (
    FAKE_MEMORY_MIB,
    XIDS,
    read_state,
    state_paths,
    write_state,
    xid_line,
)

__all__ = ["GpuErrorFault", "GpuFault", "GpuOomFault", "GpuSlowFault", "SlowEpisodes",
           "device_memory_mib", "gpu_node_env"]

_INTERPRETERS = ("python", "python3", "torchrun")


def gpu_node_env(run_dir: Path, node: str, procs_per_node: int) -> dict[str, str]:
    """The variables every process of ``node`` gets when the experiment has a gpu fault."""
    from faultlab.runtime.bootstrap import bootstrap_env

    paths = state_paths(run_dir, node)
    paths["dir"].mkdir(parents=True, exist_ok=True)
    paths["xid_log"].touch()
    env = {"FAULTLAB_GPU_STATE": str(paths["state"]), "FAULTLAB_XID_LOG": str(paths["xid_log"]),
           "FAULTLAB_GPU_COUNT": str(procs_per_node)}
    # The bootstrap directory on PYTHONPATH (without FAULTLAB_BOOTSTRAP=1, which is level 0's
    # switch): its sitecustomize installs the in-rank hooks and the NVML overlay in every
    # Python process of the node, the reference trainer's and a health-check script's alike.
    env["PYTHONPATH"] = bootstrap_env()["PYTHONPATH"]
    return env


def device_memory_mib() -> tuple[float, str]:
    """The smallest device's memory (MiB) and where that figure comes from: the real NVML
    where this host has a GPU, else the faked device's."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            sizes = [pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total
                     for i in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
        if sizes:
            return min(sizes) / 2**20, "this host's smallest GPU (NVML)"
    except Exception:  # noqa: BLE001 - no NVML, no GPU: the faked device's size
        pass
    return float(FAKE_MEMORY_MIB), "the faked device (no GPU on this host)"


class GpuFault(Fault):
    """Base of the gpu faults: inject writes the victim node's GPU state, undo removes it."""

    family = "gpu"
    targets: ClassVar[tuple[str, ...]] = ("rank", "node")
    needs: ClassVar[tuple[str, ...]] = ("node_gpu_state",)
    reversible: ClassVar[bool] = True

    def __init__(self, params: FaultParams) -> None:
        super().__init__(params)
        self.fault_id = f"{self.type}-{uuid.uuid4().hex[:8]}"
        self._written: list[Path] = []
        self._hog: subprocess.Popen[bytes] | None = None
        self.xid_lines: list[str] = []

    @classmethod
    def refuses_target(cls, target: Any) -> str | None:
        command = getattr(target, "command", None)
        if not command:
            return None
        exe = os.path.basename(command[0])
        if exe.startswith(_INTERPRETERS) or command[0].endswith(".py"):
            return None
        return (f"it strikes inside the ranks through faultlab's Python bootstrap (a "
                f"sitecustomize that hooks torch and pynvml), and target.command starts with "
                f"{command[0]!r}, not a Python interpreter, so faultlab cannot reach its ranks "
                f"in-rank; start the command with python (python train.py ...) or torchrun")

    def _entry(self) -> dict[str, Any]:
        """The state entry's fields for the rank-side action, and under ``nvml`` what NVML
        shows of the device while the fault holds (``faultlab.runtime.nvml_overlay``): ``lost``
        (every call fails GpuIsLost), ``xid_event`` (an Xid critical-error event),
        ``ecc_uncorrected`` (the uncorrected ECC count rises), ``recovery_action`` (NVML's
        value), ``free_mib`` (memory left), ``throttled`` (slowdown reasons, 92 C, and the SM
        clock lowered ``clock_factor`` times, while the ``episodes`` schedule is on:
        ``faultlab.runtime.throttle``)."""
        return {}

    def inject(self, ctx: FaultContext, victim: Victim) -> dict[str, Any]:
        require(ctx, "node_gpu_state", self.type)
        node, devices, ranks = _victim(ctx, victim)
        paths = state_paths(ctx.run_dir, node)
        entry = {"id": self.fault_id, "type": self.type, "action": self.rank_action,
                 "devices": devices, "t": time.time(), "ranks": ranks, **self._entry()}
        extra = self._before_write(ctx, node, devices, entry)
        write_state(paths["state"], [*read_state(paths["state"]), entry])
        self._written.append(paths["state"])
        self._after_write(ctx, paths, devices, ranks)
        if self.xid_lines:
            extra["xid_lines"] = self.xid_lines  # the journal's copy of the kernel log
        return {"node": node, "devices": devices, "ranks": ranks,
                "state": str(paths["state"]), "xid_log": str(paths["xid_log"]), **extra}

    def _before_write(self, ctx: FaultContext, node: str, devices: list[int] | None,
                      entry: dict[str, Any]) -> dict[str, Any]:
        return {}

    def _after_write(self, ctx: FaultContext, paths: dict[str, Path],
                     devices: list[int] | None, ranks: list[int]) -> None:
        return None

    def undo(self, ctx: FaultContext) -> dict[str, Any]:
        """Clear the GPU state it wrote for the node (the next NVML and accelerator call sees
        a healthy GPU again) and stop its memory hog, if it started one."""
        cleared = []
        for path in self._written:
            write_state(path, [e for e in read_state(path) if e.get("id") != self.fault_id])
            cleared.append(str(path))
        self._written = []
        details: dict[str, Any] = {"cleared": cleared}
        if self._hog is not None:
            self._hog.terminate()
            try:
                self._hog.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._hog.kill()
            details["hog_reaped"] = self._hog.pid
            self._hog = None
        return details


class GpuErrorFault(GpuFault):
    """The victim's GPU fails with an Xid (79: lost); sticky keeps it failed until undone.

    Its next accelerator operation raises the CUDA error that Xid gives."""

    type = "gpu_error"
    rank_action = "faultlab.runtime.actions.gpu:GpuError"

    class Params(FaultParams):
        xid: int = Field(79, description="the Xid: 79 fallen off the bus (the device is "
                                         "lost); 48/94/95 uncorrectable ECC; 13/31 illegal "
                                         "address; 43 launch failure")
        sticky: bool = Field(False, description="true: the node's GPU stays failed until the "
                                                "fault is undone; every process started there "
                                                "fails at its first CUDA use or health check, "
                                                "like a real Xid 79 (false: a transient error "
                                                "that strikes once)")

        @field_validator("xid")
        @classmethod
        def _documented(cls, value: int) -> int:
            if value not in XIDS:
                raise ValueError(f"xid {value!r} is not in the documented table; valid: "
                                 f"{', '.join(map(str, sorted(XIDS)))}")
            return value

    params: Params

    def _entry(self) -> dict[str, Any]:
        p: GpuErrorFault.Params = self.params
        _, _, _, recovery, ecc = XIDS[p.xid]
        return {"xid": p.xid, "sticky": p.sticky,
                "nvml": {"lost": p.xid == 79, "xid_event": p.xid, "ecc_uncorrected": ecc,
                         "recovery_action": recovery}}

    def _before_write(self, ctx: FaultContext, node: str, devices: list[int] | None,
                      entry: dict[str, Any]) -> dict[str, Any]:
        if self.params.sticky:
            ctx.mark_lost(node)  # its processes fail for good: their exit is expected
        return {"xid": entry["xid"], "sticky": entry["sticky"]}

    def _after_write(self, ctx: FaultContext, paths: dict[str, Path],
                     devices: list[int] | None, ranks: list[int]) -> None:
        xid = self.params.xid
        lines = []
        for rank, device in zip(ranks, devices or range(len(ranks)), strict=False):
            try:
                pid: int | None = ctx.rank_pid(rank)
            except FaultError:
                pid = None
            lines.append(xid_line(xid, device, pid))
        with open(paths["xid_log"], "a", encoding="utf-8") as log:
            log.writelines(lines)
        self.xid_lines = [line.rstrip("\n") for line in lines]


class GpuOomFault(GpuFault):
    """The victim's next allocation fails with torch.OutOfMemoryError.

    Another process holds all but leave_mib of its GPU (a memory hog on CUDA; on CPU the
    allocator's error is raised at the next forward)."""

    type = "gpu_oom"
    rank_action = "faultlab.runtime.actions.gpu:GpuOom"

    class Params(FaultParams):
        leave_mib: int = Field(1024, ge=0, description="MiB of the device left free (the hog "
                                                      "takes the rest)")

        @field_validator("leave_mib")
        @classmethod
        def _fits(cls, value: int) -> int:
            total, where = device_memory_mib()
            if value >= total:
                raise ValueError(f"leave_mib {value!r} is not smaller than the device: "
                                 f"{total:.0f} MiB ({where}); leave less free")
            return value

    params: Params

    def _entry(self) -> dict[str, Any]:
        total, _ = device_memory_mib()
        leave = self.params.leave_mib
        return {"leave_mib": leave, "total_mib": total, "nvml": {"free_mib": leave}}

    def _before_write(self, ctx: FaultContext, node: str, devices: list[int] | None,
                      entry: dict[str, Any]) -> dict[str, Any]:
        if not _has_cuda():
            return {"mechanism": "raised at the next forward (no GPU on this host)"}
        self._hog = subprocess.Popen(
            [sys.executable, "-m", "faultlab.faults._gpu_hog", "--parent", str(os.getpid()),
             "--leave-mib", str(entry["leave_mib"]), "--devices",
             ",".join(map(str, devices or [0]))], stdin=subprocess.DEVNULL)
        entry["hog_pid"] = self._hog.pid
        return {"mechanism": "memory hog", "hog_pid": self._hog.pid}


class SlowEpisodes(FaultParams):
    """``gpu_slow``'s episodes: slow for ``on``, full speed for ``off``, repeating from the
    injection until undone; in seconds or in steps, not both."""

    on_s: float | None = Field(None, gt=0, le=86_400, allow_inf_nan=False,
                               description="seconds of each slow episode")
    off_s: float | None = Field(None, gt=0, le=86_400, allow_inf_nan=False,
                                description="seconds at full speed between episodes")
    on_steps: int | None = Field(None, ge=1, description="steps of each slow episode")
    off_steps: int | None = Field(None, ge=1, description="steps at full speed between "
                                                          "episodes")

    @model_validator(mode="after")
    def _one_pair(self) -> SlowEpisodes:
        given = {k for k, v in self.model_dump().items() if v is not None}
        if given not in ({"on_s", "off_s"}, {"on_steps", "off_steps"}):
            raise ValueError(f"episodes gives {sorted(given)!r}; give either on_s and off_s "
                             f"(seconds: a thermal cycle) or on_steps and off_steps (steps: "
                             f"the same on every machine), e.g. {{on_steps: 3, off_steps: 5}}")
        return self


class GpuSlowFault(GpuFault):
    """Thermal throttling: the victim's compute takes factor times as long (runs at speed
    1/factor), steadily or in episodes.

    NVML follows it: the SM clock at its maximum / factor, throttle reasons and 92 C while
    slow, healthy between episodes and after the undo."""

    type = "gpu_slow"
    rank_action = "faultlab.runtime.actions.gpu:GpuSlow"
    slows_job: ClassVar[bool] = True

    class Params(FaultParams):
        factor: float | None = Field(None, allow_inf_nan=False, description="how many times "
                                     "as long the victim's compute takes (> 1, at most 100; "
                                     "default 1.5 when speed is not given either); a delay "
                                     "scaled to each step's measured compute, plus a spin "
                                     "kernel on CUDA")
        speed: float | None = Field(None, allow_inf_nan=False, description="the victim's "
                                    "speed instead of factor: 0.7 runs at 0.7x, the same as "
                                    "factor 1/0.7 (0.01 <= speed < 1); give factor or speed, "
                                    "not both")
        episodes: SlowEpisodes | None = Field(None, description="slow in episodes, not "
                                              "steadily: {on_s, off_s} (seconds, as a GPU's "
                                              "thermal cycle goes) or {on_steps, off_steps} "
                                              "(steps: the same on every machine); default "
                                              "steady until undone")

        @field_validator("factor")
        @classmethod
        def _slower(cls, value: float | None) -> float | None:
            if value is not None and not 1.0 < value <= 100.0:
                raise ValueError(f"factor {value!r} must be > 1 and at most 100 (1 is full "
                                 f"speed; gpu_slow slows the GPU down), e.g. factor: 1.1")
            return value

        @field_validator("speed")
        @classmethod
        def _fraction(cls, value: float | None) -> float | None:
            if value is not None and not 0.01 <= value < 1.0:
                raise ValueError(f"speed {value!r} must be >= 0.01 and < 1 (the victim's "
                                 f"fraction of full speed, e.g. speed: 0.7)")
            return value

        @model_validator(mode="after")
        def _factor_or_speed(self) -> GpuSlowFault.Params:
            if self.factor is not None and self.speed is not None:
                raise ValueError(f"factor {self.factor!r} and speed {self.speed!r} both given; "
                                 f"give one: factor F is speed 1/F")
            return self

        @property
        def slowdown(self) -> float:
            """The factor: given, from speed, or the default 1.5."""
            if self.speed is not None:
                return 1.0 / self.speed
            return 1.5 if self.factor is None else self.factor

    params: Params

    def _entry(self) -> dict[str, Any]:
        p: GpuSlowFault.Params = self.params
        episodes = p.episodes.model_dump(exclude_none=True) if p.episodes else None
        return {"factor": p.slowdown, "episodes": episodes,
                "nvml": {"throttled": True, "clock_factor": p.slowdown, "episodes": episodes}}


def _victim(ctx: FaultContext, victim: Victim) -> tuple[str, list[int] | None, list[int]]:
    """The victim's node, its device indexes (None: every device of the node) and its ranks
    now. A rank's device is its local rank: its place among its node's ranks."""
    if victim.kind == "node":
        nodes = ctx.node_names()
        if int(victim.value or 0) >= len(nodes):
            raise FaultError(f"node {victim.value}: the job has {len(nodes)} node(s)")
        node = nodes[int(victim.value or 0)]
        ranks = sorted(r for r in ctx.ranks() if ctx.node_of_rank(r) == node)
        return node, None, ranks
    rank = int(victim.value or 0)
    try:
        node = ctx.node_of_rank(rank)
    except (FaultError, KeyError, IndexError) as e:
        raise FaultError(f"rank {rank} is not running now: {e}") from e
    mates = sorted(r for r in ctx.ranks() if ctx.node_of_rank(r) == node)
    return node, [mates.index(rank)], [rank]


def _has_cuda() -> bool:
    return device_memory_mib()[1].startswith("this host")
