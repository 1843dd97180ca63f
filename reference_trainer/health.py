"""Step watchdog, straggler and slow-link detection, and the determinism switches."""

from __future__ import annotations

import faulthandler
import os
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable

import torch

__all__ = ["EXIT_CODES", "ComputeStragglerDetector", "SlowStepTracker", "StragglerDetector",
           "Watchdog",
           "attribute_slow_links", "enable_determinism", "probe_links"]

#: Exit codes of the trainer, documented in reference_trainer/README.md.
EXIT_CODES = {
    "completed": 0,
    "error": 1,
    "usage": 2,
    "watchdog": 3,
    "nonfinite_abort": 4,
    "preempted": 5,
    "checkpoint_unusable": 6,
    "gpu_unhealthy": 7,
    "gpu_oom": 8,
    "checkpoint_save_failed": 9,
}


class Watchdog:
    """Exit the process when no progress is reported for ``timeout_s``, or when an armed
    deadline (a checkpoint save in flight) passes.

    A rank stuck in a collective (its peer is stopped, or the network dropped) would otherwise
    wait for the process-group timeout — 30 minutes on gloo by default. A save stuck in the
    kernel (a hung NFS or FUSE mount) blocks the same way, and an async save blocks only its
    background thread, so steps (and beats) go on: ``arm`` gives such work a deadline of its
    own. The watchdog dumps the stack of every thread to stderr (so the log shows where it
    hung), reports, and exits with ``EXIT_CODES["watchdog"]`` through ``os._exit``: the stuck
    thread may be blocked inside C++ or a system call and cannot be unwound. The torchrun
    agent then restarts the worker group.
    """

    def __init__(self, timeout_s: float, on_fire: Callable[[float], None]) -> None:
        self.timeout_s = timeout_s
        self._on_fire = on_fire
        self._last = time.monotonic()
        self._armed: tuple[float, dict[str, object]] | None = None
        self.overdue: dict[str, object] | None = None
        """When it fires for an armed deadline: what was armed (``on_fire`` reads it)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="faultlab-watchdog", daemon=True)

    def start(self) -> Watchdog:
        """Watch from now on (idle time counts from here)."""
        self._last = time.monotonic()
        self._thread.start()
        return self

    def beat(self) -> None:
        self._last = time.monotonic()

    def arm(self, timeout_s: float, what: dict[str, object]) -> None:
        """Fire if ``disarm`` is not called within ``timeout_s``; ``what`` (e.g. the save's
        step and path) is left in ``overdue`` for ``on_fire``. One deadline at a time: arming
        replaces it."""
        self._armed = (time.monotonic() + timeout_s, dict(what, started=time.monotonic()))

    def disarm(self) -> None:
        self._armed = None

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        interval = min(1.0, self.timeout_s / 4)
        while not self._stop.wait(interval):
            now = time.monotonic()
            idle = now - self._last
            armed = self._armed
            overdue = armed is not None and now > armed[0]
            if idle > self.timeout_s or overdue:
                if armed is not None and (overdue or armed[1].get("blocks_training")):
                    # a blocking save that hangs stops progress too: name the save
                    self.overdue = dict(armed[1], seconds=round(now - float(
                        armed[1]["started"]), 3))  # type: ignore[arg-type]
                reason = (f"{self.overdue['what']} unfinished after "
                          f"{self.overdue['seconds']} s" if self.overdue else
                          f"no progress for {idle:.1f} s (limit {self.timeout_s} s)")
                print(f"[watchdog] {reason}; stacks of all threads follow", file=sys.stderr,
                      flush=True)
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                try:
                    self._on_fire(idle)
                finally:
                    sys.stderr.flush()
                    os._exit(EXIT_CODES["watchdog"])


def enable_determinism(device: torch.device) -> None:
    """Every switch that makes a run bitwise reproducible at a fixed world size."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # torch.use_deterministic_algorithms(True) does exactly this plus setting
    # torch._inductor.config.deterministic, and importing torch._inductor costs 0.5-1.1 s per
    # process here: a third of a restarted rank's start-up. This trainer never compiles, so
    # the inductor flag has nothing to govern; set it only if inductor is already loaded.
    if "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(True, warn_only=False)
    else:
        torch._C._set_deterministic_algorithms(True, warn_only=False)
    assert torch.are_deterministic_algorithms_enabled()
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        # Flash / memory-efficient attention backward kernels are not deterministic.
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cuda.enable_math_sdp(True)


class StragglerDetector:
    """Names the rank every other rank keeps waiting for.

    Each rank measures how long it waits in the step's stats all-reduce *after issuing it*
    (``collective_wait_s``): a rank that reaches the collective late — slow compute, a slow
    link, an injected delay before it issues — waits about nothing, its peers wait for it. The
    waits of the previous step ride the next stats all-reduce, so every rank sees all of them
    for the cost of ``world_size`` extra float64s.

    A rank is named when every other rank waited at least ``threshold_s`` longer than it did,
    ``num_steps`` steps in a row; it is named once per episode, and may be named again after
    ``num_steps`` steps without a straggler.
    """

    def __init__(self, world_size: int, *, threshold_s: float, num_steps: int) -> None:
        self.world_size, self.threshold_s, self.num_steps = world_size, threshold_s, num_steps
        self._candidate: int | None = None
        self._count = 0
        self._clean = 0
        self._named: int | None = None

    @property
    def named(self) -> int | None:
        """The rank named in the current episode (None outside one)."""
        return self._named

    def update(self, waits: list[float]) -> dict[str, float | int | list[float]] | None:
        """Feed one step's per-rank waits; returns the anomaly's fields when a rank is named."""
        if self.world_size < 2 or len(waits) != self.world_size:
            return None
        rank = min(range(self.world_size), key=waits.__getitem__)
        gap = min(w for r, w in enumerate(waits) if r != rank) - waits[rank]
        if not (gap > 0 and gap >= self.threshold_s):  # equal waits (or NaN): nobody
            self._candidate, self._count = None, 0
            self._clean += 1
            if self._clean >= self.num_steps:
                self._named = None
            return None
        self._clean = 0
        self._count = self._count + 1 if rank == self._candidate else 1
        self._candidate = rank
        if self._count >= self.num_steps and self._named != rank:
            self._named = rank
            return {"straggler_rank": rank, "wait_gap_s": round(gap, 4),
                    "waits_s": [round(w, 4) for w in waits]}
        return None


class ComputeStragglerDetector:
    """Names the rank whose own compute is slow (a throttled or failing GPU).

    Waits in collectives cannot name it: with FSDP2 the peers of a slow rank wait for it inside
    the backward's reduce-scatters, and every rank then reaches the step's stats all-reduce
    together. Each rank's forward pass, timed around ``model(x, y)`` less the time it waited
    for a CPU (``faultlab.runtime.gpu.runnable_wait_s``), can: the slow rank's is the long one
    (its peers' all-gathers do not wait for it, they wait later). The forward times ride
    the stats all-reduce like the waits. A rank is named when its forward took at
    least ``ratio`` times every other rank's and ``threshold_s`` longer, ``num_steps`` steps in
    a row (episodes as in :class:`StragglerDetector`). The record names the rank and its score,
    the fastest rank's forward time over its own (every rank's in ``scores``).
    """

    def __init__(self, world_size: int, *, ratio: float, threshold_s: float,
                 num_steps: int, window: int = 5) -> None:
        self.world_size, self.ratio = world_size, ratio
        self._episodes = StragglerDetector(world_size, threshold_s=threshold_s,
                                           num_steps=num_steps)
        self._recent: list[deque[float]] = [deque(maxlen=window) for _ in range(world_size)]

    def update(self, forward_s: list[float],
               cpu_wait_s: list[float] | None = None) -> dict[str, object] | None:
        """Feed one step's per-rank forward times (and how long each rank waited for a CPU since
        the previous step's stats all-reduce, kept in the record); the anomaly's fields when a
        rank is named.

        Each rank's forward is the median of its last ``window`` steps, as NVRx's straggler
        scoring summarizes a section: a tiny model's forward is tens of milliseconds, and on a
        shared CPU one step of a fault-free rank took 1.5 times its peer's now and then. A
        rank's forward also holds its waits for its peers in the all-gathers, which its own CPU
        wait does not explain; taking the peers' whole CPU wait since the last all-reduce off it
        was tried and removed: it took off waits that overlapped the slow rank's own slowness,
        and a 3x gpu_slow went unnamed beside two busy loops."""
        if self.ratio <= 0 or self.world_size < 2 or len(forward_s) != self.world_size:
            return None
        for recent, f in zip(self._recent, forward_s, strict=True):
            recent.append(f)
        if len(self._recent[0]) < (self._recent[0].maxlen or 1):
            return None  # the first steps (warm-up) fill the window; nothing is judged on them
        median = [statistics.median(recent) for recent in self._recent]
        slowest = max(range(self.world_size), key=median.__getitem__)
        others = max(f for r, f in enumerate(median) if r != slowest)
        peers_wait = max((w for r, w in enumerate(cpu_wait_s or []) if r != slowest),
                         default=0.0)
        slow = median[slowest] >= self.ratio * others
        # As waits: the slow rank "waits" least; the gap is how much longer its forward took.
        named = self._episodes.update([-f for f in median] if slow else
                                      [0.0] * self.world_size)
        if named is None:
            return None
        # Each rank's score, as NVRx's straggler detection scores a rank: the fastest rank's
        # time over its own (1.0 the fastest, 0.5 a rank at half speed).
        fastest = min(median)
        scores = [round(fastest / max(f, 1e-9), 3) for f in median]
        return {"straggler_rank": slowest, "cause": "slow_compute", "score": scores[slowest],
                "scores": scores, "peers_cpu_wait_s": round(peers_wait, 4),
                "forward_ratio": round(median[slowest] / max(others, 1e-9), 3),
                "forward_s": [round(f, 4) for f in forward_s],
                "median_forward_s": [round(f, 4) for f in median]}


class SlowStepTracker:
    """Flags a run of steps far slower than this rank's recent normal steps.

    A step's time is from its start to issuing the stats all-reduce (forward, backward and
    every FSDP collective in them). The baseline is the median of the last ``window`` steps
    that were not slow; a step is slow when it takes more than ``factor`` times that. After
    ``num_steps`` slow steps in a row the tracker flags once per episode; ``num_steps``
    normal steps end the episode. The first step after a (re)start is warm-up and not counted.
    """

    def __init__(self, *, factor: float, num_steps: int, window: int = 8) -> None:
        self.factor, self.num_steps, self.window = factor, num_steps, window
        self._normal: list[float] = []
        self._slow_run = 0
        self._normal_run = 0
        self._flagged = False
        self._seen = 0

    @property
    def baseline_s(self) -> float | None:
        if len(self._normal) < 3:
            return None
        ordered = sorted(self._normal)
        return ordered[len(ordered) // 2]

    def update(self, seconds: float) -> bool:
        """Feed one step's time; True exactly when a new episode of slow steps is flagged."""
        self._seen += 1
        if self._seen == 1 or self.factor <= 0:
            return False
        base = self.baseline_s
        if base is not None and seconds > self.factor * base:
            self._slow_run += 1
            self._normal_run = 0
            if self._slow_run >= self.num_steps and not self._flagged:
                self._flagged = True
                return True
            return False
        self._slow_run = 0
        self._normal_run += 1
        if self._normal_run >= self.num_steps:
            self._flagged = False
        self._normal = (self._normal + [seconds])[-self.window:]
        return False


def attribute_slow_links(transfers: list[tuple[int, int, float]], *, factor: float,
                         floor_s: float = 0.0) -> dict[str, object] | None:
    """Which rank's link is slow, from timed point-to-point transfers ``(src, dst, seconds)``.

    A transfer is slow when it took more than ``factor`` times the fastest one and ``floor_s``
    longer: a megabyte over loopback takes 0.3 ms, so a few milliseconds of a loaded host's
    scheduling between a barrier and a transfer would be "10x" (seen: 6 ms against 0.3, the
    least of three, with a 5x compute straggler as the receiver), while a link slow enough to
    slow a step is slower by as much as a straggler must be (the trainer passes
    ``--straggler-threshold-s``, 50 ms; a 25 Mbit/s uplink takes 335 ms). The culprit is
    the rank that *sent* every slow transfer and none of its sends was fast (a slow uplink),
    else the rank that *received* all of them likewise (a slow downlink), else the one rank
    every slow transfer touches (a slow link both ways). No single such rank: None — e.g. two
    ranks whose one link is slow both ways have no culprit to name.
    """
    if not transfers:
        return None
    fastest = min(t for _s, _d, t in transfers)
    slow = [(s, d) for s, d, t in transfers
            if t > factor * max(fastest, 1e-4) and t - fastest > floor_s]
    if not slow:
        return None
    detail: dict[str, object] = {"slow_transfers": [list(p) for p in slow],
                                 "transfer_s": [[s, d, round(t, 4)] for s, d, t in transfers]}
    senders = {s for s, _d in slow}
    if len(senders) == 1:
        (rank,) = senders
        if all((s, d) in slow for s, d, _t in transfers if s == rank):
            receivers = {d for _s, d in slow}
            if len(receivers) == 1 and all((s, d) in slow for s, d, _t in transfers
                                           if d in receivers):
                # two ranks: a slow rank -> peer is as much the peer's downlink
                detail["also_consistent_with"] = f"the downlink of rank {next(iter(receivers))}"
            return {"straggler_rank": rank, "link": "uplink", **detail}
    receivers = {d for _s, d in slow}
    if len(receivers) == 1:
        (rank,) = receivers
        if all((s, d) in slow for s, d, _t in transfers if d == rank):
            return {"straggler_rank": rank, "link": "downlink", **detail}
    common = set.intersection(*({s, d} for s, d in slow))
    if len(common) == 1:
        return {"straggler_rank": next(iter(common)), "link": "both", **detail}
    return None


def probe_links(rank: int, world_size: int, device: torch.device, nbytes: int, *,
                repeats: int = 3) -> list[tuple[int, int, float]]:
    """Time ``nbytes`` from every rank to its ring successor and (3+ ranks) its predecessor,
    one transfer at a time: concurrent transfers would share queues (a throttled uplink also
    delays the ACKs of what its node receives). Every rank returns every transfer
    ``(src, dst, seconds)``, timed by the receiver from the barrier before it: the least of
    ``repeats`` transfers, because a slow link is slow every time, while a process the
    scheduler ran late after the barrier (milliseconds on a loaded host, against a
    megabyte's 0.3 ms over loopback) is late once (seen: a sender's late start named its
    uplink slow at 3 ms against 0.3, beside a rank that was the real straggler). Costs
    ``repeats`` times ``world_size`` (or twice that) barriers and transfers: a probe for when
    steps are slow."""
    import torch.distributed as dist

    shifts = (1, -1) if world_size > 2 else (1,)
    send = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
    recv = torch.empty_like(send)
    took = torch.zeros(len(shifts) * world_size, dtype=torch.float64)
    for k, shift in enumerate(shifts):
        for src in range(world_size):
            dst = (src + shift) % world_size
            best = float("inf")
            for _ in range(repeats):
                dist.barrier()
                t0 = time.monotonic()
                if rank == src:
                    dist.send(send, dst)
                elif rank == dst:
                    dist.recv(recv, src)
                    best = min(best, time.monotonic() - t0)
            if rank == dst:
                took[k * world_size + src] = best
    took = took.to(device)
    dist.all_reduce(took)
    seconds = took.cpu().tolist()
    return [(src, (src + shift) % world_size, seconds[k * world_size + src])
            for k, shift in enumerate(shifts) for src in range(world_size)]
