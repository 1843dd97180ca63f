"""GPU faults inside a rank: the rank-side actions (``faultlab.runtime.hooks``, hooks
``before_forward`` / ``after_forward`` / ``after_backward``) of ``faultlab.faults.gpu``.

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
    ``after_forward`` sleeps ``factor - 1`` times the forward's compute time, and
    ``after_backward`` ``factor - 1`` times the backward's, each measured on this rank as it
    ran (wall time less the time the thread waited for a CPU): forward and backward take
    ``factor`` times as long as they would have (measured with the tiny GPT on a loaded 2-core
    host: factor 1.1 gave 1.12x its compute, 3 gave 2.9-3.1x). On CUDA a spin kernel keeps
    the device really busy for the same time. With ``episodes`` only while the schedule is on
    (``faultlab.runtime.throttle``; a seconds episode's hold ends with the episode). Each slow
    episode the rank meets is ground truth in its events (``-gpu`` file, or the node's relay):
    ``fault_struck`` at its start (``t`` the scheduled start for seconds episodes, ``step``,
    ``factor``, ``speed``, ``episode``, ``until_t`` or ``until_step``, when the episode is due
    to end: the first step at full speed) and ``fault_eased`` at its end (``why``: ``episode
    over`` or ``undone``).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import torch

from faultlab.runtime.gpu import FAKE_MEMORY_MIB, accelerator_error, cuda_error_message, oom_message
from faultlab.runtime.hooks import RankAction
from faultlab.runtime.throttle import Phase, phase, publish, schedule_unit

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
    """``gpu_slow``: slow while its schedule's phase is on (``faultlab.runtime.throttle``)."""

    def __init__(self, entry: Any, rank: Any) -> None:
        super().__init__(entry, rank)
        self.factor = float(self.params.get("factor", 1.0))
        self.episodes = self.params.get("episodes")
        self.unit = schedule_unit(self.episodes)
        self._t0 = float(self.params.get("t") or time.time())
        self._step0: int | None = None
        self._on: Phase | None = None  # the episode under way on this rank, if slow now
        self.node: Any = rank  # faultlab.runtime.gpu's view of the rank: record, state_path

    def after_forward(self, module: Any, forward_s: float) -> None:
        now, step = time.time(), int(self.rank.step)
        ph = self._phase(now, step)
        self._follow(ph, now, step)
        self._hold(ph, forward_s, now)

    def after_backward(self, module: Any, backward_s: float) -> None:
        now = time.time()
        ph = self._phase(now, int(self.rank.step))
        if self._on is not None and ph.on and ph.episode == self._on.episode:
            self._hold(ph, backward_s, now)

    def _hold(self, ph: Phase, compute_s: float, now: float) -> None:
        """Stretch ``compute_s`` of compute ``factor`` times while the phase is on."""
        if not ph.on:
            return
        delay_s = (self.factor - 1.0) * compute_s
        if self.unit == "s" and ph.end is not None:
            delay_s = min(delay_s, self._t0 + ph.end - now)  # full speed after the episode
        if delay_s <= 0:
            return
        self.rank.struck(factor=self.factor)
        if self.cuda:
            _spin(int(self.rank.device or 0), delay_s)
        time.sleep(delay_s)

    def release(self) -> dict[str, Any]:
        if self._on is not None and not self.released.is_set():
            self._ease(time.time(), int(self.rank.step), "undone")
        return super().release()

    def _phase(self, now: float, step: int) -> Phase:
        if self.unit == "steps":
            if self._step0 is None:
                self._step0 = step
            return phase(self.episodes, step - self._step0)
        return phase(self.episodes, now - self._t0)

    def _follow(self, ph: Phase, now: float, step: int) -> None:
        """Record an episode's start and end as this rank meets them."""
        if self._on is not None and (not ph.on or ph.episode != self._on.episode):
            self._ease(now, step, "episode over")
        if ph.on and self._on is None:
            self._on = ph
            t = self._t0 + ph.start if self.unit == "s" else now
            self.say(f"gpu_slow episode {ph.episode}: {self.factor:g}x slower from step {step}")
            self.node.record("fault_struck", t=t, step=step, factor=self.factor,
                             speed=round(1.0 / self.factor, 6), episode=ph.episode,
                             **self._until(ph))
            self._publish(True, ph.episode, step)

    def _ease(self, now: float, step: int, why: str) -> None:
        on, self._on = self._on, None
        if on is None:
            return
        t = self._t0 + on.end if self.unit == "s" and on.end is not None and why != "undone" \
            else now
        self.node.record("fault_eased", t=min(t, now), step=step, factor=self.factor,
                         episode=on.episode, why=why)
        self._publish(False, on.episode, step)

    def _until(self, ph: Phase) -> dict[str, Any]:
        if ph.end is None:
            return {}
        if self.unit == "s":
            return {"until_t": self._t0 + ph.end}
        return {"until_step": int((self._step0 or 0) + ph.end)}

    def _publish(self, on: bool, episode: int, step: int) -> None:
        if self.unit == "steps" and self.rank.device is not None:
            publish(self.node.state_path, self.entry.id, int(self.rank.device), on=on,
                    episode=episode, step=step, t=time.time())


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
