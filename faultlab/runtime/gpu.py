"""GPU faults inside a rank: the signatures a failing GPU gives, where the rank meets them.

The faultlab side (``faultlab.faults.gpu``) never talks to a rank to inject a gpu fault: it
writes the node's *GPU state file*, ``RUN_DIR/gpu/<node>/state.json`` (``FAULTLAB_GPU_STATE``
in the environment of every process on that node), and appends the Xid line to the node's
kernel-log stand-in, ``RUN_DIR/gpu/<node>/xid.log`` (``FAULTLAB_XID_LOG``). A file rather than
the runtime agent's control channel because a GPU that stays lost (``sticky``) must fail every
process started on that node afterwards, at its first accelerator use or health check, until
the fault is undone, and such a process has no agent yet when it meets the fault. Everything
that reads the state (this module, the NVML overlay ``faultlab.runtime.nvml_overlay``, a
health-check script) sees the same thing.

``install()`` (run by the bootstrap right after ``import torch`` in every process of a node that
has a GPU state file, at every integration level) registers two global module hooks around the
*outermost* module forward of a rank (FSDP2's root, a LightningModule's model): the rank's
"next accelerator operation" on CPU, a stand-in for the first kernel a step launches. Each
entry of the state file names its rank-side action by import path (``action``, from the fault's
``rank_action``); the process loads the actions of the entries that strike its device and calls
their ``before_forward`` / ``after_forward`` hooks (``faultlab.runtime.hooks``). What
``gpu_error``, ``gpu_oom`` and ``gpu_slow`` do there: ``faultlab.runtime.actions.gpu``. A
once-per-job strike claims a marker under ``struck/`` (``GpuState.claim``), so a restarted
process does not meet it again.

The state is re-read at most every ``POLL_S`` (one ``stat`` per outermost forward otherwise).
This module imports only the standard library (and ``hooks``, ``plan``) at import time; torch
only inside ``install``, and an action's module only when an entry names it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from faultlab.runtime.hooks import RankAction, load_action, uses
from faultlab.runtime.plan import FaultEntry, PlanError

__all__ = ["FAKE_MEMORY_MIB", "POLL_S", "XIDS", "GpuState", "accelerator_error",
           "cuda_error_message", "device_entries", "install", "oom_message", "pci_bus_id",
           "read_state", "runnable_wait_s", "state_paths", "write_state", "xid_line"]

POLL_S = 0.02
"""How often (at most) a rank re-reads its node's GPU state file."""

FAKE_MEMORY_MIB = 81_559
"""Total memory of the faked device where there is no GPU (an H100 80GB HBM3 as NVML reports
it: 81559 MiB)."""

#: The documented Xid table: xid -> (kernel-log text, CUDA error text in the running process,
#: CUDA error text in a process started on the node afterwards (sticky), NVML recovery action,
#: ECC). Recovery actions are NVML's values: 0 NONE, 1 GPU_RESET, 2 NODE_REBOOT.
XIDS: dict[int, tuple[str, str, str, int, bool]] = {
    13: ("Graphics Engine Exception", "an illegal memory access was encountered",
         "an illegal memory access was encountered", 0, False),
    31: ("MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f_12340000",
         "an illegal memory access was encountered",
         "an illegal memory access was encountered", 0, False),
    43: ("Ch 00000010, errorString CTX SWITCH TIMEOUT", "unspecified launch failure",
         "unspecified launch failure", 0, False),
    48: ("An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer",
         "uncorrectable ECC error encountered", "uncorrectable ECC error encountered", 1, True),
    79: ("GPU has fallen off the bus.", "unspecified launch failure",
         "CUDA-capable device(s) is/are busy or unavailable", 2, False),
    94: ("Contained: SM (0x1). RST: No, D-RST: No", "uncorrectable ECC error encountered",
         "uncorrectable ECC error encountered", 1, True),
    95: ("Uncontained: FBHUB. RST: Yes, D-RST: No", "uncorrectable ECC error encountered",
         "uncorrectable ECC error encountered", 1, True),
}

_TORCH_TAIL = ("\nCUDA kernel errors might be asynchronously reported at some other API call, "
               "so the stacktrace below might be incorrect.\nFor debugging consider passing "
               "CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side "
               "assertions.\n")


def cuda_error_message(xid: int, *, new_process: bool = False) -> str:
    """The text torch gives the exception of a CUDA error caused by ``xid``."""
    _, running, fresh, _, _ = XIDS[xid]
    return f"CUDA error: {fresh if new_process else running}{_TORCH_TAIL}"


def pci_bus_id(device: int) -> str:
    """The faked device's PCI bus id, as the kernel log writes it (``0000:1b:00``)."""
    return f"0000:{0x1b + 0x10 * device:02x}:00"


def xid_line(xid: int, device: int, pid: int | None, name: str = "python",
             uptime_s: float | None = None) -> str:
    """One kernel-log line of an Xid, in the format health agents parse
    (``NVRM: Xid \\(PCI:([0-9a-fA-F:.]+)\\): (\\d+)``)."""
    if uptime_s is None:
        uptime_s = time.clock_gettime(time.CLOCK_BOOTTIME)
    shown = "'<unknown>'" if pid is None else pid
    return (f"[{uptime_s:12.6f}] NVRM: Xid (PCI:{pci_bus_id(device)}): {xid}, pid={shown}, "
            f"name={name}, {XIDS[xid][0]}\n")


def oom_message(*, device: int, request_bytes: int, total_mib: float, free_mib: float,
                process_bytes: int, hog_pid: int | None, allocated_bytes: int) -> str:
    """The message of torch's CUDA caching allocator when an allocation fails."""
    gib = 1024 ** 3
    hog_mib = max(0.0, total_mib - free_mib - process_bytes / 2**20)
    other = (f"Process {hog_pid} has {hog_mib / 1024:.2f} GiB memory in use. "
             if hog_pid else "")
    return (f"CUDA out of memory. Tried to allocate {_size(request_bytes)}. GPU {device} has a "
            f"total capacity of {total_mib / 1024:.2f} GiB of which {_size(free_mib * 2**20)} "
            f"is free. Including non-PyTorch memory, this process has "
            f"{process_bytes / gib:.2f} GiB memory in use. {other}Of the allocated memory "
            f"{allocated_bytes / gib:.2f} GiB is allocated by PyTorch, and 0 bytes is reserved "
            f"by PyTorch but unallocated. If reserved but unallocated memory is large try "
            f"setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
            f"  See documentation for Memory Management  "
            f"(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} bytes"


# --- the state file -------------------------------------------------------------------------

def state_paths(run_dir: str | os.PathLike[str], node: str) -> dict[str, Path]:
    """Where a node's GPU state, kernel-log stand-in and struck markers live."""
    root = Path(run_dir) / "gpu" / node
    return {"dir": root, "state": root / "state.json", "xid_log": root / "xid.log",
            "struck": root / "struck"}


def read_state(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The active gpu faults of a node (none when the file is missing or being replaced)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    faults = doc.get("faults") if isinstance(doc, Mapping) else None
    return [f for f in faults or [] if isinstance(f, dict)]


def write_state(path: str | os.PathLike[str], faults: list[dict[str, Any]]) -> None:
    """Replace the node's state atomically (a rank never reads half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"faults": faults}, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def device_entries(faults: list[dict[str, Any]], device: int) -> list[dict[str, Any]]:
    """The entries that strike ``device`` (an entry's ``devices`` null: every device)."""
    return [f for f in faults if f.get("devices") is None or device in f["devices"]]


def accelerator_error() -> type[BaseException]:
    """The exception type torch raises for a CUDA error: ``torch.AcceleratorError`` where it
    exists (torch >= 2.8), else RuntimeError."""
    import torch

    return getattr(torch, "AcceleratorError", RuntimeError)


# --- in the rank ----------------------------------------------------------------------------

class _NodeRank:
    """What a gpu action sees of its process (``faultlab.runtime.hooks.Rank``): no agent here,
    the node's GPU state file is the channel."""

    live = True
    model = None
    optimizer = None

    def __init__(self, state: GpuState, entry: FaultEntry) -> None:
        self._state, self.entry = state, entry
        self.rank = state.rank
        self.device = state.device
        self.state_path = state.state_path

    @property
    def step(self) -> int:
        return self._state.step()

    def claim(self, key: str) -> bool:
        return self._state.claim(f"{self.entry.id}.{key}")

    def struck(self, **details: Any) -> None:
        return None  # the action says so on stderr; faultlab journals the injection

    def record(self, kind: str, **fields: Any) -> None:
        """A ground-truth record of this fault (``fault_struck``, ``fault_eased``)."""
        self._state.record(kind, fault_id=self.entry.id, type=self.entry.type, **fields)

    def failed(self, error: str) -> None:
        _say(f"{self.entry.type}: {error}", self._state.rank)


class GpuState:
    """One process's view of its device's faults: the actions the node's GPU state file names
    for this device, called around the outermost module forward."""

    def __init__(self, state_path: Path, device: int, rank: int | None) -> None:
        self.state_path = state_path
        self.device = device
        self.rank = rank
        self.struck_dir = state_path.parent / "struck"
        self._mtime_ns: int | None = None
        self._checked = 0.0
        self.entries: list[dict[str, Any]] = []
        self.actions: dict[str, RankAction] = {}
        self._top: Any = None
        self._t_forward = self._waited = 0.0
        self._timed = False
        self._struck_here: set[str] = set()
        self.forwards = 0
        """Outermost forwards so far: the step count where no runtime agent keeps one."""
        self._events: Any = None

    def step(self) -> int:
        """The rank's step: its runtime agent's (the reference trainer's, level 0's) while it
        is open, else the number of outermost forwards this process has begun."""
        from faultlab import runtime

        agent = runtime._current
        if agent is None or agent.closed:  # a closed agent's step stands still
            return self.forwards
        return agent.current_step

    def record(self, kind: str, **fields: Any) -> None:
        """One event record of this process's own (``-gpu`` file, or the node's relay);
        nothing outside faultlab (no ``FAULTLAB_RUN_DIR``)."""
        if self._events is None:
            from faultlab.runtime.events import EventLog

            self._events = EventLog.from_env(suffix="-gpu") or False
        if self._events:
            self._events.emit(kind, **fields)

    def refresh(self, now: float) -> list[RankAction]:
        if now - self._checked < POLL_S:
            return list(self.actions.values())
        self._checked = now
        try:
            mtime = os.stat(self.state_path).st_mtime_ns
        except OSError:
            mtime = None
        if mtime != self._mtime_ns:
            self._mtime_ns = mtime
            self.entries = device_entries(read_state(self.state_path), self.device)
            self._load_actions()
        return list(self.actions.values())

    def _load_actions(self) -> None:
        """An action per entry (kept while its entry stays; released when it goes)."""
        wanted: dict[str, RankAction] = {}
        for raw in self.entries:
            fid = str(raw.get("id"))
            if fid in self.actions:
                wanted[fid] = self.actions.pop(fid)
                continue
            path = raw.get("action")
            if not isinstance(path, str):
                continue
            entry = FaultEntry(id=fid, type=str(raw.get("type")), action=path, params=dict(raw))
            try:
                cls = load_action(path)
            except PlanError as e:
                _say(str(e), self.rank)
                continue
            wanted[fid] = cls(entry, _NodeRank(self, entry))  # type: ignore[arg-type]
        for gone in self.actions.values():
            gone.release()
        self.actions = wanted

    def claim(self, key: str) -> bool:
        """Claim a once-per-job strike (True: strike now): a marker under ``struck/``."""
        if key in self._struck_here:
            return False
        self._struck_here.add(key)
        self.struck_dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.struck_dir / key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({"pid": os.getpid(), "rank": self.rank, "t": time.time()}))
        return True

    def pre_forward(self, module: Any, args: Any) -> None:
        if self._top is not None and self._top is not module:
            return  # an inner module of a forward already under way
        self._top = module
        self.forwards += 1
        actions = self.refresh(time.monotonic())
        for action in actions:
            if uses(type(action), "before_forward"):
                try:
                    action.before_forward(module)
                except BaseException:
                    self._top = None
                    raise
        # the CPU wait is read only where an action stretches the compute (33-72 us a read on
        # the loaded 2-core machine; the hooks cost 2.4 us otherwise)
        self._timed = any(uses(type(a), "after_forward") or uses(type(a), "after_backward")
                          for a in actions)
        self._t_forward = time.monotonic()
        self._waited = runnable_wait_s() if self._timed else 0.0

    def post_forward(self, module: Any, args: Any, output: Any) -> None:
        if module is not self._top:
            return
        self._top = None
        if not self._timed:
            return
        forward_s = _compute_s(self._t_forward, self._waited)
        actions = list(self.actions.values())
        for action in actions:
            if uses(type(action), "after_forward"):
                action.after_forward(module, forward_s)
        backward = [a for a in actions if uses(type(a), "after_backward")]
        if backward:
            _watch_backward(module, output, backward)


def runnable_wait_s() -> float:
    """Seconds this thread has waited for a CPU (runnable, not running) since it started, from
    the scheduler's count (``/proc/thread-self/schedstat``'s second field); 0.0 where there is
    none. On a machine whose CPUs are shared (a busy host, a CPU quota that throttles the job) a
    forward's wall time includes that wait, which is no part of the compute a slow GPU
    stretches: a loaded 2-core host doubled the wall time of the tiny model's forward, and
    gpu_slow factor 3 slowed its compute 9.5 times; under a 1-CPU cap a fault-free rank's
    forward took 1.6 times its peer's for 3 steps in a row and was named a slow-compute
    straggler. The reference trainer's straggler score uses it too
    (``reference_trainer.health``)."""
    try:
        fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)  # half open()'s cost
        try:
            return int(os.read(fd, 128).split()[1]) / 1e9
        finally:
            os.close(fd)
    except (OSError, ValueError, IndexError):
        return 0.0


def _compute_s(t0: float, waited0: float) -> float:
    """Compute time since ``t0``: the wall time less the CPU wait since ``waited0``."""
    return max(0.0, time.monotonic() - t0 - (runnable_wait_s() - waited0))


def _watch_backward(module: Any, output: Any, actions: list[RankAction]) -> None:
    """Call ``after_backward`` of ``actions`` when the backward through ``output`` ends (the
    autograd engine's final callback), with its compute time: from the gradient of the
    output's first tensor that requires one (the backward's start there) to the callback."""
    import torch

    tensor = _grad_tensor(output)
    if tensor is None or not torch.is_grad_enabled():
        return

    def started(grad: Any) -> None:
        t0, waited0 = time.monotonic(), runnable_wait_s()

        def ended() -> None:
            backward_s = _compute_s(t0, waited0)
            for action in actions:
                if not action.released.is_set():
                    action.after_backward(module, backward_s)

        torch.autograd.Variable._execution_engine.queue_callback(ended)

    tensor.register_hook(started)


def _grad_tensor(output: Any) -> Any:
    if getattr(output, "requires_grad", False) and hasattr(output, "register_hook"):
        return output
    items = output.values() if isinstance(output, Mapping) else \
        output if isinstance(output, (list, tuple)) else ()
    return next((t for t in map(_grad_tensor, items) if t is not None), None)


_STATE: GpuState | None = None


def install(env: Mapping[str, str] | None = None) -> GpuState | None:
    """Register the hooks in this process when its node has a GPU state file
    (``FAULTLAB_GPU_STATE``) and it is a rank (``LOCAL_RANK``); idempotent."""
    global _STATE
    env = os.environ if env is None else env
    path, local_rank = env.get("FAULTLAB_GPU_STATE"), env.get("LOCAL_RANK")
    if _STATE is not None or not path or local_rank is None:
        return _STATE
    from torch.nn.modules.module import (
        register_module_forward_hook,
        register_module_forward_pre_hook,
    )

    rank = env.get("RANK")
    state = GpuState(Path(path), int(local_rank), int(rank) if rank is not None else None)
    register_module_forward_pre_hook(state.pre_forward)
    register_module_forward_hook(state.post_forward)
    _STATE = state
    return state


def _say(what: str, rank: int | None) -> None:
    print(f"faultlab gpu: rank {rank}: {what}", file=sys.stderr, flush=True)
