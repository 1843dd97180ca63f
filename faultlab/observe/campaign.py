"""A failure campaign scored: every injection, the golden run's false positives, ETTR against
its projection. Pure functions of event records and fault records; they never raise on what a
killed job leaves behind.

Per injection at time ``T`` (``FaultRecord.injected_t``), with ``T_next`` the next injection's
time (``inf`` for the last). The per-fault metrics of :mod:`faultlab.observe.timeline` are
computed first; then:

detected, detected_by, detection_latency_s
    The timeline's first reaction record (an unclean exit, an anomaly, a preemption notice, a
    new process, an in-process rollback) if it came before ``T_next``; a reaction after the
    next fault struck is that fault's to claim, so this one counts as undetected.
attributed
    Did the job name the victim? The victim ranks are those of the record's target (``rank N``;
    ``node N``: ranks ``N·procs_per_node`` .. ``+procs_per_node−1``; ``details["ranks"]``
    when the fault lists them). The *named* ranks, in this order, are read from the records in
    ``(T, end)``, ``end`` = the job's came-back record (the restart) or ``T_next``, whichever
    is first:

    1. *silent ranks* (level 0 sees no more than this): ranks whose process at ``T`` (the
       one of the rank's last step in the 30 s before ``T``) wrote no record in the window
       (a record of the rank's next process, a restart's, does not count, nor a late record
       of a step the job had reached at ``T``), while another rank recorded an unclean exit
       there. A rank that died without a word is the
       first to fail (a SIGKILLed rank writes nothing; its peers exit with "Connection closed
       by peer").
    2. ranks the trainer's records name: ``straggler_rank`` of a straggler anomaly, the
       ``ranks`` list of an exit or anomaly (the reference trainer's lost GPU);
    3. the first rank to fail: the rank of each unclean exit record in time order (not one
       whose reason starts with ``peer_``: the reference trainer's word for "a peer's fault"),
       and a rank named in a gloo/NCCL error text (``rank 3``).

    ``attributed`` is True iff the first named rank is a victim, False if another rank is named
    first or none is named, None (*not attributable*) if the fault struck every rank (``all``,
    or a node holding every rank) or was not detected. What level 0 can and cannot attribute:
    it can name a rank that died (rule 1) or whose own error it caught (rule 3); it cannot
    name the source of a fault every rank sees alike — a NaN gradient or a loss spike under
    FSDP2, whose global norm is the same on every rank, a hang that only the watchdog or a
    timeout ends (every rank times out) — nor a straggler (only a trainer that times its own
    forward can, rule 2).
recovered, recovery_time_s, lost_steps
    Not measured (False, None, None) for an undetected injection: what followed it is the
    next fault's. A fault the job absorbed in place (did not go down) is recovered, time not
    measured; one that took the job down is recovered iff the timeline measured its recovery
    time (back at the step reached before it). lost_steps: the timeline's. A fault the job
    noticed and trained through (a step record after the detection and before ``T_next``, and
    no came-back record before ``T_next``) did not take the job down: the restart after
    ``T_next`` is the next fault's.
at_step, at_s
    The planned step (step clock; ``at_s`` is then measured: seconds after the job's first
    record), or the planned arrival in seconds after the launch (wall clock, ``at_step``
    None).
compound, compound_reasons
    True if at ``T`` the job was recovering from an earlier injection (it went down at or
    before ``T`` and was not yet back at its step: ``T_k + recovery_time_k > T``, or never
    came back), an earlier reversible injection was still in force (not yet undone), or a
    checkpoint save was under way: one that completed (a ``checkpoint_saved`` record at
    ``t >= T`` whose ``t − seconds <= T``), one that failed (a ``checkpoint_save_failed`` or
    ``checkpoint_save_hung`` anomaly likewise), or one that never reported anything (a wall-clock
    injection after rank 0's record of a checkpoint step ``N`` — a multiple of
    ``checkpoint_every`` in a job that records saves — with no record of rank 0 between that
    step and ``T``, and ``T`` within twice the longest save the job recorded (+ 1 s) of that
    step: rank 0 was saving step ``N`` when it was struck). A step-clock injection at
    a checkpoint step is not "during the save": the step gate holds it before the save begins.

Campaign level:

detection_rate
    Detected ÷ injected (an injection that raised ``FaultError`` was not injected).
attribution_accuracy
    Attributed ÷ attributable (detected injections whose ``attributed`` is not None); None if
    none is attributable.
recovery_time_p95_s (and p50)
    Nearest-rank percentile of ``recovery_time_s`` over the injections that took the job down,
    an unrecovered one counting as infinite (so ≥ 5 % unrecovered makes the p95 infinite:
    ``None`` in JSON, and the SLA fails).
false_positives_per_hour
    The golden run (same job, no fault) scored as a campaign: every ``anomaly``, every unclean
    ``exit`` and every restart (a rank-0 ``start`` beyond the first) there is a false
    positive; their count ÷ the golden run's wall hours (``wall_s`` of its records).
ettr
    The campaign run's goodput (:mod:`faultlab.observe.metrics`): committed step time ÷ wall
    time.
projected_ettr
    What the analytic model of :mod:`faultlab.report.projection` predicts for the same failure
    rate, from the costs the isolated injections measured (compound ones are left out, as a
    single-fault experiment never sees them): on the wall clock, failures arrive every
    ``mtbf_s`` of wall time, lost time included: ``golden_ettr · (1 − p_down · L / mtbf_s)``
    (at least 0); on the step clock, every ``mtbf_steps`` steps of progress, i.e. every
    ``M = mtbf_steps × step time`` of useful time, so each ``M`` costs ``p_down · L`` more:
    ``golden_ettr / (1 + p_down · L / M)``,
    with ``golden_ettr`` the golden run's goodput (start-up and checkpoint stalls included),
    ``p_down`` the fraction of isolated injections that took the job down, ``L = R + τ/2``,
    ``R`` the median resume time of those (fault → training again), ``τ`` the checkpoint
    interval (``checkpoint_every`` × this run's median step time, the speed at which
    ``mtbf_steps`` also turns into seconds). None if no isolated
    injection took the job down and none was absorbed. ``ettr_gap`` = projected − measured:
    what isolated experiments miss.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from faultlab.observe.metrics import compute_metrics
from faultlab.observe.records import (
    CLEAN_EXITS,
    FaultRecord,
    Record,
    _float,
    _int,
    _json_safe,
    _key,
    _one_start_per_process,
    _step,
)
from faultlab.observe.timeline import FaultMetrics, _Timeline

__all__ = ["CampaignScore", "InjectionScore", "TypeScore", "false_positives",
           "golden_step_time_s", "nearest_rank", "score_campaign"]

SILENT_LOOKBACK_S = 30.0
"""A rank counts as alive at ``T`` if it recorded a step this many seconds before."""

OWN_DEVICE_ANOMALIES = frozenset({"gpu_oom", "accelerator_error"})
"""``anomaly.what`` values with which a rank reports its own device failing (the trainer's
event vocabulary: the anomaly, not the fault that may have caused it), so it names that rank."""

_RANK_IN_TEXT = re.compile(r"\brank[ =:]?(\d+)\b", re.IGNORECASE)


@dataclass(slots=True)
class InjectionScore:
    """One injection, scored (definitions: module docstring)."""

    fault_id: str
    type: str
    target: str
    at_s: float | None
    """Wall clock: the planned arrival, seconds after the launch; step clock: measured,
    seconds after the job's first record."""
    injected: bool
    error: str | None = None
    detected: bool = False
    detected_by: str | None = None
    detection_latency_s: float | None = None
    victim_ranks: list[int] = field(default_factory=list)
    named_ranks: list[int] = field(default_factory=list)
    attributed: bool | None = None
    went_down: bool = False
    recovered: bool = False
    recovery_time_s: float | None = None
    resume_time_s: float | None = None
    lost_steps: int | None = None
    compound: bool = False
    compound_reasons: list[str] = field(default_factory=list)
    at_step: int | None = None
    """Step clock: the planned step (it struck right after it)."""


@dataclass(slots=True)
class TypeScore:
    """The injections of one fault type, aggregated."""

    type: str
    injections: int
    detected: int
    detection_rate: float | None
    attributable: int
    attributed: int
    attribution_accuracy: float | None
    went_down: int
    recovered: int
    recovery_time_p50_s: float | None
    recovery_time_p95_s: float | None
    lost_steps: int
    compound: int


@dataclass(slots=True)
class CampaignScore:
    """A campaign, scored (definitions: module docstring)."""

    injections: list[InjectionScore]
    per_type: list[TypeScore]
    scheduled: int
    injected: int
    detection_rate: float | None
    attribution_accuracy: float | None
    recovery_time_p50_s: float | None
    recovery_time_p95_s: float | None
    lost_steps: int
    compound: int
    ettr: float | None
    golden_ettr: float | None
    projected_ettr: float | None
    ettr_gap: float | None
    projection_inputs: dict[str, Any]
    false_positives: int
    false_positives_per_hour: float | None
    false_positive_signals: list[str]
    golden_wall_s: float

    def to_dict(self) -> dict[str, Any]:
        return _json_safe(asdict(self))

    def metric(self, key: str) -> float | None:
        """The measured value of campaign SLA ``key`` (infinite p95 stays infinite)."""
        return getattr(self, key)


def nearest_rank(values: Sequence[float], q: float) -> float | None:
    """The ``q``-quantile by nearest rank (an observed value); None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)), 1) - 1]


def golden_step_time_s(events: Iterable[Record]) -> float | None:
    """Median ``step_time_s`` of rank 0's steps in a fault-free run (step 1, warm-up, left
    out); for records without it (a level-0 trainer's), the median gap between rank 0's
    consecutive step records; None with fewer than two steps."""
    steps = sorted((r for r in events if r.get("kind") == "step" and r.get("rank") == 0
                    and _float(r.get("t")) is not None), key=lambda r: r["t"])
    times = [t for r in steps if r.get("step") != 1
             and (t := _float(r.get("step_time_s"))) is not None]
    if not times:
        times = [b["t"] - a["t"] for a, b in zip(steps, steps[1:], strict=False)]
    return statistics.median(times) if times else None


def false_positives(events: Iterable[Record]) -> list[str]:
    """Every detection, restart or anomaly of a fault-free run, described."""
    out = []
    pids: set[Any] = set()  # rank 0's processes: each one after the first is a restart
    records = _one_start_per_process([r for r in events if _float(r.get("t")) is not None])
    for r in sorted(records, key=lambda r: r["t"]):
        kind = r.get("kind")
        if kind == "anomaly":
            out.append(f"anomaly:{r.get('what')} (rank {r.get('rank')}, step {r.get('step')})")
        elif kind == "exit" and _key(r.get("reason")) not in CLEAN_EXITS:
            out.append(f"exit:{r.get('reason')} (rank {r.get('rank')})")
        elif kind == "start" and r.get("rank") == 0 and _key(r.get("pid")) not in pids:
            if pids:
                out.append(f"restart (rank 0 started again, restart {r.get('restart')})")
            pids.add(_key(r.get("pid")))
    return out


def score_campaign(events: Sequence[Record], faults: Sequence[FaultRecord], *,
                   procs_per_node: int, world_size: int, mtbf_s: float | None,
                   checkpoint_every: int, golden_events: Sequence[Record],
                   mtbf_steps: float | None = None, scheduled: int | None = None,
                   planned: Mapping[str, Any] | None = None) -> CampaignScore:
    """Score every injection of ``faults`` against ``events`` (module docstring).

    ``planned``: fault id → its arrival (``faultlab.spec.campaign.Planned``: ``at_step`` on
    the step clock, ``at_s`` on the wall clock). Exactly one of ``mtbf_s``, ``mtbf_steps``."""
    timeline = _Timeline(events)
    records = timeline.records
    t_first = timeline.ts[0] if timeline.ts else None
    ordered = sorted(faults, key=lambda f: f.injected_t)
    struck = [f for f in ordered if not (f.details or {}).get("error")]
    metrics = {f.id: timeline.analyse(f) for f in struck}
    scores: list[InjectionScore] = []
    for f in ordered:
        arrival = (planned or {}).get(f.id)
        at_step = getattr(arrival, "at_step", None)
        at_s = getattr(arrival, "at_s", None)
        if at_s is None and t_first is not None:
            at_s = round(f.injected_t - t_first, 3)
        error = (f.details or {}).get("error")
        s = InjectionScore(fault_id=f.id, type=f.type, target=f.target, at_s=at_s,
                           at_step=at_step,
                           injected=not error, error=str(error) if error else None,
                           victim_ranks=_victims(f, procs_per_node, world_size))
        if error:
            scores.append(s)
            continue
        i = struck.index(f)
        next_t = struck[i + 1].injected_t if i + 1 < len(struck) else math.inf
        m = metrics[f.id]
        s.compound_reasons = _compound(f, struck[:i], metrics, records, checkpoint_every,
                                       step_gated=at_step is not None)
        s.compound = bool(s.compound_reasons)
        if m.detection_t is not None and m.detection_t < next_t:
            s.detected, s.detected_by = True, m.detected_by
            s.detection_latency_s = m.detection_latency_s
            end = min(next_t, m.came_back_t if m.came_back_t is not None else math.inf)
            s.named_ranks = _named(records, f.injected_t, end)
            if s.victim_ranks and len(s.victim_ranks) < world_size:
                s.attributed = bool(s.named_ranks) and s.named_ranks[0] in s.victim_ranks
        if not s.detected:  # whatever followed is the next fault's to claim
            m.went_down, m.recovery_time_s, m.resume_time_s, m.lost_steps = False, None, None, None
        elif _trained_through(m, next_t, records):
            m.went_down, m.recovery_time_s, m.resume_time_s, m.lost_steps = False, None, None, 0
        s.went_down = m.went_down
        s.recovery_time_s, s.resume_time_s = m.recovery_time_s, m.resume_time_s
        s.recovered = s.detected and ((not m.went_down) or m.recovery_time_s is not None)
        s.lost_steps = m.lost_steps
        scores.append(s)

    run = compute_metrics(events, list(faults))
    golden = compute_metrics(golden_events, [])
    signals = false_positives(golden_events)
    golden_h = golden.wall_s / 3600
    # The rate is per step (step clock) and the interval is in steps: both turn into seconds
    # at the speed this run trained at (the golden run may have run on a quieter machine).
    step_s = golden_step_time_s(events) or golden_step_time_s(golden_events)
    projected, inputs = _projection(scores, golden.goodput, mtbf_s, mtbf_steps,
                                    checkpoint_every, step_s)
    done = [s for s in scores if s.injected]
    p50, p95 = _recovery(done)
    return CampaignScore(
        injections=scores, per_type=_per_type(done),
        scheduled=len(faults) if scheduled is None else scheduled, injected=len(done),
        detection_rate=_rate(sum(s.detected for s in done), len(done)),
        attribution_accuracy=_rate(sum(s.attributed is True for s in done),
                                   sum(s.attributed is not None for s in done)),
        recovery_time_p50_s=p50, recovery_time_p95_s=p95,
        lost_steps=sum(s.lost_steps or 0 for s in done),
        compound=sum(s.compound for s in done),
        ettr=run.goodput, golden_ettr=golden.goodput, projected_ettr=projected,
        ettr_gap=(None if projected is None or run.goodput is None
                  else round(projected - run.goodput, 4)),
        projection_inputs=inputs, false_positives=len(signals),
        false_positives_per_hour=len(signals) / golden_h if golden_h > 0 else None,
        false_positive_signals=signals, golden_wall_s=golden.wall_s)


# --- pieces ---------------------------------------------------------------------------------

def _rate(num: int, den: int) -> float | None:
    return round(num / den, 4) if den else None


def _victims(f: FaultRecord, procs_per_node: int, world_size: int) -> list[int]:
    listed = (f.details or {}).get("ranks")
    if isinstance(listed, list) and listed:
        return sorted({r for r in map(_int, listed) if r is not None})
    kind, _, value = f.target.partition(" ")
    if kind == "all":
        return list(range(world_size))
    n = _int(int(value)) if value.isdigit() else None
    if n is None:
        return []
    if kind == "rank":
        return [n]
    if kind == "node":
        return [r for r in range(n * procs_per_node, (n + 1) * procs_per_node)
                if r < world_size]
    return []


def _trained_through(m: FaultMetrics, next_t: float, records: Sequence[Record]) -> bool:
    """Did the job go on training after noticing, until the next fault struck (whose restart
    the timeline would otherwise charge to this one)?"""
    if not m.went_down or m.detection_t is None or m.came_back_t is None:
        return False
    if m.came_back_t < next_t:
        return False
    return any(m.detection_t < r["t"] < next_t and _step(r) is not None for r in records)


def _named(records: Sequence[Record], start_t: float, end_t: float) -> list[int]:
    """The ranks the job named in ``(start_t, end_t)``, in the order of the docstring."""
    window = [r for r in records if start_t < r["t"] < end_t]
    # A rank is silent if the process it trained in wrote nothing more: its next incarnation
    # (a restart's health check or start record, inside the window) is another process.
    # Each rank's process at ``start_t``: the one of its last step (an earlier incarnation's
    # steps in the look-back are a dead process's, not a silent one's).
    last: dict[Any, Any] = {}
    for r in records:
        if start_t - SILENT_LOOKBACK_S <= r["t"] <= start_t and _step(r) is not None:
            last[_int(r.get("rank"))] = _key(r.get("pid"))
    alive = set(last.items())
    # The step the job had reached at ``start_t``: a rank that was a moment behind reports
    # that step just after (the fault struck any rank once one reported it); the record is
    # of work done before the fault, not a sign of having noticed it.
    reached = max((n for r in records if r["t"] <= start_t
                   and r.get("kind") == "step" and (n := _step(r)) is not None), default=None)
    spoke = {(_int(r.get("rank")), _key(r.get("pid"))) for r in window
             if not (r.get("kind") == "step" and reached is not None
                     and (_step(r) or 0) <= reached)}
    failed = [r for r in window if r.get("kind") == "exit"
              and _key(r.get("reason")) not in CLEAN_EXITS]
    out: list[int] = []

    def add(rank: Any) -> None:
        n = _int(rank)
        if n is not None and n not in out:
            out.append(n)

    if failed:
        for rank in sorted({r for r, _pid in alive - spoke if r is not None}):
            add(rank)
    for r in window:
        kind = r.get("kind")
        if kind not in ("anomaly", "exit"):
            continue
        if kind == "anomaly" and r.get("what") == "straggler":
            add(r.get("straggler_rank"))
        listed = r.get("ranks")
        if isinstance(listed, list):
            for rank in listed:
                add(rank)
        reason = _key(r.get("reason")) if kind == "exit" else _key(r.get("what"))
        text = str(r.get("error") or "")
        if kind == "exit" and reason not in CLEAN_EXITS and not listed and not (
                isinstance(reason, str) and reason.startswith("peer_")):
            add(r.get("rank"))  # the first rank to fail, whatever its error says
        if kind == "anomaly" and reason in OWN_DEVICE_ANOMALIES:
            add(r.get("rank"))
        for m in _RANK_IN_TEXT.finditer(text):
            add(m[1])
    return out


def _compound(f: FaultRecord, earlier: Sequence[FaultRecord],
              metrics: Mapping[str, FaultMetrics], records: Sequence[Record],
              checkpoint_every: int, *, step_gated: bool) -> list[str]:
    T = f.injected_t
    out = []
    for e in earlier:
        m = metrics[e.id]
        if m.went_down and (m.detection_t is not None and m.detection_t <= T) and (
                m.recovery_time_s is None or e.injected_t + m.recovery_time_s > T):
            out.append(f"during the recovery from {e.id}")
        elif e.undone_t is not None and e.undone_t > T:
            out.append(f"while {e.id} was in force")
    saving = _save_under_way(T, records, checkpoint_every, step_gated=step_gated)
    if saving:
        out.append(saving)
    return out


def _save_under_way(T: float, records: Sequence[Record], checkpoint_every: int, *,
                    step_gated: bool) -> str | None:
    """The save that was under way at ``T`` (module docstring, ``compound``), described."""
    for r in records:
        if r["t"] < T:
            continue
        kind, what = r.get("kind"), r.get("what")
        failed = kind == "anomaly" and what in ("checkpoint_save_failed", "checkpoint_save_hung")
        if kind != "checkpoint_saved" and not failed:
            continue
        seconds = _float(r.get("seconds"))
        if seconds is not None and r["t"] - seconds <= T:
            return f"during the save of step {r.get('step')}" + (
                " (it failed)" if failed else "")
    took = [x for r in records if r.get("kind") == "checkpoint_saved"
            and (x := _float(r.get("seconds"))) is not None]
    if step_gated or checkpoint_every < 1 or not took:
        return None
    last = None  # rank 0's last record before T
    for r in records:
        if r["t"] >= T:
            break
        if r.get("rank") == 0:
            last = r
    step = _step(last) if last is not None and last.get("kind") == "step" else None
    if last is None or step is None or step % checkpoint_every or \
            T - last["t"] > 2 * max(took) + 1.0:
        return None  # not a checkpoint step, or too long after it for its save to be running
    if any(r.get("kind") in ("checkpoint_saved", "anomaly") and _step(r) == step
           and r["t"] < T for r in records):
        return None
    return f"during the save of step {step} (never completed)"


def _recovery(done: Sequence[InjectionScore]) -> tuple[float | None, float | None]:
    down = [s.recovery_time_s if s.recovery_time_s is not None else math.inf
            for s in done if s.went_down]
    return nearest_rank(down, 0.5), nearest_rank(down, 0.95)


def _per_type(done: Sequence[InjectionScore]) -> list[TypeScore]:
    out = []
    for kind in sorted({s.type for s in done}):
        mine = [s for s in done if s.type == kind]
        p50, p95 = _recovery(mine)
        attributable = [s for s in mine if s.attributed is not None]
        out.append(TypeScore(
            type=kind, injections=len(mine), detected=sum(s.detected for s in mine),
            detection_rate=_rate(sum(s.detected for s in mine), len(mine)),
            attributable=len(attributable), attributed=sum(s.attributed is True for s in mine),
            attribution_accuracy=_rate(sum(s.attributed is True for s in mine),
                                       len(attributable)),
            went_down=sum(s.went_down for s in mine), recovered=sum(s.recovered for s in mine),
            recovery_time_p50_s=p50, recovery_time_p95_s=p95,
            lost_steps=sum(s.lost_steps or 0 for s in mine),
            compound=sum(s.compound for s in mine)))
    return out


def _projection(scores: Sequence[InjectionScore], golden_ettr: float | None,
                mtbf_s: float | None, mtbf_steps: float | None, checkpoint_every: int,
                step_s: float | None) -> tuple[float | None, dict[str, Any]]:
    isolated = [s for s in scores if s.injected and not s.compound]
    down = [s for s in isolated if s.went_down]
    resumes = [s.resume_time_s for s in down if s.resume_time_s is not None]
    inputs: dict[str, Any] = {"isolated_injections": len(isolated), "went_down": len(down),
                              "golden_ettr": golden_ettr, "step_time_s": step_s,
                              "clock": "steps" if mtbf_steps is not None else "seconds"}
    if mtbf_steps is not None:
        inputs["mtbf_steps"] = mtbf_steps
        mtbf_s = mtbf_steps * step_s if step_s is not None else None
    inputs["mtbf_s"] = None if mtbf_s is None else round(mtbf_s, 3)
    if not isolated or golden_ettr is None or step_s is None or mtbf_s is None or (
            down and not resumes):
        return None, inputs
    p_down = len(down) / len(isolated)
    restart_s = statistics.median(resumes) if resumes else 0.0
    interval_s = checkpoint_every * step_s
    lost_s = restart_s + interval_s / 2
    inputs.update(p_down=round(p_down, 4), restart_s=round(restart_s, 3),
                  interval_s=round(interval_s, 3), lost_per_failure_s=round(lost_s, 3))
    if mtbf_steps is not None:  # failures per unit of progress: the lost time adds on
        return round(golden_ettr / (1 + p_down * lost_s / mtbf_s), 4), inputs
    return round(max(0.0, golden_ettr * (1 - p_down * lost_s / mtbf_s)), 4), inputs
