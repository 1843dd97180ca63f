"""The SLAs faultlab ships, each one declaration of ``faultlab.sla.Sla`` registered under the
``faultlab.slas`` entry-point group in faultlab's ``pyproject.toml`` (``completes =
"faultlab.sla.builtin:COMPLETES"``), as a team's are in its own. Each says where it is listed
(``order``: 10, 20 ...; the schema, the reference, the verdict and ``faultlab list slas``
follow it); a new one takes a free number where it belongs, and its entry point.

Most read one metric of ``faultlab.observe.Metrics`` and need no code. The others say in
:meth:`~faultlab.sla.Sla.explain` what their note adds (which checkpoint a job loaded after a
storage fault damaged it, which node a completed job fell short on ...) or measure for
themselves (the golden comparisons).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field

from faultlab.sla.base import Evidence, Outcome, Sla
from faultlab.sla.detection import StragglerDetected

__all__ = ["NOISE_K_DEFAULT"]

NOISE_K_DEFAULT = 10.0
"""``matches_golden_within_noise: true``: a run may stray 10 times the fault-free spread."""


@dataclass(frozen=True, kw_only=True)
class Completes(Sla):
    """The job reached run.steps: its events say so, it did not time out, and its nodes agree."""

    def explain(self, ev: Evidence, measured: Any, bound: Any) -> tuple[Any, str]:
        if ev.timed_out:
            note = f"timed out after {ev.exp.run.timeout_s:g} s"
            if not ev.metrics.max_step:
                note += " without reaching a single step (see the nodes' logs)"
            return False, note
        if measured is False:
            return measured, _last_failure(ev.events) or ev.completion_reason()
        if measured is True and (short := ev.nodes_fell_short()):
            return False, short
        return measured, ""


def _so_far(ev: Evidence, sla: Sla, measured: Any, bound: Any) -> tuple[Any, str] | None:
    """A restart count within its upper bound when faultlab stopped an unfinished job (at its
    timeout, or interrupted): not measured, never a pass; the restarts it would still have
    spent are unknown. A job that ended by itself has spent them: its count stands."""
    if ev.timed_out and ev.unfinished and measured is not None and sla.holds(measured, bound):
        return None, f"{measured} restart(s) before {ev.unfinished}"
    return None


@dataclass(frozen=True, kw_only=True)
class MaxRestarts(Sla):
    def measure(self, ev: Evidence) -> Any:
        # no start record: no process of the job ran (or none left a record), and 0 restarts
        # of nothing is no count at all
        return super().measure(ev) if _started(ev) else None

    def explain(self, ev: Evidence, measured: Any, bound: Any) -> tuple[Any, str]:
        if not _started(ev):
            return None, "not measured: no process of the job wrote a start record"
        return _so_far(ev, self, measured, bound) or (measured, "")


def _started(ev: Evidence) -> bool:
    return any(e.get("kind") == "start" for e in ev.events)


@dataclass(frozen=True, kw_only=True)
class DetectionLatency(Sla):
    def explain(self, ev: Evidence, measured: Any, bound: Any) -> tuple[Any, str]:
        if measured is not None:
            first = max((f for f in ev.metrics.faults if f.detection_latency_s is not None),
                        key=lambda f: f.detection_latency_s or 0.0)
            return measured, f"{first.fault_id}: {first.detected_by} [{first.detection_source}]"
        if ev.fired and not any(f.went_down or f.detection_latency_s is not None
                                for f in ev.metrics.faults):
            return measured, ("not measured: the job never noticed the fault (no error, restart, "
                              "anomaly or exit after it)")
        return measured, ""


@dataclass(frozen=True, kw_only=True)
class BitwiseEqual(Sla):
    """The final digest against the golden run's; inconclusive (never passed, never failed)
    when two fault-free runs differ: a measured ``matches_golden_within_noise`` then judges in
    its place (``faultlab.judge.verdict.COVERS``)."""

    def measure(self, ev: Evidence) -> Any:
        golden, metrics = ev.golden, ev.metrics
        if golden is not None and metrics.final_digest is not None and \
                golden.digest is not None and metrics.completes:
            # an unfinished run's last checkpoint is not its final state
            return metrics.final_digest == golden.digest
        return ev.value(self.key)

    def judge(self, ev: Evidence, bound: Any) -> Outcome:
        repro = ev.reproducibility()
        if repro is not None and not repro.reproducible and not ev.unfinished:
            # nothing to do with recovery, and no evidence of it either way
            advise = ev.exp.expect.matches_golden_within_noise is None
            return Outcome(None, False, repro.note(advise=advise), inconclusive=True)
        return super().judge(ev, bound)

    def explain(self, ev: Evidence, measured: Any, bound: Any) -> tuple[Any, str]:
        note = "no golden run" if ev.golden is None else ""
        if measured is None:
            for side, state in (("this run", ev.final_state), ("the golden run", ev.golden)):
                reason = getattr(state, "not_measured", None)
                if reason:
                    return measured, f"not measured: {reason} ({side})"
        elif measured is False and (differs := ev.first_differing_tensor()):
            return measured, f"first differing tensor: {differs}"
        return measured, note

    def unfinished_why(self, ev: Evidence) -> str | None:
        return ev.unfinished_why(self.metric) or "its last checkpoint is not a final state"


@dataclass(frozen=True, kw_only=True)
class WithinNoise(Sla):
    """The run against the golden run in units of two fault-free runs' spread
    (``faultlab.judge.noise``); the bound ``true`` is k = 10."""

    def annotation(self) -> Any:
        return Annotated[float, Field(gt=0)] | Literal[True] | None

    def parse(self, value: Any) -> Any:
        if value is True:
            return NOISE_K_DEFAULT
        if value is False:
            raise ValueError("expected k, a number > 0 (or true for the default, "
                             f"{NOISE_K_DEFAULT:g}); leave the key out not to judge it")
        return value

    def judge(self, ev: Evidence, bound: Any) -> Outcome:
        within = ev.within_noise(bound)
        if not ev.metrics.completes:  # a run that ended early is no final state to judge
            return Outcome(None, False, "not measured: the run did not complete; " + within.note)
        return Outcome(within.measured, within.passed, within.note,
                       inconclusive=within.inconclusive)


_NO_SAVE_FAILURE = ("not measured: no io_error, disk_full or io_hang fault hit an operation, "
                    "and the job reported no failed save")


@dataclass(frozen=True, kw_only=True)
class SaveFailureSla(Sla):
    """A save that a storage fault made fail: not measured says so when no fault struck one."""

    def explain(self, ev: Evidence, measured: Any, bound: Any) -> tuple[Any, str]:
        measured, note = self.why(ev, measured)
        if measured is None and not note and not any(ev.struck(f) for f in ev.faults):
            note = _NO_SAVE_FAILURE
        return measured, note

    def why(self, ev: Evidence, measured: Any) -> tuple[Any, str]:
        return measured, ""


@dataclass(frozen=True, kw_only=True)
class NeverLoaded(SaveFailureSla):
    """No damaged checkpoint (or failed save) loaded; if one was, which, where and when."""

    save_failure: bool = False
    """Among the save-failure SLAs (its not-measured note names them)."""

    def explain(self, ev: Evidence, measured: Any, bound: Any) -> tuple[Any, str]:
        if self.save_failure:
            return super().explain(ev, measured, bound)
        return self.why(ev, measured)

    def why(self, ev: Evidence, measured: Any) -> tuple[Any, str]:
        if measured is False:
            return measured, (_loaded_damage(ev.faults, ev.events)
                              or _loaded_failed_save(ev.events))
        return measured, ""


@dataclass(frozen=True, kw_only=True)
class SaveFailureDetected(SaveFailureSla):
    def why(self, ev: Evidence, measured: Any) -> tuple[Any, str]:
        if measured is False:
            return measured, "; ".join(ev.save_failure_sign(f) for f in ev.faults
                                       if ev.struck(f))
        return measured, ""


@dataclass(frozen=True, kw_only=True)
class TrainedThroughSaveFailure(SaveFailureSla):
    def why(self, ev: Evidence, measured: Any) -> tuple[Any, str]:
        if measured is False:
            restarted = ev.metrics.restarts > 0
            return measured, ("the processes that failed the save did not train on: the job "
                              + ("was restarted" if restarted else "stopped") + " after it")
        return measured, ""


@dataclass(frozen=True, kw_only=True)
class Exclusion(Sla):
    """A GPU that stayed failed: if its node was never left out, which node and after how many
    restarts."""

    def explain(self, ev: Evidence, measured: Any, bound: Any) -> tuple[Any, str]:
        if not measured and ev.fired:
            lasting = [str(f.details.get("node")) for f in ev.faults if f.details.get("sticky")]
            if lasting:
                return measured, (f"the job never ran without {', '.join(lasting)} (its GPU "
                                  f"stayed failed); {ev.metrics.restarts} restart(s) used")
        return measured, ""


@dataclass(frozen=True, kw_only=True)
class Healing(Sla):
    """A stack that recovers per step: the note is ``faultlab.observe.healing``'s."""

    counts_restarts: bool = False
    """A count of restarts over the whole run (``_so_far``)."""

    def explain(self, ev: Evidence, measured: Any, bound: Any) -> tuple[Any, str]:
        so_far = _so_far(ev, self, measured, bound) if self.counts_restarts else None
        if so_far is not None:
            return so_far[0], "; ".join(filter(None, [so_far[1], ev.metrics.healing_note]))
        return measured, ev.metrics.healing_note or ""


@dataclass(frozen=True, kw_only=True)
class SameResumePoint(Sla):
    def explain(self, ev: Evidence, measured: Any, bound: Any) -> tuple[Any, str]:
        return measured, (_resume_points(ev.metrics) if measured is not None else "")


COMPLETES = Completes(
    key="completes", order=10, value=bool, kind="bool", unit="bool", metric="completes",
    description="the job reached run.steps and exited cleanly: every rank of its final "
                "incarnation, at the topology's world size (an elastic job: less only the "
                "nodes a fault struck, not below min_nodes), and every node no fault "
                "struck with exit 0",
    doc="The job must (true) or must not (false) reach run.steps.")

MAX_RESTARTS = MaxRestarts(
    key="max_restarts", order=20, value=int, ge=0, kind="max", unit="restarts", metric="restarts",
    description="restarts of the job (torchrun restarts of the worker group)",
    doc="At most this many restarts.")

DETECTION_LATENCY_S = DetectionLatency(
    key="detection_latency_s", order=30, value=float, gt=0, kind="max", unit="s",
    metric="detection_latency_s",
    description="fault injected → first sign the job noticed",
    doc="Upper bound, seconds.")

RESUME_TIME_S = Sla(
    key="resume_time_s", order=40, value=float, gt=0, kind="max", unit="s", metric="resume_time_s",
    description="fault injected → first completed step after the job came back",
    doc="Upper bound, seconds.")

RECOVERY_TIME_S = Sla(
    key="recovery_time_s", order=50, value=float, gt=0, kind="max", unit="s",
    metric="recovery_time_s",
    description="fault injected → the job is back at its highest step before the fault",
    doc="Upper bound, seconds.")

LOST_STEPS = Sla(
    key="lost_steps", order=60, value=int, ge=0, kind="max", unit="steps", metric="lost_steps",
    description="highest step before the fault − step it resumed from",
    doc="Upper bound, steps.")

GOODPUT = Sla(
    key="goodput", order=70, value=float, gt=0, le=1, kind="min", unit="ratio (0-1)",
    metric="goodput",
    description="useful step time ÷ wall time over the run",
    doc="Lower bound, a fraction in (0, 1].")

BITWISE_EQUAL_TO_GOLDEN = BitwiseEqual(
    key="bitwise_equal_to_golden", order=80, value=bool, kind="bool", unit="bool",
    metric="bitwise_equal_to_golden", correctness=True,
    description="final digest equals the fault-free golden run's",
    doc="""Final state bitwise equal (or not) to the fault-free golden run's. With ``golden:
    {runs: 2}`` and two fault-free runs that differ, not measured: the verdict is
    inconclusive, unless ``matches_golden_within_noise`` is measured in the same
    experiment, which then judges in its place.""")

MATCHES_GOLDEN_WITHIN_NOISE = WithinNoise(
    key="matches_golden_within_noise", order=90, value=float, kind="max", unit="noise units",
    metric="matches_golden_within_noise", correctness=True,
    description="largest distance to the golden run (per-step loss, final weights) in "
                "units of two fault-free runs' spread",
    doc="""``k``: the run's losses at every step, and its final weights, stay within ``k`` times
    the spread of two fault-free runs (``true``: 10). For trainers that are not bitwise
    reproducible; runs the golden run twice. A NaN or Inf in the run's losses or final
    weights, or a tensor of the golden run's missing from its final checkpoint or of
    another shape, fails it (named); a NaN in the golden runs makes it inconclusive.""")

SAMPLES_EXACTLY_ONCE = Sla(
    key="samples_exactly_once", order=100, value=bool, kind="bool", unit="bool",
    metric="samples_exactly_once",
    description="every sample was trained on exactly once",
    doc="Every sample trained on exactly once (or not).")

CORRUPT_CHECKPOINT_NEVER_LOADED = NeverLoaded(
    key="corrupt_checkpoint_never_loaded", order=110, value=bool, kind="bool", unit="bool",
    metric="corrupt_checkpoint_never_loaded",
    description="no checkpoint damaged by a storage fault was loaded",
    doc="No checkpoint a storage fault damaged was ever loaded (or, if false, one was).")

EMERGENCY_CHECKPOINT_BEFORE_DEADLINE = Sla(
    key="emergency_checkpoint_before_deadline", order=120, value=bool, kind="bool", unit="bool",
    metric="emergency_checkpoint_before_deadline",
    description="after a preemption notice, an emergency checkpoint was committed before "
                "the termination deadline",
    doc="""After a preemption notice, an emergency checkpoint was (or was not) committed before
    the deadline.""")

EMERGENCY_CHECKPOINT_S = Sla(
    key="emergency_checkpoint_s", order=130, value=float, gt=0, kind="max", unit="s",
    metric="emergency_checkpoint_s",
    description="preemption notice → emergency checkpoint committed",
    doc="Upper bound, seconds from the notice to the committed emergency checkpoint.")

CHECKPOINTS_ALL_FINITE = Sla(
    key="checkpoints_all_finite", order=140, value=bool, kind="bool", unit="bool",
    metric="checkpoints_all_finite",
    description="every checkpoint the job left holds only finite values (read back after "
                "the run)",
    doc="Every checkpoint left in the job's folder holds (or not) only finite values; keep "
        "them\nall with ``target.overrides.keep_checkpoints`` to cover every checkpoint ever "
        "saved.")

REQUEUE_LATENCY_S = Sla(
    key="requeue_latency_s", order=150, value=float, gt=0, kind="max", unit="s",
    metric="requeue_latency_s",
    description="fault injected → the scheduler requeued the job → running again "
                "(slurm)",
    doc="""Upper bound, seconds from the fault to the job running again after the scheduler
    requeued it (``topology.launcher: slurm``); a job never requeued fails it.""")

STRAGGLER_DETECTED_WITHIN_S = StragglerDetected(
    key="straggler_detected_within_s", order=160, value=float, gt=0, kind="max", unit="s",
    metric="straggler_detected_within_s",
    description="a rank slowed down → the trainer names it in an anomaly, or a declared "
                "detection signal names it (its rank or node)",
    doc="""Upper bound, seconds from slowing a rank down to the trainer naming it (a
    straggler anomaly) or a declared signal of ``observe.detections`` naming it (or those
    of ``detected_by``).""")

MAX_SLOWDOWN = Sla(
    key="max_slowdown",
    order=170, value=float, gt=0, kind="max", unit="ratio (x)", metric="slowdown",
    description="median step time while a slowing fault is in force ÷ the median before "
                "it",
    doc="Upper bound on the slowdown a slowing fault causes (step time during ÷ before).")

SAVE_FAILURE_DETECTED = SaveFailureDetected(
    key="save_failure_detected", order=180, value=bool, kind="bool", unit="bool",
    metric="save_failure_detected",
    description="a save that io_error, disk_full or io_hang made fail was noticed (an "
                "anomaly, a watchdog, a rank that failed), not taken for saved",
    doc="A save that a storage fault made fail was (or was not) noticed by the job.")

FAILED_SAVE_NEVER_LOADED = NeverLoaded(
    key="failed_save_never_loaded", order=190, value=bool, kind="bool", unit="bool",
    metric="failed_save_never_loaded", save_failure=True,
    description="no checkpoint whose save failed or was cut short (or that a storage "
                "fault damaged) was loaded",
    doc="""No checkpoint whose save failed, was cut short or was damaged was ever loaded (or, if
    false, one was).""")

TRAINING_CONTINUED_THROUGH_SAVE_FAILURE = TrainedThroughSaveFailure(
    key="training_continued_through_save_failure", order=200, value=bool, kind="bool", unit="bool",
    metric="training_continued_through_save_failure",
    description="after a failed save the same processes trained on, without a restart",
    doc="After a failed save the same processes trained on (or did not).")

SAVE_HANG_DETECTED_WITHIN_S = SaveFailureSla(
    key="save_hang_detected_within_s", order=210, value=float, gt=0, kind="max", unit="s",
    metric="save_hang_detected_within_s",
    description="io_hang struck a save → the job noticed (detection_latency_s, counting "
                "only signs of a failed save)",
    doc="Upper bound, seconds from a hung save (``io_hang``) to the job noticing it.")

FAULTY_NODE_EXCLUDED = Exclusion(
    key="faulty_node_excluded", order=220, value=bool, kind="bool", unit="bool",
    metric="faulty_node_excluded",
    description="the job finished without the node whose GPU stayed failed (sticky "
                "gpu_error; faultlab.observe.exclusion)",
    doc="""The job finished without (true) the node whose GPU stayed failed (``gpu_error`` with
    ``sticky: true``), or did not (false).""")

RESTARTS_UNTIL_EXCLUDED = Exclusion(
    key="restarts_until_excluded", order=230, value=int, ge=1, kind="max", unit="restarts",
    metric="restarts_until_excluded",
    description="GPU failed for good → restarts until the job ran without its node",
    doc="Upper bound on the restarts from a GPU that stayed failed until the job ran "
        "without its\nnode; a job that never excluded it fails it.")

SURVIVOR_RESTARTS = Healing(
    key="survivor_restarts", order=240, value=int, ge=0, kind="max", unit="restarts",
    metric="survivor_restarts", counts_restarts=True,
    description="restarts of the ranks no fault struck, after the first fault "
                "(faultlab.observe.healing)",
    doc="""Upper bound on the restarts of the ranks a fault did not strike (torchft: the other
    replica groups step on without one: 0).""")

SURVIVOR_LOST_STEPS = Healing(
    key="survivor_lost_steps", order=250, value=int, ge=0, kind="max", unit="steps",
    metric="survivor_lost_steps",
    description="steps the ranks no fault struck redid or lost",
    doc="""Upper bound on the steps the ranks a fault did not strike redid or lost (0 expected
    where the stack recovers per step).""")

HEALED_BY_STEP = Healing(
    key="healed_by_step",
    order=260, value=int, ge=1, kind="max", unit="step", metric="healed_at_step",
    description="the step at which the struck ranks stepped again (healed)",
    doc="The struck ranks stepped again (healed) at or before this step.")

HEAL_TIME_S = Healing(
    key="heal_time_s", order=270, value=float, gt=0, kind="max", unit="s", metric="heal_time_s",
    description="fault injected (or undone) → the struck ranks' first committed step",
    doc="Upper bound, seconds from the fault to the struck ranks' first committed step.")

HEALED_STATE_MATCHES_PEER = Healing(
    key="healed_state_matches_peer", order=280, value=bool, kind="bool", unit="bool",
    metric="healed_state_matches_peer", correctness=True,
    description="the healed ranks' weights equal a survivor's at every step both "
                "recorded (observe.step_digest)",
    doc="The healed ranks' weights equal (or not) a surviving peer's at every step both "
        "recorded\nfrom the heal on (needs ``observe.step_digest``).")

SAME_RESUME_POINT = SameResumePoint(
    key="same_resume_point", order=290, value=bool, kind="bool", unit="bool",
    metric="same_resume_point",
    description="every rank of each restart resumed from the same checkpoint step",
    doc="""Every rank of each restart resumed from the same checkpoint step (or, if false, some
    did not): one node with an older view of the checkpoint directory (``stale_shared_fs``)
    must not make its ranks load another checkpoint than the rest.""")


# ------------------------------------------------------------ what the notes read in the records


def _last_failure(events: Sequence[Mapping[str, Any]]) -> str:
    """How the last rank that failed ended: its exit reason and error."""
    failed = [e for e in events if e.get("kind") == "exit"
              and e.get("reason") not in ("completed", "stopped")]
    if not failed:
        return ""
    last = max(failed, key=lambda e: float(e.get("t") or 0))
    error = str(last.get("error") or "").splitlines()[0][:160] if last.get("error") else ""
    return (f"the last failure: rank {last.get('rank')} exited {last.get('reason')}"
            + (f" ({error})" if error else "")
            + f" after {len(failed)} failed exit(s) in all")


def _loaded_failed_save(events: Sequence[Mapping[str, Any]]) -> str:
    """Which failed save the job loaded, and when it had reported the failure."""
    failed = [e for e in events if e.get("kind") == "anomaly"
              and e.get("what") in ("checkpoint_save_failed", "checkpoint_save_hung")
              and isinstance(e.get("path"), str)]
    for e in events:
        if e.get("kind") != "checkpoint_loaded" or not isinstance(e.get("path"), str):
            continue
        for f in failed:
            p, q = e["path"].rstrip("/"), f["path"].rstrip("/")
            if (p == q or p.startswith(q + "/") or q.startswith(p + "/")) and \
                    float(e.get("t") or 0) > float(f.get("t") or 0):
                return (f"rank {e.get('rank')} loaded {e['path']} (step {e.get('step')}) after "
                        f"its save was reported {f.get('what')} at step {f.get('step')}")
    return ""


def _loaded_damage(faults: Sequence[Any], events: Sequence[Mapping[str, Any]]) -> str:
    """Which checkpoint a storage fault damaged the job then loaded: file, offset and step."""
    for f in faults:
        damaged = set(f.details.get("checkpoints") or [])
        for e in events:
            if e.get("kind") == "checkpoint_loaded" and e.get("path") in damaged and \
                    float(e.get("t") or 0) > f.injected_t:
                hits = [h for key in ("flips", "truncated", "zeroed") for h in
                        (f.details.get(key) or []) if isinstance(h, dict)]
                where = "; ".join(f"{h.get('file')} at offset {h.get('offset')}"
                                  for h in hits[:3]) or ", ".join(map(str, f.details.get(
                                      "deleted") or [])) or "its files"
                return (f"rank {e.get('rank')} loaded {e.get('path')} (step {e.get('step')}) "
                        f"after {f.id} ({f.type}) damaged {where}, and trained on")
    return ""


def _resume_points(metrics: Any) -> str:
    """Which checkpoint step each rank resumed from, after each fault whose restart split
    them (or, when none did, the step they agreed on)."""
    split = [f for f in metrics.faults if f.resumed_from_steps and len(f.resumed_from_steps) > 1]
    if not split:
        agreed = sorted({s for f in metrics.faults for s in f.resumed_from_steps or []})
        return f"every restart's ranks resumed from one step ({', '.join(map(str, agreed))})"
    parts = []
    for f in split:
        by_step: dict[int, list[str]] = {}
        for rank, got in sorted((f.resumed_by_rank or {}).items()):
            where = f"{got['node']} (rank {rank})" if got.get("node") else f"rank {rank}"
            by_step.setdefault(got["step"], []).append(where)
        steps = "; ".join(f"step {s} on {', '.join(w)}" for s, w in sorted(by_step.items()))
        parts.append(f"after {f.fault_id}: {steps}")
    return "the ranks of one restart loaded different checkpoints: " + " | ".join(parts)
