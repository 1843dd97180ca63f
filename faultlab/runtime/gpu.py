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
has a GPU state file, at every integration level) registers two global module hooks. The
*outermost* module forward of a rank (FSDP2's root, a LightningModule's model) is the rank's
"next accelerator operation" on CPU: a stand-in for the first kernel a step launches.

- ``gpu_error``: the forward pre-hook raises what torch raises for that Xid —
  ``torch.AcceleratorError`` (torch >= 2.8; RuntimeError before) with torch's full
  ``CUDA error: ...`` text (``XIDS``). ``sticky: false`` strikes one process once
  (a marker file under ``struck/`` keeps a restarted process from meeting it again);
  ``sticky: true`` strikes every forward of every process on the node until undone, as a
  poisoned context and a lost device do. On a real CUDA device the context is poisoned for
  real first (an out-of-bounds index write: ``device-side assert triggered``, as measured on
  an H100); the same exception type then comes from CUDA itself.
- ``gpu_oom``: the forward pre-hook raises ``torch.OutOfMemoryError`` once, with the message
  torch's CUDA caching allocator writes (``oom_message``). On a real device the faultlab side
  starts a memory hog instead (``faultlab.faults.gpu``) and the allocation fails by itself.
- ``gpu_slow``: the forward post-hook of the outermost module sleeps ``(factor - 1) × 3 ×`` the
  measured forward time: the step's compute (forward + backward, backward taken as twice the
  forward, the usual FLOP ratio) takes ``factor`` times as long. On CUDA a spin kernel
  (``torch.cuda._sleep``) keeps the device really busy for the same time.

The state is re-read at most every ``POLL_S`` (one ``stat`` per outermost forward otherwise).
This module imports only the standard library at import time; torch only inside ``install``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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

class GpuState:
    """One process's view of its device's faults, and the hooks that make it felt."""

    def __init__(self, state_path: Path, device: int, rank: int | None) -> None:
        self.state_path = state_path
        self.device = device
        self.rank = rank
        self.struck_dir = state_path.parent / "struck"
        self._mtime_ns: int | None = None
        self._checked = 0.0
        self.entries: list[dict[str, Any]] = []
        self._top: Any = None
        self._t_forward = 0.0
        self._struck_here: set[str] = set()
        self.cuda = False

    def refresh(self, now: float) -> list[dict[str, Any]]:
        if now - self._checked < POLL_S:
            return self.entries
        self._checked = now
        try:
            mtime = os.stat(self.state_path).st_mtime_ns
        except OSError:
            mtime = None
        if mtime != self._mtime_ns:
            self._mtime_ns = mtime
            self.entries = device_entries(read_state(self.state_path), self.device)
        return self.entries

    def _first_strike(self, entry: dict[str, Any]) -> bool:
        """Claim a once-per-job strike of ``entry`` on this device (True: strike now)."""
        key = f"{entry['id']}.dev{self.device}"
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
        now = time.monotonic()
        for entry in self.refresh(now):
            kind = entry.get("type")
            if kind == "gpu_error" and (entry.get("sticky") or self._first_strike(entry)):
                self._top = None
                self._raise_error(entry)
            if kind == "gpu_oom" and not entry.get("hog_pid") and self._first_strike(entry):
                self._top = None
                self._raise_oom(entry, module)
        self._t_forward = time.monotonic()

    def post_forward(self, module: Any, args: Any, output: Any) -> None:
        if module is not self._top:
            return
        self._top = None
        slow = [e for e in self.entries if e.get("type") == "gpu_slow"]
        if not slow:
            return
        factor = max(float(e.get("factor", 1.0)) for e in slow)
        delay_s = (factor - 1.0) * 3.0 * (time.monotonic() - self._t_forward)
        if self.cuda:
            _spin(self.device, delay_s)
        time.sleep(delay_s)

    def _raise_error(self, entry: dict[str, Any]) -> None:
        xid = int(entry.get("xid", 79))
        fresh = bool(entry.get("sticky")) and float(entry.get("t", 0)) < _process_start()
        _say(f"gpu_error xid {xid} on device {self.device}"
             f"{' (sticky: the GPU stays failed)' if entry.get('sticky') else ''}", self.rank)
        if self.cuda:
            _poison_context(self.device)  # raises the real AcceleratorError
        raise accelerator_error()(cuda_error_message(xid, new_process=fresh))

    def _raise_oom(self, entry: dict[str, Any], module: Any) -> None:
        import torch

        params = sum(p.numel() * p.element_size() for p in module.parameters())
        total = float(entry.get("total_mib") or FAKE_MEMORY_MIB)
        _say(f"gpu_oom on device {self.device} (leave_mib {entry.get('leave_mib')})", self.rank)
        raise torch.OutOfMemoryError(oom_message(
            device=self.device, request_bytes=max(2 * params, 2**21), total_mib=total,
            free_mib=float(entry.get("leave_mib", 0)), process_bytes=_rss_bytes(),
            hog_pid=entry.get("hog_pid") or entry.get("holder_pid"),
            allocated_bytes=params))


_STATE: GpuState | None = None


def install(env: Mapping[str, str] | None = None) -> GpuState | None:
    """Register the hooks in this process when its node has a GPU state file
    (``FAULTLAB_GPU_STATE``) and it is a rank (``LOCAL_RANK``); idempotent."""
    global _STATE
    env = os.environ if env is None else env
    path, local_rank = env.get("FAULTLAB_GPU_STATE"), env.get("LOCAL_RANK")
    if _STATE is not None or not path or local_rank is None:
        return _STATE
    import torch
    from torch.nn.modules.module import (
        register_module_forward_hook,
        register_module_forward_pre_hook,
    )

    rank = env.get("RANK")
    state = GpuState(Path(path), int(local_rank), int(rank) if rank is not None else None)
    state.cuda = torch.cuda.is_available() and torch.cuda.device_count() > state.device
    register_module_forward_pre_hook(state.pre_forward)
    register_module_forward_hook(state.post_forward)
    _STATE = state
    return state


def _say(what: str, rank: int | None) -> None:
    print(f"faultlab gpu: rank {rank}: {what}", file=sys.stderr, flush=True)


def _process_start() -> float:
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            ticks = int(f.read().rpartition(")")[2].split()[19])
        since = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - since
    except (OSError, ValueError, IndexError):
        return time.time()


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _poison_context(device: int) -> None:
    """An out-of-bounds index write on the device: the CUDA context is poisoned for real and
    every later CUDA call fails (measured: ``device-side assert triggered`` after 0.06 s)."""
    import torch

    with torch.cuda.device(device):
        t = torch.zeros(4, device=f"cuda:{device}")
        t[torch.tensor([1 << 30], device=f"cuda:{device}")] = 1.0
        torch.cuda.synchronize(device)


def _spin(device: int, seconds: float) -> None:
    """Keep the device busy for about ``seconds`` (a spin kernel on the current stream)."""
    import torch

    if seconds <= 0:
        return
    rate = 1.4e9  # clock cycles a second, about an H100's SM clock under load
    torch.cuda._sleep(int(seconds * rate))
