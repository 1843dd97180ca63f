"""The detection SLAs: does the team's own monitor notice a fault that raises no error (a rank
that computes wrong, a rank that runs slow), how fast, naming whom, and how often it fires with
no fault at all.

They read the run's detection report (``Evidence.detection``:
``faultlab.observe.detection_score.DetectionReport``): the onset of the first fault that slows
the job or corrupts silently (its ground truth) and each signal's first detection after it.
By default they count every declared signal (``observe.detections``) and every ``anomaly:<what>``
the trainer wrote; ``expect.detected_by`` restricts them to the signals it names.

Never a pass on missing evidence: a fault that never struck leaves them not measured
(``inconclusive``); a fault that struck and that no counted signal detected fails them, with
its ground truth in the note (``not detected: sdc-1 (sdc) on rank 1's update from step 10, 45
strikes``). ``false_alarms`` needs no fault: it counts the signals' detections in the
fault-free golden run(s), and is not measured without them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from faultlab.sla.base import Evidence, Outcome, Sla

__all__ = ["DETECTION_KEYS", "StragglerDetected", "counted_names"]

NOT_STRUCK = ("not measured: no fault that slows the job or corrupts silently struck (no "
              "fault_struck or fault_injected record of one)")


def counted_names(ev: Evidence) -> Sequence[str] | None:
    """``expect.detected_by`` (None: every signal counts)."""
    names = getattr(ev.exp.expect, "detected_by", None)
    return list(names) if names is not None else None


def _report(ev: Evidence) -> Any:
    return getattr(ev, "detection", None)


def _not_detected(report: Any, ev: Evidence) -> str:
    signals = [s.name for s in report.counted(counted_names(ev))]
    by = f"by {', '.join(signals)}" if signals else "(no signal counted: none declared, and " \
        "the trainer wrote no anomaly record)"
    return f"not detected {by}: {report.onset.describe()}"


@dataclass(frozen=True, kw_only=True)
class DetectionSla(Sla):
    """Measured from the onset to the counted signals' first detections (module docstring)."""

    def judge(self, ev: Evidence, bound: Any) -> Outcome:
        report = _report(ev)
        if report is None or report.onset is None:  # nothing to detect: unless the run
            # ended early (then it might have struck later), neither passed nor failed
            if ev.unfinished:
                return Outcome(None, False, f"not measured: {ev.unfinished}; " + NOT_STRUCK[14:])
            return Outcome(None, False, NOT_STRUCK, inconclusive=True)
        return super().judge(ev, bound)

    def measure(self, ev: Evidence) -> Any:
        detected = [s for s in _report(ev).counted(counted_names(ev)) if s.detected]
        return self.read(detected) if detected else None

    def read(self, detected: list[Any]) -> Any:
        return None

    def explain(self, ev: Evidence, measured: Any, bound: Any) -> tuple[Any, str]:
        report = _report(ev)
        detected = [s for s in report.counted(counted_names(ev)) if s.detected]
        if not detected:
            return None, _not_detected(report, ev)
        first = min(detected, key=lambda s: s.t)
        note = f"first: {first.name} at step {first.step} ({first.evidence})"
        if measured is None:
            note = f"not measured: {self.key} has no value for {first.name}; {note}"
        return measured, note


@dataclass(frozen=True, kw_only=True)
class WithinSteps(DetectionSla):
    def read(self, detected: list[Any]) -> Any:
        steps = [s.within_steps for s in detected]
        return None if None in steps else min(steps)


@dataclass(frozen=True, kw_only=True)
class WithinSeconds(DetectionSla):
    def read(self, detected: list[Any]) -> Any:
        return min(s.within_s for s in detected)


@dataclass(frozen=True, kw_only=True)
class Attributed(DetectionSla):
    """True iff a counted signal named exactly the victims and none named anyone else."""

    def read(self, detected: list[Any]) -> Any:
        said = {s.attribution for s in detected}
        return "exact" in said and not said & {"extra", "wrong"}

    def explain(self, ev: Evidence, measured: Any, bound: Any) -> tuple[Any, str]:
        measured, note = super().explain(ev, measured, bound)
        report = _report(ev)
        detected = [s for s in report.counted(counted_names(ev)) if s.detected]
        if not detected:
            return measured, note
        named = "; ".join(f"{s.name}: {_attribution(s)}" for s in detected)
        return measured, f"victims {_victims(report.onset)}; {named}"


def _attribution(s: Any) -> str:
    if s.attribution == "none":
        return "detected, not attributed (named nobody)"
    who = f"ranks {s.ranks}" if s.ranks is not None else f"nodes {s.nodes}"
    return f"{s.attribution} ({who})"


def _victims(onset: Any) -> str:
    return ", ".join([*(f"rank {r}" for r in onset.ranks), *onset.nodes]) or "unknown"


@dataclass(frozen=True, kw_only=True)
class FalseAlarms(Sla):
    """The counted signals' detections in the fault-free golden run(s); needs no fault."""

    def measure(self, ev: Evidence) -> Any:
        report = _report(ev)
        if report is None or not report.golden:
            return None
        counts = [s.false_alarms for s in report.counted(counted_names(ev))]
        return None if None in counts else sum(counts)

    def explain(self, ev: Evidence, measured: Any, bound: Any) -> tuple[Any, str]:
        report = _report(ev)
        if report is None or not report.golden:
            return None, "not measured: no golden run to scan"
        counted = report.counted(counted_names(ev))
        unknown = [s.name for s in counted if s.false_alarms is None]
        if unknown:
            return None, (f"not measured: the golden run left nothing to read for "
                          f"{', '.join(unknown)} (its run directory or exit codes are gone)")
        return measured, "; ".join(f"{s.name}: {s.false_alarms}" for s in counted
                                   if s.false_alarms)


@dataclass(frozen=True, kw_only=True)
class Contaminated(DetectionSla):
    """Checkpoints saved at or after the onset's step (each step once)."""

    def measure(self, ev: Evidence) -> Any:
        onset = _report(ev).onset
        return len(_saved_from(ev.events, onset.t, onset.step))

    def explain(self, ev: Evidence, measured: Any, bound: Any) -> tuple[Any, str]:
        onset = _report(ev).onset
        steps = _saved_from(ev.events, onset.t, onset.step)
        return measured, (f"saved after the onset ({onset.describe()}): steps "
                          f"{', '.join(map(str, steps))}" if steps else "")


@dataclass(frozen=True, kw_only=True)
class ResumedClean(DetectionSla):
    """Every checkpoint loaded after the onset was saved before its step."""

    def measure(self, ev: Evidence) -> Any:
        loaded = _loaded_after(ev.events, _report(ev).onset.t)
        onset_step = _report(ev).onset.step
        if not loaded or onset_step is None:
            return None
        return all(step < onset_step for step in loaded)

    def explain(self, ev: Evidence, measured: Any, bound: Any) -> tuple[Any, str]:
        onset = _report(ev).onset
        loaded = _loaded_after(ev.events, onset.t)
        if not loaded:
            return None, f"not measured: the job never resumed after the onset ({onset.describe()})"
        return measured, (f"loaded step(s) {', '.join(map(str, sorted(set(loaded))))} after the "
                          f"onset at step {onset.step}")


def _int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _saved_from(events: Sequence[Mapping[str, Any]], t: float, step: int | None) -> list[int]:
    steps = {s for e in events if e.get("kind") == "checkpoint_saved"
             and float(e.get("t") or 0) >= t and (s := _int(e.get("step"))) is not None
             and (step is None or s >= step)}
    return sorted(steps)


def _loaded_after(events: Sequence[Mapping[str, Any]], t: float) -> list[int]:
    return [s for e in events if e.get("kind") == "checkpoint_loaded"
            and float(e.get("t") or 0) >= t and (s := _int(e.get("step"))) is not None]


@dataclass(frozen=True, kw_only=True)
class StragglerDetected(Sla):
    """The slowed rank named: by the trainer's straggler anomaly (the metric) or by a counted
    declared signal that names a victim rank or node, whichever came first, per slowing fault;
    the worst over the faults."""

    def measure(self, ev: Evidence) -> Any:
        report = _report(ev)
        if report is None:
            return super().measure(ev)
        names = counted_names(ev)
        names = names if names is not None else [
            *(s.name for s in ev.exp.observe.detections), "anomaly:straggler"]
        worst: float | None = None
        for f in ev.metrics.faults:
            record = next((r for r in ev.faults if r.id == f.fault_id), None)
            if record is None or not record.declares("slows_job"):
                continue
            ranks, nodes = report.victims(record, ev.events)
            named = report.first_naming(set(ranks), set(nodes), f.injected_t, names)
            found = [x for x in (f.straggler_detected_s,
                                 named.t - f.injected_t if named else None) if x is not None]
            if not found:
                return None
            worst = max(worst or 0.0, min(found))
        return worst


_DETECTION_DOC = "Counts every declared signal (or those of ``detected_by``); "

DETECTED_WITHIN_STEPS = WithinSteps(
    key="detected_within_steps", order=300, value=int, ge=0, kind="max", unit="steps",
    description="the first fault that slows the job or corrupts silently struck → the "
                "first detection by a counted signal, in steps",
    doc=_DETECTION_DOC + """upper bound in steps from the fault's onset (its first
    strike) to the first detection. A fault that struck and was not detected fails it.""")

DETECTED_WITHIN_S = WithinSeconds(
    key="detected_within_s", order=310, value=float, gt=0, kind="max", unit="s",
    description="the first fault that slows the job or corrupts silently struck → the "
                "first detection by a counted signal",
    doc=_DETECTION_DOC + """upper bound in seconds from the onset to the first detection
    (or relative: ``{step_times: 20}``).""")

DETECTION_ATTRIBUTED = Attributed(
    key="detection_attributed", order=320, value=bool, kind="bool", unit="bool",
    description="a counted signal named exactly the victim ranks (or nodes), and none "
                "named anyone else",
    doc=_DETECTION_DOC + """the detection named exactly the victims (``true``); extra
    ranks named count against it, a detection that names nobody is "detected, not
    attributed".""")

FALSE_ALARMS = FalseAlarms(
    key="false_alarms", order=330, value=int, ge=0, kind="max", unit="alarms",
    description="detections by the counted signals in the fault-free golden run(s)",
    doc=_DETECTION_DOC + """upper bound on their detections in the fault-free golden
    run(s) (runs one).""")

CONTAMINATED_CHECKPOINTS = Contaminated(
    key="contaminated_checkpoints", order=340, value=int, ge=0, kind="max", unit="checkpoints",
    description="checkpoints saved at or after the onset's step",
    doc="Upper bound on the checkpoints saved from the fault's onset on.")

RESUMED_FROM_CLEAN_STATE = ResumedClean(
    key="resumed_from_clean_state", order=350, value=bool, kind="bool", unit="bool",
    description="every checkpoint loaded after the onset was saved before it",
    doc="""The job resumed (``true``) only from checkpoints saved before the onset; a job
    that never resumed after it fails it (not measured).""")

DETECTION_KEYS = frozenset(s.key for s in (
    DETECTED_WITHIN_STEPS, DETECTED_WITHIN_S, DETECTION_ATTRIBUTED, FALSE_ALARMS,
    CONTAMINATED_CHECKPOINTS, RESUMED_FROM_CLEAN_STATE))
"""The detection SLAs' ``expect`` keys (each registered in the ``faultlab.slas`` group)."""
