"""The verdict of one run: every SLA of ``expect`` against the measured metrics, the final
digest against the golden run's, and whether each fault was injected at all.

``judge`` returns one ``SLAResult`` per check, each with its ``result``:

- ``pass``: measured, and it held;
- ``fail``: measured and it did not hold, or not measured for what the run did (it ended
  early, it left no events) or for an SLA that is not about correctness;
- ``inconclusive``: a correctness SLA (``faultlab.sla.Sla.correctness``) not measured on a run
  that completed, for want of a reference or of evidence the run did not lose (two fault-free
  runs that differ, golden runs that went NaN); its note says what to add;
- ``covered``: an inconclusive ``bitwise_equal_to_golden`` that a measured
  ``matches_golden_within_noise`` of the same experiment judges in its place.

The run's verdict (``verdict_of``): ``fail`` if any check failed (or there is none),
``inconclusive`` if nothing failed but a check is inconclusive, else ``pass``. Never ``pass``
on evidence the run did not have. ``combine`` does the same for many verdicts (several
experiments, a suite, a fault family).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from faultlab.judge.evidence import RunEvidence
from faultlab.judge.slas import CAMPAIGN_SLAS
from faultlab.observe import FaultRecord, Metrics
from faultlab.observe.detection_score import DetectionReport, report_of
from faultlab.observe.final_state import FinalState
from faultlab.observe.launch_findings import LaunchFinding
from faultlab.sla import slas
from faultlab.sla.timing import RelativeSeconds, TimingUnits, bound_text
from faultlab.spec import Experiment, arrival_times_s

__all__ = ["COVERS", "FAIL", "INCONCLUSIVE", "PASS", "VERDICTS", "Golden", "SLAResult",
           "combine", "judge", "result_of", "row_result", "verdict_of"]

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
VERDICTS = (PASS, FAIL, INCONCLUSIVE)
"""The verdicts of a run, a set of runs, a suite or a campaign."""

COVERS = {"bitwise_equal_to_golden": "matches_golden_within_noise"}
"""An inconclusive SLA → the SLA that, measured in the same experiment, judges in its place:
on a trainer that is not bitwise reproducible, the noise verdict is the correctness check."""


class Golden(Protocol):
    """What the judge needs of a golden run (the engine's ``GoldenRun``): its final digest,
    and for a job without a digest event its final checkpoint's tensor hashes."""

    @property
    def digest(self) -> str | None: ...

    @property
    def tensors(self) -> dict[str, str]: ...

    @property
    def not_measured(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class SLAResult:
    name: str
    bound: Any
    measured: Any
    passed: bool
    note: str = ""
    limit: float | None = None
    """A relative bound (``bound``: ``{"cold_starts": 2.5}``) in seconds on this run."""
    ratio: str = ""
    """The measured seconds in the run's own units (``1.73 cold starts``)."""
    inconclusive: bool = False
    """Not measured, for want of a reference or evidence the run did not lose (a correctness
    SLA on a run that completed): neither passed nor failed (module docstring)."""
    covered_by: str | None = None
    """The SLA of the same experiment that judged in this inconclusive one's place
    (``COVERS``)."""

    @property
    def result(self) -> str:
        """``pass``, ``fail``, ``inconclusive`` or ``covered`` (module docstring)."""
        return result_of(self.passed, self.inconclusive, self.covered_by)

    def describe(self) -> str:
        campaign = CAMPAIGN_SLAS.get(self.name)
        sla = slas().get(self.name)
        kind = campaign.kind if campaign else sla.kind if sla else "bool"
        op = {"max": "<=", "min": ">=", "bool": "=="}[kind]
        measured = "not measured" if self.measured is None else repr(self.measured)
        if self.ratio:
            measured += f" s ({self.ratio})"
        bound = bound_text(self.bound, self.limit) if isinstance(self.bound, dict) \
            else repr(self.bound)
        return f"{self.name}: measured {measured}, required {op} {bound}" + \
            (f" ({self.note})" if self.note else "")

    def to_dict(self) -> dict[str, Any]:
        """As the journal keeps it: the fields and the ``result``."""
        return {"name": self.name, "bound": self.bound, "measured": self.measured,
                "passed": self.passed, "note": self.note, "limit": self.limit,
                "ratio": self.ratio, "inconclusive": self.inconclusive,
                "covered_by": self.covered_by, "result": self.result}


def result_of(passed: Any, inconclusive: Any = False, covered_by: Any = None) -> str:
    """An SLA's ``result`` from its fields (a journal row's too: ``result_of(**row)`` style,
    where a journal written before ``inconclusive`` existed has neither field)."""
    if passed:
        return PASS
    if inconclusive:
        return "covered" if covered_by else INCONCLUSIVE
    return FAIL


def row_result(row: Mapping[str, Any]) -> str:
    """The ``result`` of one SLA row of a journal (``SLAResult.to_dict``)."""
    return str(row.get("result") or result_of(row.get("passed"), row.get("inconclusive"),
                                              row.get("covered_by")))


def verdict_of(results: Sequence[SLAResult | Mapping[str, Any]]) -> str:
    """One run's verdict from its checks: ``fail`` if one failed or there is none,
    ``inconclusive`` if one is, else ``pass``."""
    found = [r.result if isinstance(r, SLAResult) else row_result(r) for r in results]
    if not found or FAIL in found:
        return FAIL
    return INCONCLUSIVE if INCONCLUSIVE in found else PASS


def combine(verdicts: Sequence[str]) -> str:
    """Many verdicts as one (several experiments, a suite, a fault family): ``fail`` if any
    is neither ``pass`` nor ``inconclusive`` (``not run`` included) or there is none,
    ``inconclusive`` if any is, else ``pass``."""
    if not verdicts or any(v not in (PASS, INCONCLUSIVE) for v in verdicts):
        return FAIL
    return INCONCLUSIVE if INCONCLUSIVE in verdicts else PASS


def judge(exp: Experiment, metrics: Metrics, golden: Golden | None, *,
          timed_out: bool, faults: list[FaultRecord],
          events: Sequence[Mapping[str, Any]] = (),
          final_state: FinalState | None = None,
          job_s: float | None = None,
          findings: Sequence[LaunchFinding] = (),
          node_exits: Mapping[str, int | None] | None = None,
          lost_nodes: Collection[str] = (),
          stopped_nodes: Collection[str] = (),
          losses: Mapping[int, float] | None = None,
          units: TimingUnits | None = None,
          detection: DetectionReport | None = None) -> list[SLAResult]:
    """Every SLA of ``expect`` against the measured metrics, plus the implicit check that each
    fault was injected at least once (an experiment whose fault never fired proved nothing).

    ``events`` and ``final_state`` (a job judged by its final checkpoint) only sharpen the
    notes: which tensor differs first from the golden run, which damaged checkpoint was loaded
    at which step, why the bitwise verdict could not be measured; ``job_s`` (how long the job
    ran, on the clock the triggers read) says which time trigger the run never reached;
    ``findings`` (the team's launch line at work: ``faultlab.observe.launch_findings``) are
    added to the note of every SLA they explain that failed.

    ``completes`` also asks of the nodes (``faultlab.observe.node_exits``): the final
    incarnation's world is the topology's (an elastic one shrunk only by the nodes the faults
    struck, not below ``min_nodes``), and each node no fault struck exited 0. ``node_exits``
    is the target's exit code per node (``Target.result().returncodes``; None: that half is not
    measured), ``lost_nodes`` its nodes lost on purpose (``killed``), ``stopped_nodes`` those
    the engine stopped because training had completed and they still ran.

    ``units`` are the run's fault-free timings (``faultlab.judge.timing.timing_units``), by
    which a relative bound in seconds is judged; None: such a bound is not measured.
    ``detection``: the run's detection report (``faultlab.observe.detection_score``), what the
    detection SLAs read; None: nothing was scored (they are not measured)."""
    out = _injected(exp, metrics, faults, events, job_s) + _golden_fault_free(golden)
    if detection is None:  # no engine's watcher: what the records alone show, no golden scan
        detection = report_of(exp.observe.detections, None, events, faults, None)
    ev = RunEvidence(exp, metrics, golden, timed_out, faults, events, final_state, job_s,
                     findings, node_exits, lost_nodes, stopped_nodes, losses, units, detection)
    declared = slas()
    judged = [SLAResult(key, bound.terms() if isinstance(bound, RelativeSeconds) else bound,
                        o.measured, o.passed, o.note, o.limit, o.ratio, o.inconclusive)
              for key, bound in exp.expect.items()
              for o in [declared[key].judge(ev, bound)]]
    return out + _covered(judged)


def _covered(results: list[SLAResult]) -> list[SLAResult]:
    """Each inconclusive SLA of ``COVERS`` whose stand-in was measured in the same
    experiment, marked ``covered`` by it (its note says so)."""
    measured = {r.name: r for r in results if r.measured is not None}
    out = []
    for r in results:
        by = measured.get(COVERS.get(r.name, ""))
        if r.result == INCONCLUSIVE and by is not None:
            r = dataclasses.replace(r, covered_by=by.name, note="; ".join(filter(None, [
                r.note, f"judged by {by.name} instead ({by.result})"])))
        out.append(r)
    return out


def _injected(exp: Experiment, metrics: Metrics, faults: list[FaultRecord],
              events: Sequence[Mapping[str, Any]], job_s: float | None) -> list[SLAResult]:
    """``fault_injected[id]`` per fault: it struck at least once (an experiment whose fault
    never fired, or struck no operation, proved nothing), or why not."""
    out = []
    fired = {f.id.split("#")[0] for f in faults if not f.details.get("error")}
    for i, spec in enumerate(exp.faults):
        fid = spec.id
        idle = _struck_nothing(spec, [f for f in faults if f.id.split("#")[0] == fid])
        hit = fid in fired and not idle
        out.append(SLAResult(f"fault_injected[{fid}]", True, hit, hit,
                             idle if fid in fired else _not_fired(exp, i, faults, metrics,
                                                                  events, job_s)))
    return out


def _golden_fault_free(golden: Golden | None) -> list[SLAResult]:
    """A golden run that needed restarts: a finding about the stack itself, whatever the
    faults showed."""
    restarted = getattr(golden, "restarts", 0) or 0
    if not restarted:
        return []
    failures = list(getattr(golden, "failures", ()) or ())
    return [SLAResult(
        "golden_run_fault_free", 0, restarted, False,
        f"the fault-free golden run needed {restarted} restart(s)"
        + (f": {failures[-1]}" if failures else "")
        + "; the stack restarts without any fault (not cached: the next run measures again)")]


def _struck_nothing(spec: Any, records: list[FaultRecord]) -> str:
    """Why a storage fault that was set proved nothing: its rule was in force for the whole
    run and hit no operation of the job ('' if it hit one, or if the count is unknown)."""
    if not spec.fault_class.mounts_storage or not records:
        return ""
    undos: list[dict[str, Any]] = [u if isinstance(u := f.details.get("undo"), dict) else {}
                                   for f in records]
    counts = [u.get("num_ops_hit", u.get("num_ops_answered")) for u in undos]
    if any(not isinstance(c, int) or c > 0 for c in counts):
        return ""
    where = records[0].details.get("storage") or "the checkpoint directory"
    if records[0].details.get("nfs"):  # stale_shared_fs: a node's view, no rule
        return (f"{records[0].details.get('node')}'s view of {where} answered no operation "
                f"in the whole run: none of its processes looked at the checkpoints while it "
                f"was in force")
    ops = ", ".join(getattr(spec.params, "ops", ()) or ("write",))
    return (f"set on {where}, but it struck no operation in the whole run: the job did no "
            f"matching {ops} there while it was in force; if its checkpoints go elsewhere, "
            f"name that directory as target.checkpoint_dir")



def _not_fired(exp: Experiment, index: int, faults: list[FaultRecord], metrics: Metrics,
               events: Sequence[Mapping[str, Any]], job_s: float | None) -> str:
    """Why fault ``index`` was never injected: the injection failed, or the run ended before
    its trigger (the step, the time, the event or the first seeded arrival) was reached."""
    spec = exp.faults[index]
    failed = [f.details["error"] for f in faults
              if f.id.split("#")[0] == spec.id and f.details.get("error")]
    if failed:
        return f"the trigger fired but the injection failed: {failed[0]}"
    in_rank = next((e for e in events if e.get("kind") == "fault_failed"
                    and str(e.get("fault_id", "")).split("#")[0] == spec.id), None)
    if in_rank is not None:  # a planned fault that a rank could not strike (fault_failed)
        return f"it failed in rank {in_rank.get('rank')}: {in_rank.get('error')}"
    t = spec.trigger
    ran = f"{job_s:.1f} s" if job_s is not None else None
    if t.at_step is not None:
        if metrics.max_step < t.at_step:
            return (f"trigger never reached: the run ended at step {metrics.max_step}, before "
                    f"at_step {t.at_step}" + (f" (after {ran})" if ran else ""))
        return (f"step {t.at_step} was reached but no injection was recorded: a fault planned "
                f"in the ranks never reported striking (no fault_injected event for "
                f"{spec.id!r}), or the job ended before faultlab could fire it")
    if t.at_time_s is not None and job_s is not None and job_s < t.at_time_s:
        return (f"trigger never reached: the run ended at {ran}, before at_time_s "
                f"{t.at_time_s:g} s (trigger earlier, or run longer)")
    if t.after_event is not None:
        want = t.after_event
        seen = sum(1 for e in events if e.get("kind") == want.kind
                   and all(k in e and e[k] == v for k, v in want.match.items()))
        if seen < want.count:
            matching = f" matching {dict(want.match)}" if want.match else ""
            return (f"trigger never reached: the run ended after {seen} {want.kind} event"
                    f"{'' if seen == 1 else 's'}{matching}, before the {_nth(want.count)}")
    if t.every is not None and job_s is not None:
        arrivals = arrival_times_s(exp, index)
        if not arrivals or arrivals[0] > job_s:
            first = f"at {arrivals[0]:.1f} s" if arrivals else "within the run"
            return (f"trigger never reached: the first seeded arrival ({first}) came after "
                    f"the run ended at {ran}")
    return "the trigger fired but no injection was recorded"


def _nth(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
