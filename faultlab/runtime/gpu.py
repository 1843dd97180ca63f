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
           "read_state", "state_paths", "write_state", "xid_line"]

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
    return [f for f in faults or [] if isinstance(f, Mapping)]


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
    step = 0
    model = None
    optimizer = None

    def __init__(self, state: GpuState, entry: FaultEntry) -> None:
        self._state, self.entry = state, entry
        self.rank = state.rank  # type: ignore[assignment]
        self.device = state.device

    def claim(self, key: str) -> bool:
        return self._state.claim(f"{self.entry.id}.{key}")

    def struck(self, **details: Any) -> None:
        return None  # the action says so on stderr; faultlab journals the injection

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
        self._t_forward = self._wait_forward = 0.0
        self._struck_here: set[str] = set()

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
        for action in self.refresh(time.monotonic()):
            if uses(type(action), "before_forward"):
                try:
                    action.before_forward(module)
                except BaseException:
                    self._top = None
                    raise
        self._t_forward, self._wait_forward = time.monotonic(), cpu_wait_s()

    def post_forward(self, module: Any, args: Any, output: Any) -> None:
        if module is not self._top:
            return
        self._top = None
        wall = time.monotonic() - self._t_forward
        # less the time this thread waited for a CPU: on a busy host a forward's wall time
        # grows with the load, and a delay scaled to it would slow the rank by more than
        # ``factor`` (measured: a 1.2x gpu_slow beside other jobs made some steps 2-3x slower).
        # The kernel's count can run ahead of the wall clock (a wait longer than the forward,
        # seen in about one step in twenty on a busy host): then the wall time, uncorrected.
        waited = cpu_wait_s() - self._wait_forward
        forward_s = wall - waited if 0.0 <= waited <= wall else wall
        for action in list(self.actions.values()):
            if uses(type(action), "after_forward"):
                action.after_forward(module, forward_s)


def cpu_wait_s() -> float:
    """Seconds this thread has been runnable but not running (waiting for a CPU), from the
    kernel's ``/proc/thread-self/schedstat`` (its second field); 0.0 where it keeps none."""
    try:
        with open("/proc/thread-self/schedstat", encoding="ascii") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


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
