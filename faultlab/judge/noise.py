"""Is the trainer reproducible, and did a recovered run stay within the trainer's own noise?

On GPUs most trainers are not bitwise reproducible even without a fault, so
``bitwise_equal_to_golden`` would fail for a reason that has nothing to do with recovery. Two
fault-free runs on the experiment's own target (``golden: {runs: 2}``) tell the two apart:

- **reproducible**: the two runs end with the same final digest (or checkpoint tensors). The
  bitwise verdict is measured as before.
- **not reproducible**: they differ. ``bitwise_equal_to_golden`` is then *not measured*: the
  verdict is ``inconclusive`` (never passed, never failed), unless a measured
  ``matches_golden_within_noise`` in the same experiment judges in its place. Its note says from
  which step the runs' losses differ, by how much, the usual causes with their fixes
  (``CAUSES``), and what to add (``ADD_NOISE_SLA``).

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

Missing evidence never passes. A NaN or Inf in R's losses fails at its first step; R's final
weights fail when they lack a tensor of A's, hold one in another shape, or hold a NaN or Inf
(named), and when they cannot be read where A's and B's could. A NaN in A or B, no second run,
no step R shares with them, or A's and B's weights that cannot be compared make the verdict
inconclusive (not measured), with the reason.

A loss read from a log line carries only the digits the trainer prints: a trainer that prints
fewer than its noise needs looks reproducible by its losses, which the note says.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from faultlab.observe.final_state import weights_distance, weights_gap
from faultlab.spec.expect import NOISE_K_DEFAULT as DEFAULT_K

__all__ = ["ADD_NOISE_SLA", "CAUSES", "DEFAULT_K", "RESOLUTION_ULPS", "Reproducibility",
           "WithinNoise", "compare_runs", "reproducibility", "resolution", "run_losses",
           "weights_distance", "within_noise"]

CAUSES = ("the usual causes and their fixes: nondeterministic kernels "
          "(torch.use_deterministic_algorithms(True)), cuBLAS workspaces "
          "(CUBLAS_WORKSPACE_CONFIG=:4096:8), NCCL's algorithm and protocol choice (a fixed "
          "NCCL_ALGO and NCCL_PROTO), unseeded data-loader workers (a worker_init_fn and a "
          "generator seeded from the run's seed), a different world size")


ADD_NOISE_SLA = ("add matches_golden_within_noise: true under expect (it runs the golden run "
                 "twice, as golden: {runs: 2} does)")
"""What to add to an experiment whose bitwise verdict a trainer's own noise keeps from being
measured (the note of an inconclusive bitwise verdict says it)."""


@dataclass(frozen=True, slots=True)
class Reproducibility:
    """What two fault-free runs of the same job say about the trainer."""

    reproducible: bool
    first_step: int | None = None
    """The first step whose loss differs between the two runs (None: losses equal)."""
    max_loss_diff: float = 0.0
    weights_rel_l2: float | None = None
    """Relative L2 distance of the two final states' floating-point tensors."""

    def note(self, *, advise: bool = True) -> str:
        """Why bitwise equality is not measured; with ``advise``, what to add to judge the
        trainer anyway (leave it out when the experiment has it already)."""
        if self.reproducible:
            return "two fault-free runs ended bitwise equal: the trainer is reproducible"
        where = (f"from step {self.first_step} (largest loss difference "
                 f"{self.max_loss_diff:.3g})" if self.first_step is not None else
                 "in their final state only (their losses agree to the digits recorded)")
        weights = "" if self.weights_rel_l2 is None else \
            f", final weights {self.weights_rel_l2:.3g} apart (relative L2)"
        return (f"not measured: two fault-free runs differ {where}{weights}: the trainer is "
                f"not bitwise reproducible on this target; {CAUSES}"
                + (f"; or judge it by its own run-to-run noise: {ADD_NOISE_SLA}" if advise
                   else ""))


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
    """The largest deviation in units of the noise (None: not measured; infinite: a NaN or
    Inf in the run, or final weights that cannot match the golden run's)."""
    passed: bool
    note: str
    inconclusive: bool = False
    """Not measured for want of a reference (no second fault-free run, golden runs that went
    NaN, no step shared with them, golden weights that cannot be read): never passed."""


def within_noise(golden: Any, losses: Mapping[int, float], final_checkpoint: str | None,
                 k: float) -> WithinNoise:
    """Judge a run's per-step losses and final weights against the golden runs' noise.

    Evidence that is missing is never a pass: a NaN or Inf in the run's losses fails at the
    first step that has one, and its final weights fail when they lack a tensor of the golden
    run's, hold it in another shape, or hold a NaN or Inf (named); a reference that cannot
    measure the noise (no second run, a NaN in the golden runs, no shared step, golden
    weights that cannot be read) makes it inconclusive, with the reason and what to do."""
    second = getattr(golden, "second", None)
    if golden is None or not second:
        return _inconclusive("no second fault-free run to measure the trainer's noise; add "
                             "golden: {runs: 2} under the experiment")
    a, b = golden.losses, second.get("losses") or {}
    diverged = _first_nonfinite(("the golden run", a), ("the second golden run", b))
    if diverged:
        return _inconclusive(f"{diverged}: the fault-free reference diverged itself and "
                             f"measures no noise; make the trainer's fault-free run finite "
                             f"(logs: {golden.run_dir}) and run again (a change to the "
                             f"trainer measures the golden runs again)")
    ours = _first_nonfinite(("this run", losses))
    if ours:
        return WithinNoise(math.inf, False, f"{ours}, where both fault-free runs stayed "
                                            f"finite: the run diverged (k = {k:g})")
    steps = sorted(set(a) & set(b) & set(losses))
    if not steps:
        return _inconclusive("the run and the golden runs share no step with a loss; check "
                             "that observe.log_pattern (or the step records) gives a loss at "
                             "every step, a restarted run's too")
    worst, worst_step, left, envelope = _loss_units(a, b, losses, steps, k)
    w_units, w_note, w_inconclusive = _weights(golden, second, final_checkpoint)
    measured = worst if w_units is None else max(worst, w_units)
    if left is not None:
        s, dev, env = left
        head = (f"left the noise envelope at step {s}: loss {dev:.3g} from the golden run's, "
                f"{_units(dev / env if env else math.inf)} the two fault-free runs' spread "
                f"({env:.3g}) by then")
    else:
        head = (f"within {_units(worst)} the noise at every step"
                + (f" (closest to the edge at step {worst_step})" if worst_step else ""))
    parts = [head, w_note]
    if envelope == 0:
        parts.append("the two fault-free runs' losses agree to the digits recorded: the noise "
                     "is in digits the loss does not show")
    note = "; ".join(filter(None, parts)) + f" (k = {k:g})"
    if measured <= k and w_inconclusive:
        return WithinNoise(None, False, "not measured: " + note, inconclusive=True)
    return WithinNoise(round(measured, 3) if math.isfinite(measured) else measured,
                       measured <= k, note)


def _inconclusive(why: str) -> WithinNoise:
    return WithinNoise(None, False, f"not measured: {why}", inconclusive=True)


def _first_nonfinite(*series: tuple[str, Mapping[int, float]]) -> str:
    """``the golden run's loss is nan at step 7``: the first step of the first series (in
    the order given) whose loss is NaN or infinite ('' if none is)."""
    for who, losses in series:
        bad = next((s for s in sorted(losses) if not math.isfinite(losses[s])), None)
        if bad is not None:
            return f"{who}'s loss is {losses[bad]} at step {bad}"
    return ""


def _loss_units(a: Mapping[int, float], b: Mapping[int, float], losses: Mapping[int, float],
                steps: list[int], k: float
                ) -> tuple[float, int | None, tuple[int, float, float] | None, float]:
    """Over ``steps`` (every loss finite): the largest distance in noise units and its step,
    the first step past ``k`` (step, distance, noise), and the final envelope."""
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
        if not units <= worst:
            worst, worst_step = units, s
        if left is None and not units <= k:
            left = (s, dev, noise)
    return worst, worst_step, left, envelope


def _weights(golden: Any, second: Mapping[str, Any], final_checkpoint: str | None
             ) -> tuple[float | None, str, bool]:
    """The final weights in noise units (None: not compared), the note's part, and whether
    the reference could not measure them (inconclusive). Infinite when this run's final
    checkpoint lacks a tensor of the golden run's, holds one in another shape or holds a NaN
    or Inf, or cannot be read where the golden runs' could."""
    reference, other = golden.final_checkpoint, second.get("final_checkpoint")
    if not reference and not other:
        return None, "final weights not compared: the golden runs left no final checkpoint", \
            False
    ref = "the golden run's final checkpoint"
    spread = weights_gap(other, reference, ref=ref)
    if spread.distance is None:
        why = (f"the second golden run's final checkpoint {spread.problem}" if spread.problem
               else spread.not_measured)
        return None, (f"final weights not measured: their spread between the golden runs is "
                      f"unknown ({why})"), True
    gap = weights_gap(final_checkpoint, reference, ref=ref)
    if gap.problem:
        return math.inf, f"this run's final checkpoint {gap.problem}", False
    if gap.distance is None:
        return math.inf, (f"this run's final weights cannot be compared, where the golden "
                          f"runs' could: {gap.not_measured}"), False
    units = 0.0 if gap.distance == 0 else (
        math.inf if spread.distance == 0 else gap.distance / spread.distance)
    return units, (f"final weights {_units(units)} the noise ({gap.distance:.3g} against "
                   f"{spread.distance:.3g} relative L2)"), False


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
