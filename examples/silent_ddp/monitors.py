"""The silent-failure monitors of train.py, as a team writes its own: nothing of faultlab.

Each one prints one line when it fires and nothing otherwise:

- ``Fingerprint``: every replica hashes its parameters (a float64 sum and a CRC-32 of their
  bytes); a replica that disagrees with the majority is named
  (``SDC: fingerprint of rank R disagrees at step S``).
- ``SpikeRule``: the loss above ``factor`` times the mean of the first ``warmup`` steps' loss
  (``loss spike at step S``); it names nobody.
- ``StragglerScore``: NVRx's score, the fastest rank's compute time over this rank's, each
  rank's time the median of its last ``window`` steps' own forward and backward up to its
  gradients being ready for the all-reduce (the collective itself not counted, nor the time
  it waited for a CPU); below ``threshold`` for ``steps`` steps in a row
  (``straggler: rank R score X at step S``).
- ``replay_mismatch``: the same batch's local gradient computed twice on the same rank,
  without DDP's all-reduce, compared bitwise (``replay mismatch on rank R at step S``).
"""

import statistics
import time
import zlib
from collections import Counter, deque
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks


def fingerprint(module: nn.Module) -> tuple[float, int]:
    """This replica's parameters as a float64 sum and a CRC-32 of their bytes."""
    total, crc = 0.0, 0
    with torch.no_grad():
        for p in module.parameters():
            total += float(p.detach().double().sum())
            crc = zlib.crc32(p.detach().contiguous().numpy().tobytes(), crc)
    return total, crc


def outliers(prints: Sequence[tuple[float, int]]) -> list[int] | None:
    """The ranks whose fingerprint is not the majority's ([] if all agree), None when no
    fingerprint is held by more than half of the ranks (nobody can be named)."""
    common, count = Counter(prints).most_common(1)[0]
    if 2 * count <= len(prints):
        return None
    return [r for r, fp in enumerate(prints) if fp != common]


class Fingerprint:
    """Compare the replicas every ``every`` steps (one all_gather)."""

    def __init__(self, every: int, module: nn.Module) -> None:
        self.every, self.module = every, module

    def check(self, step: int) -> list[str]:
        if not self.every or step % self.every:
            return []
        total, crc = fingerprint(self.module)
        mine = torch.tensor([total, float(crc)], dtype=torch.float64)
        everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(everyone, mine)
        prints = [(float(t[0]), int(t[1])) for t in everyone]
        bad = outliers(prints)
        if bad is None:
            return [f"SDC: fingerprints of all {len(prints)} ranks disagree at step {step}"]
        return [f"SDC: fingerprint of rank {r} disagrees at step {step}" for r in bad]


class SpikeRule:
    """Megatron's kind of check: a loss ``factor`` times the early loss."""

    def __init__(self, factor: float, warmup: int) -> None:
        self.factor, self.warmup = factor, warmup
        self.early: list[float] = []

    def check(self, step: int, loss: float) -> list[str]:
        if len(self.early) < self.warmup:
            self.early.append(loss)
            return []
        baseline = sum(self.early) / len(self.early)
        # a NaN loss is a spike too: written so that NaN takes the alarm branch
        if not loss <= self.factor * baseline:
            return [f"loss spike at step {step}"]
        return []


class StragglerScore:
    """NVRx's relative score: each rank's time is the median of its last ``window`` steps'
    compute times (NVRx: of its report interval), its score the fastest rank's time over its
    own; a rank is named when its score stays below ``threshold`` for ``steps`` steps in a
    row (once per such streak)."""

    def __init__(self, threshold: float, window: int, steps: int, world_size: int) -> None:
        self.threshold, self.steps = threshold, steps
        self.recent: list[deque[float]] = [deque(maxlen=window) for _ in range(world_size)]
        self.low = [0] * world_size

    def check(self, step: int, compute_s: Sequence[float]) -> list[str]:
        for recent, t in zip(self.recent, compute_s, strict=True):
            recent.append(t)
        if len(self.recent[0]) < (self.recent[0].maxlen or 1):
            return []  # a full window first: the first steps of a process warm up unevenly
        times = [statistics.median(recent) for recent in self.recent]
        fastest = min(times)
        out = []
        for r, t in enumerate(times):
            # a time the clocks could not measure (0) is no evidence of slowness
            score = fastest / t if fastest > 0 else 1.0
            self.low[r] = self.low[r] + 1 if score < self.threshold else 0
            if self.low[r] == self.steps:
                out.append(f"straggler: rank {r} score {score:.3f} at step {step}")
        return out


def cpu_wait_s() -> float:
    """Seconds this thread has been runnable but not running (waiting for a CPU), from the
    kernel's ``/proc/thread-self/schedstat``; 0.0 where it keeps none."""
    try:
        with open("/proc/thread-self/schedstat", encoding="ascii") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


class ComputeTimer:
    """DDP's default all-reduce as a comm hook that notes when the last bucket of gradients
    was ready: ``start()`` before the forward, ``compute_s()`` after the backward is this
    rank's own compute, without the time spent waiting in the collective for the others.

    Less the time the thread waited for a CPU: NVRx times kernels on the device, which a busy
    host does not lengthen; timed by the wall clock on a shared CPU, the rank the scheduler
    passed over would look slow. (On CPU, autograd runs the backward, and so this hook, on the
    thread that called ``backward``.)"""

    def __init__(self, noise: Callable[[torch.Tensor], Callable[[torch.Tensor], None]]
                 | None = None) -> None:
        self.t0 = self.ready = self.wait0 = self.wait = 0.0
        self.noise = noise
        """Given a bucket before its all-reduce, what to do to the reduced bucket."""

    # Runtime annotations (no ``from __future__ import annotations`` here): DDP checks them.
    def hook(self, state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        self.ready, self.wait = time.perf_counter(), cpu_wait_s()
        fut = default_hooks.allreduce_hook(None, bucket)  # type: ignore[arg-type]
        if self.noise is None:
            return fut
        # chosen here, in the order the buckets become ready (the same on every rank), not in
        # the order their all-reduces complete
        add = self.noise(bucket.buffer())

        def then(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            tensor = f.value()
            add(tensor)
            return tensor
        return fut.then(then)

    def start(self) -> None:
        self.t0 = self.ready = time.perf_counter()
        self.wait0 = self.wait = cpu_wait_s()

    def compute_s(self) -> float:
        wall = self.ready - self.t0
        waited = self.wait - self.wait0
        # the kernel's count can run ahead of the wall clock (seen: 68 ms of wait in a 6 ms
        # step, in about one step in twenty on a busy host): then the wall time, uncorrected
        return wall - waited if 0.0 <= waited <= wall else wall


def replay_mismatch(module: nn.Module,
                    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                    x: torch.Tensor, y: torch.Tensor) -> bool:
    """Compute the local gradient of ``loss_fn(module(x), y)`` twice through the unwrapped
    module (no DDP, no all-reduce) and say whether the two differ in any bit."""
    params = [p for p in module.parameters() if p.requires_grad]
    first, second = (torch.autograd.grad(loss_fn(module(x), y), params) for _ in range(2))
    return any(not torch.equal(a, b) for a, b in zip(first, second, strict=True))
