"""Is the trainer reproducible, and did a recovered run stay within the trainer's own noise?

On GPUs most trainers are not bitwise reproducible even without a fault, so
``bitwise_equal_to_golden`` would fail for a reason that has nothing to do with recovery. Two
fault-free runs on the experiment's own target (``golden: {runs: 2}``) tell the two apart:

- **reproducible**: the two runs end with the same final digest (or checkpoint tensors). The
  bitwise verdict is measured as before.
- **not reproducible**: they differ. ``bitwise_equal_to_golden`` is then *not measured*, never
  failed; its note says from which step the runs' losses differ, by how much, and the usual
  causes with their fixes (``CAUSES``).

``matches_golden_within_noise: k`` judges such a trainer. The two fault-free runs A and B give
the run-to-run spread: at each step ``s`` the *noise envelope* is the largest loss difference
``|A - B|`` seen at any step up to ``s`` (run-to-run differences grow as training goes on, and
a running maximum is not fooled by a step where the two happened to agree), never below the
loss's own resolution (4 float32 ulps: where the noise is still under the last digit, two runs
that agree say nothing of a third one digit away), and, where both
final checkpoints can be read, the relative L2 distance of their weights. The run under test R
is then measured in units of that noise: ``|R(s) - A(s)| / envelope(s)`` at every step both
recorded (a replayed step counts as its last run, the one the final weights come from), and
its final weights' distance to A over A's to B. The measured value is the largest of these;
the run passes when it is at most ``k``. A run that leaves the envelope is named by the first
step where it did.

A loss read from a log line carries only the digits the trainer prints: a trainer that prints
fewer than its noise needs looks reproducible by its losses, which the note says.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from faultlab.observe.final_state import weights_distance
from faultlab.spec.expect import NOISE_K_DEFAULT as DEFAULT_K

__all__ = ["CAUSES", "DEFAULT_K", "RESOLUTION_ULPS", "Reproducibility", "WithinNoise",
           "compare_runs", "reproducibility", "resolution", "run_losses", "weights_distance",
           "within_noise"]

CAUSES = ("the usual causes and their fixes: nondeterministic kernels "
          "(torch.use_deterministic_algorithms(True)), cuBLAS workspaces "
          "(CUBLAS_WORKSPACE_CONFIG=:4096:8), NCCL's algorithm and protocol choice (a fixed "
          "NCCL_ALGO and NCCL_PROTO), unseeded data-loader workers (a worker_init_fn and a "
          "generator seeded from the run's seed), a different world size")


@dataclass(frozen=True, slots=True)
class Reproducibility:
    """What two fault-free runs of the same job say about the trainer."""

    reproducible: bool
    first_step: int | None = None
    """The first step whose loss differs between the two runs (None: losses equal)."""
    max_loss_diff: float = 0.0
    weights_rel_l2: float | None = None
    """Relative L2 distance of the two final states' floating-point tensors."""

    def note(self) -> str:
        if self.reproducible:
            return "two fault-free runs ended bitwise equal: the trainer is reproducible"
        where = (f"from step {self.first_step} (largest loss difference "
                 f"{self.max_loss_diff:.3g})" if self.first_step is not None else
                 "in their final state only (their losses agree to the digits recorded)")
        weights = "" if self.weights_rel_l2 is None else \
            f", final weights {self.weights_rel_l2:.3g} apart (relative L2)"
        return (f"not measured: two fault-free runs differ {where}{weights}: the trainer is "
                f"not bitwise reproducible on this target; {CAUSES}; or judge it with "
                f"matches_golden_within_noise")


def _differ(a: Mapping[int, float], b: Mapping[int, float]) -> tuple[int | None, float]:
    steps = sorted(set(a) & set(b))
    first = next((s for s in steps if a[s] != b[s]), None)
    return first, max((abs(a[s] - b[s]) for s in steps), default=0.0)


def reproducibility(golden: Any) -> Reproducibility | None:
    """From a golden run with a second run (``GoldenRun.second``); None without one."""
    second = getattr(golden, "second", None)
    if not second:
        return None
    same = (golden.digest is not None and golden.digest == second.get("digest")) or (
        not golden.digest and bool(golden.tensors) and golden.tensors == second.get("tensors"))
    return compare_runs(same, golden.losses, second.get("losses") or {},
                        golden.final_checkpoint, second.get("final_checkpoint"))


def compare_runs(same: bool, losses_a: Mapping[int, float], losses_b: Mapping[int, float],
                 checkpoint_a: str | None, checkpoint_b: str | None) -> Reproducibility:
    """Two fault-free runs: ``same`` final state, or where and how far they differ."""
    if same:
        return Reproducibility(True)
    first, biggest = _differ(losses_a, losses_b)
    return Reproducibility(False, first, biggest, weights_distance(checkpoint_a, checkpoint_b))


@dataclass(frozen=True, slots=True)
class WithinNoise:
    """``matches_golden_within_noise``: the run's distance to the golden run in noise units."""

    measured: float | None
    """The largest deviation in units of the noise (None: not measured)."""
    passed: bool
    note: str


def within_noise(golden: Any, losses: Mapping[int, float], final_checkpoint: str | None,
                 k: float) -> WithinNoise:
    """Judge a run's per-step losses and final weights against the golden runs' noise."""
    second = getattr(golden, "second", None)
    if golden is None or not second:
        return WithinNoise(None, False, "not measured: no second fault-free run to measure the "
                                        "trainer's noise (golden: {runs: 2})")
    a, b = golden.losses, second.get("losses") or {}
    steps = sorted(set(a) & set(b) & set(losses))
    if not steps:
        return WithinNoise(None, False, "not measured: the run and the golden runs share no "
                                        "step with a loss")
    envelope = 0.0  # the fault-free runs' own spread so far (running maximum)
    worst, worst_step, left = 0.0, None, None
    for s in steps:
        envelope = max(envelope, abs(a[s] - b[s]))
        # Never below the loss's own resolution: two runs that agree at a step, the noise
        # still under the last digit, say nothing of a run one digit away (seen in CI: both
        # fault-free runs equal at step 2, the run under test one float32 ulp off).
        noise = max(envelope, resolution(a[s]))
        dev = abs(losses[s] - a[s])
        units = 0.0 if dev == 0 else dev / noise
        if units > worst:
            worst, worst_step = units, s
        if left is None and units > k:
            left = (s, dev, noise)
    parts = []
    w_units = None
    spread_w = weights_distance(second.get("final_checkpoint"), golden.final_checkpoint)
    dev_w = weights_distance(final_checkpoint, golden.final_checkpoint)
    if spread_w is not None and dev_w is not None:
        w_units = 0.0 if dev_w == 0 else (math.inf if spread_w == 0 else dev_w / spread_w)
        parts.append(f"final weights {_units(w_units)} the noise ({dev_w:.3g} against "
                     f"{spread_w:.3g} relative L2)")
    measured = max(worst, w_units or 0.0)
    passed = measured <= k
    if left is not None:
        s, dev, env = left
        head = (f"left the noise envelope at step {s}: loss {dev:.3g} from the golden run's, "
                f"{_units(dev / env if env else math.inf)} the two fault-free runs' spread "
                f"({env:.3g}) by then")
    else:
        head = (f"within {_units(worst)} the noise at every step"
                + (f" (closest to the edge at step {worst_step})" if worst_step else ""))
    if envelope == 0:
        parts.append("the two fault-free runs' losses agree to the digits recorded: the noise "
                     "is in digits the loss does not show")
    note = "; ".join([head, *parts]) + f" (k = {k:g})"
    return WithinNoise(round(measured, 3) if math.isfinite(measured) else measured, passed,
                       note)


RESOLUTION_ULPS = 4
"""The least noise ever assumed at a step: 4 float32 ulps of the golden run's loss there (the
precision most trainers compute and record their loss in)."""


def resolution(loss: float) -> float:
    """``RESOLUTION_ULPS`` float32 units in the last place of ``loss``."""
    if loss == 0 or not math.isfinite(loss):
        return math.ulp(0.0)
    return RESOLUTION_ULPS * 2.0 ** (math.frexp(abs(loss))[1] - 24)


def _units(x: float) -> str:
    return "infinitely many times" if math.isinf(x) else f"{x:.2f} times"


def run_losses(events: Any) -> dict[int, float]:
    """Rank 0's loss at every step, a replayed step as its last run (the one the final weights
    come from)."""
    out: dict[int, tuple[float, float]] = {}
    for e in events:
        if e.get("kind") == "step" and e.get("rank") == 0 and isinstance(
                e.get("loss"), int | float) and isinstance(e.get("step"), int):
            if e["step"] not in out or e["t"] >= out[e["step"]][0]:
                out[e["step"]] = (e["t"], float(e["loss"]))
    return {s: loss for s, (_t, loss) in out.items()}
