"""GPU faults inside a rank: the rank-side actions (``faultlab.runtime.hooks``, hooks
``before_forward`` / ``after_forward``) of ``faultlab.faults.gpu``.

A node's GPU state file names them (``faultlab.runtime.gpu`` says why a file and not a plan):
every process of that node loads the actions of the entries that strike its device, and calls
them around its outermost module forward.

``gpu_error`` (:class:`GpuError`)
    ``before_forward`` raises what torch raises for that Xid: ``torch.AcceleratorError``
    (torch >= 2.8; RuntimeError before) with torch's full ``CUDA error: ...`` text. ``sticky:
    false`` strikes one process once (``rank.claim``: a restarted process does not meet it
    again); ``sticky: true`` strikes every forward of every process on the node until undone.
    On a real CUDA device the context is poisoned for real first.
``gpu_oom`` (:class:`GpuOom`)
    ``before_forward`` raises ``torch.OutOfMemoryError`` once, with the message torch's CUDA
    caching allocator writes. With a memory hog on a real device (``hog_pid``) it does nothing:
    the allocation fails by itself.
``gpu_slow`` (:class:`GpuSlow`)
    ``after_forward`` sleeps ``(factor - 1) × 3 ×`` the forward's time: the step's compute
    (forward + backward, backward taken as twice the forward) takes ``factor`` times as long.
    The forward's time is its wall time less the time the rank waited for a CPU
    (``faultlab.runtime.gpu.cpu_wait_s``), so a busy host does not make the factor larger.
    On CUDA a spin kernel keeps the device really busy for the same time.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import torch

from faultlab.runtime.gpu import FAKE_MEMORY_MIB, accelerator_error, cuda_error_message, oom_message
from faultlab.runtime.hooks import RankAction

__all__ = ["GpuError", "GpuOom", "GpuSlow"]


class _GpuAction(RankAction):
    strikes = "window"

    @property
    def cuda(self) -> bool:
        device = self.rank.device
        return (device is not None and torch.cuda.is_available()
                and torch.cuda.device_count() > device)

    def say(self, what: str) -> None:
        print(f"faultlab gpu: rank {self.rank.rank}: {what}", file=sys.stderr, flush=True)


class GpuError(_GpuAction):
    """``gpu_error``."""

    def before_forward(self, module: Any) -> None:
        p, device = self.params, self.rank.device
        if not (p.get("sticky") or self.rank.claim(f"dev{device}")):
            return
        xid = int(p.get("xid", 79))
        fresh = bool(p.get("sticky")) and float(p.get("t", 0)) < _process_start()
        self.say(f"gpu_error xid {xid} on device {device}"
                 f"{' (sticky: the GPU stays failed)' if p.get('sticky') else ''}")
        self.rank.struck(xid=xid)
        if self.cuda:
            _poison_context(int(device or 0))  # raises the real AcceleratorError
        raise accelerator_error()(cuda_error_message(xid, new_process=fresh))


class GpuOom(_GpuAction):
    """``gpu_oom``."""

    def before_forward(self, module: Any) -> None:
        p, device = self.params, self.rank.device
        if p.get("hog_pid") or not self.rank.claim(f"dev{device}"):
            return
        params = sum(t.numel() * t.element_size() for t in module.parameters())
        total = float(p.get("total_mib") or FAKE_MEMORY_MIB)
        self.say(f"gpu_oom on device {device} (leave_mib {p.get('leave_mib')})")
        self.rank.struck(leave_mib=p.get("leave_mib"))
        raise torch.OutOfMemoryError(oom_message(
            device=int(device or 0), request_bytes=max(2 * params, 2**21), total_mib=total,
            free_mib=float(p.get("leave_mib", 0)), process_bytes=_rss_bytes(),
            hog_pid=p.get("hog_pid") or p.get("holder_pid"), allocated_bytes=params))


class GpuSlow(_GpuAction):
    """``gpu_slow``."""

    def after_forward(self, module: Any, forward_s: float) -> None:
        delay_s = (float(self.params.get("factor", 1.0)) - 1.0) * 3.0 * forward_s
        if delay_s <= 0:
            return
        self.rank.struck(factor=self.params.get("factor"))
        if self.cuda:
            _spin(int(self.rank.device or 0), delay_s)
        time.sleep(delay_s)


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
    with torch.cuda.device(device):
        t = torch.zeros(4, device=f"cuda:{device}")
        t[torch.tensor([1 << 30], device=f"cuda:{device}")] = 1.0
        torch.cuda.synchronize(device)


def _spin(device: int, seconds: float) -> None:
    """Keep the device busy for about ``seconds`` (a spin kernel on the current stream)."""
    rate = 1.4e9  # clock cycles a second, about an H100's SM clock under load
    torch.cuda._sleep(int(seconds * rate))
