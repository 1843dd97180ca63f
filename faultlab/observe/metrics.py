"""The experiment metrics of DESIGN.md, computed from event records and fault records.

Pure functions: :func:`compute_metrics` takes the records of a job's event stream (any order,
any subset of optional fields) and what faultlab injected, and never raises on what a killed
or broken job leaves behind. ``None`` always means *not measured*; why is stated per metric.

Definitions (records are first sorted by ``t``; a record without a finite numeric ``t`` is
ignored; a "step record" is a record of kind ``step`` with an integer ``step``, skipped steps
included). For each fault injected at time ``T``:

high_water_step ``H``
    The highest ``step`` of any step record with ``t <= T``; 0 if none.

Process classification (relative to ``T``)
    A pid is *seen* if it has a record with ``t <= T``. A process is *new* (started after the
    fault) unless its pid is seen or its ``start`` record's ``t_main`` (wall clock when its
    ``main`` began) is ``<= T``: a process already running at ``T`` but still starting up is not
    a reaction. (``t_process_created`` is not used: psutil derives it from the boot time in
    whole seconds, and it was seen ~1 s off the ``time.time()`` clock of ``t``.) A process was
    *training* at ``T`` if its ``start`` record has ``t <= T`` (if it has no start record at
    all: if its pid is seen).

Reaction records (``t > T``)
    ``exit`` with ``reason`` not in {completed, stopped}; any ``anomaly``; any
    ``preemption_notice``; ``start`` of a new
    process; ``checkpoint_loaded`` of a new process or of a process training at ``T`` (an
    in-process rollback).

came-back records (``t > T``)
    ``start`` of a new process and ``checkpoint_loaded`` counted as a reaction. (The reference
    trainer loads before it emits ``start``, so a restarted group usually comes back at its
    ``checkpoint_loaded``.)

detection_latency_s
    ``t`` of the first reaction record − ``T``; None if the job never noticed.

came_back_t, resumed_from_step
    ``t`` of the first came-back record. resumed_from_step is the minimum, over the came-back
    records from that one up to (not including) the first step record after it — all of them
    if none follows — of ``start.resumed_from_step`` / ``checkpoint_loaded.step``.

went_down
    True if the job came back, or if it noticed and never reported a step after noticing
    (killed, aborted, out of restarts). A reaction it trained through (an anomaly with
    ``action: skip``) is noticed but not down.

resume_time_s
    ``t`` of the first *progress record* after the came-back record − ``T``. A progress record
    is a step record, or an ``exit`` with reason completed/stopped (a job that resumed at its
    last step has nothing left to run). None if the job did not go down, or went down and
    never made progress again.

recovery_time_s
    ``t`` of the first progress record after the came-back record that is a step record with
    ``step >= H``, or a clean ``exit`` whose ``step`` (if present) is ``>= H``, − ``T``. None
    under the same conditions as resume_time_s.

lost_steps
    ``max(0, H − resumed_from_step)`` if the job came back; 0 if it did not go down; None if it
    went down and never came back, or the came-back records carry no step.

emergency_checkpoint_s, emergency_checkpoint_before_deadline
    Only for a fault whose details carry a ``deadline_t`` (a preemption notice): ``t`` of the
    first ``checkpoint_saved`` record with ``t > T`` marked ``emergency`` (written by rank 0 once
    the checkpoint is committed) − ``T``, and whether that ``t`` is ``<= deadline_t``. None and
    False if no emergency checkpoint was committed; both None for other faults.

Run-level:

completes
    The last rank-0 ``exit`` has reason completed, and, counting only records since the latest
    ``start`` record of any rank (the final incarnation; all records if there is none), that
    exit is among them, a ``final_digest`` is among them, and every ``exit`` among them is
    completed or stopped.
final_digest
    ``digest`` of the last ``final_digest`` record; None if there is none.
restarts
    Number of rank-0 ``start`` records − 1 (0 if none). Only a new process emits ``start``; an
    in-process rollback is not a restart.
max_step
    Highest ``step`` of any step record; 0 if none.
committed trajectory
    For each step number up to the step of the last rank-0 step record, the last rank-0 step
    record with that number (what the final timeline's rank 0 actually kept; replayed steps
    replace the originals, and steps beyond the last one, rolled back and never redone, drop
    out). ``steps_committed`` is its length (skipped steps included).
goodput
    Sum of ``step_time_s`` over the committed trajectory (a skipped step, or one without
    ``step_time_s``, counts 0) ÷ ``wall_s``; None if ``wall_s`` is 0.
wall_s
    ``t`` of the last record − ``t`` of the first record; 0.0 for fewer than two records.
samples_exactly_once
    None if there is no committed step or a committed record lacks a valid ``samples``
    ``[start, stop)``. Otherwise True iff (1) the committed steps are exactly 1..N, (2) their
    ``samples`` ranges, sorted by start, tile ``[first start, last stop)`` with neither gap nor
    overlap, and (3) for each committed step with world size ``W``, taking the last record per
    rank of that step with world size ``W``, the ``local_samples`` slices present lie inside
    the step's range and are pairwise disjoint, and when ranks ``0..W-1`` all have one their
    union is the whole range. (A rank without a record or without ``local_samples`` is not
    held against the step: a SIGKILL can lose a rank's last line.)
corrupt_checkpoint_never_loaded
    None unless some fault's details list the checkpoint directories it damaged
    (``details["checkpoints"]``: the storage faults). Otherwise False iff a ``checkpoint_loaded``
    record names one of those paths after the fault struck and before the job wrote a fresh
    checkpoint to the same path (a ``checkpoint_saved`` with that path) — a replayed run may
    legitimately save and later load a new checkpoint under the old name.
world_sizes
    The world sizes of the ``start`` records in time order, consecutive repeats collapsed
    (e.g. ``[3, 2]`` after a node loss); from all records if there are no start records.
straggler_detected_s
    Only for faults that slow ranks down (``collective_delay``, ``network_throttle``): ``t`` of
    the first ``anomaly`` with ``what: straggler`` after ``T`` whose ``straggler_rank`` is one
    of the fault's ranks (``details["ranks"]``, else the ``rank N`` of its target) − ``T``;
    None if none named it.

emergency_checkpoint_s, emergency_checkpoint_before_deadline (run level)
    The worst over the faults with a deadline (max seconds; False if any was False); None if
    no fault had a deadline.
slowdown
    Only for slowing faults: rank 0's median ``step_time_s`` while the fault was in force
    (``T`` to its undo) over its median before ``T`` (warm-up steps left out); None with fewer
    than 3 steps before or none during. Run level: the worst (max) over the slowing faults.
straggler_detected_within_s (run level)
    The worst (max) ``straggler_detected_s`` over the slowing faults; None if there is none or
    any of them was never named.
detection_latency_s, resume_time_s, recovery_time_s, lost_steps
    The worst (max) over the faults. For resume, recovery and lost steps the result is None
    if any fault went down and its value is None (unmeasurable); faults that did not go down
    are left out. With no measured value: None for the times, 0 for lost_steps.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["FaultMetrics", "FaultRecord", "Metrics", "compute_metrics"]

CLEAN_EXITS = frozenset({"completed", "stopped"})
SLOWING_FAULTS = frozenset({"collective_delay", "network_throttle"})
"""Fault types that make a rank a straggler (``straggler_detected_s`` is measured for them)."""

Record = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class FaultRecord:
    """One fault as the engine injected it (the input to the metrics)."""

    id: str
    """The fault's id in the experiment (unique within a run)."""
    type: str
    """The fault's type, e.g. ``rank_kill``."""
    injected_t: float
    """Wall-clock time (``time.time()``, like the events' ``t``) at which it was injected."""
    undone_t: float | None = None
    """When ``undo`` ran; None if it was not (yet) undone or has nothing to undo."""
    target: str = ""
    """What it hit, in words: ``rank 1``, ``node node0``."""
    details: dict[str, Any] = field(default_factory=dict)
    """What ``inject`` returned (pids, signal ...), for the journal."""

    def to_dict(self) -> dict[str, Any]:
        return _json_safe(asdict(self))


@dataclass(slots=True)
class FaultMetrics:
    """The metrics of one fault (definitions: module docstring)."""

    fault_id: str
    type: str
    injected_t: float
    high_water_step: int
    """``H``: the highest step reached at or before the injection."""
    went_down: bool
    """The job came back from it, or stopped training because of it."""
    detection_t: float | None = None
    detected_by: str | None = None
    """The first reaction: ``kind`` or ``kind:reason`` / ``kind:what``, and the rank."""
    came_back_t: float | None = None
    resumed_from_step: int | None = None
    detection_latency_s: float | None = None
    resume_time_s: float | None = None
    recovery_time_s: float | None = None
    lost_steps: int | None = 0
    emergency_checkpoint_s: float | None = None
    emergency_checkpoint_before_deadline: bool | None = None
    straggler_detected_s: float | None = None
    slowdown: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return _json_safe(asdict(self))


@dataclass(slots=True)
class Metrics:
    """Run-level metrics (definitions: module docstring). ``None`` means not measured."""

    completes: bool
    final_digest: str | None
    restarts: int
    max_step: int
    steps_committed: int
    wall_s: float
    goodput: float | None
    samples_exactly_once: bool | None
    world_sizes: list[int]
    corrupt_checkpoint_never_loaded: bool | None
    detection_latency_s: float | None
    resume_time_s: float | None
    recovery_time_s: float | None
    lost_steps: int | None
    emergency_checkpoint_s: float | None = None
    emergency_checkpoint_before_deadline: bool | None = None
    straggler_detected_within_s: float | None = None
    slowdown: float | None = None
    checkpoints_all_finite: bool | None = None
    """Not from events: set by the engine when it read the checkpoints back after the run."""
    faults: list[FaultMetrics] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return _json_safe(asdict(self))


# --- field access that never raises -----------------------------------------------------------

def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _range(value: Any) -> tuple[int, int] | None:
    if not isinstance(value, list | tuple) or len(value) != 2:
        return None
    start, stop = _int(value[0]), _int(value[1])
    if start is None or stop is None or stop < start:
        return None
    return start, stop


def _step(record: Record) -> int | None:
    return _int(record.get("step")) if record.get("kind") == "step" else None


def _key(value: Any) -> Any:
    """``value`` if it can be a dict key or set member, else None (a garbled pid or rank)."""
    try:
        hash(value)
    except TypeError:
        return None
    return value


def _is_clean_exit(record: Record) -> bool:
    return record.get("kind") == "exit" and _key(record.get("reason")) in CLEAN_EXITS


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, str | int | bool):
        return value
    return repr(value)


# --- per fault -------------------------------------------------------------------------------

class _Timeline:
    """The sorted records and the per-process facts every fault's analysis needs."""

    def __init__(self, events: Iterable[Record]) -> None:
        records = [r for r in events if isinstance(r, Mapping) and _float(r.get("t")) is not None]
        records.sort(key=lambda r: r["t"])
        self.records = records
        self.ts = [float(r["t"]) for r in records]
        self.start_t: dict[Any, float] = {}  # pid -> t of its first start record
        self.main_t: dict[Any, float] = {}  # pid -> t_main: the process existed by then
        for r in records:
            pid = _key(r.get("pid"))
            if r.get("kind") == "start" and pid is not None:
                self.start_t.setdefault(pid, r["t"])
                t_main = _float(r.get("t_main"))
                if t_main is not None:
                    self.main_t.setdefault(pid, t_main)

    def analyse(self, fault: FaultRecord) -> FaultMetrics:
        T = float(fault.injected_t)
        split = bisect.bisect_right(self.ts, T)
        before, after = self.records[:split], self.records[split:]
        high_water = max((s for s in map(_step, before) if s is not None), default=0)
        seen = {_key(r.get("pid")) for r in before} - {None}

        def is_new(pid: Any) -> bool:
            t_main = self.main_t.get(pid)
            return pid not in seen and not (t_main is not None and t_main <= T)

        def was_training(pid: Any) -> bool:
            started = self.start_t.get(pid)
            return started <= T if started is not None else pid in seen

        def came_back(r: Record) -> bool:
            kind, pid = r.get("kind"), _key(r.get("pid"))
            if kind == "start":
                return is_new(pid)
            return kind == "checkpoint_loaded" and (is_new(pid) or was_training(pid))

        def reacted(r: Record) -> bool:
            kind = r.get("kind")
            return ((kind == "exit" and _key(r.get("reason")) not in CLEAN_EXITS)
                    or kind in ("anomaly", "preemption_notice") or came_back(r))

        m = FaultMetrics(fault_id=fault.id, type=fault.type, injected_t=T,
                         high_water_step=high_water, went_down=False)
        deadline = _float((fault.details or {}).get("deadline_t"))
        if deadline is not None:
            saved = next((r for r in after if r.get("kind") == "checkpoint_saved"
                          and r.get("emergency") is True), None)
            m.emergency_checkpoint_before_deadline = False
            if saved is not None:
                m.emergency_checkpoint_s = float(saved["t"]) - T
                m.emergency_checkpoint_before_deadline = float(saved["t"]) <= deadline
        if fault.type in SLOWING_FAULTS:
            victims = _victim_ranks(fault)
            named = next((r for r in after if r.get("kind") == "anomaly"
                          and r.get("what") == "straggler"
                          and _int(r.get("straggler_rank")) in victims), None)
            if named is not None:
                m.straggler_detected_s = float(named["t"]) - T
            m.slowdown = _slowdown(before, after, fault.undone_t)
        detect_i = next((i for i, r in enumerate(after) if reacted(r)), None)
        if detect_i is None:
            return m  # nobody noticed: not down, nothing lost
        detection = after[detect_i]
        m.detection_t = float(detection["t"])
        m.detection_latency_s = m.detection_t - T
        m.detected_by = _describe(detection)

        back_i = next((i for i in range(detect_i, len(after)) if came_back(after[i])), None)
        if back_i is None:
            stepped_on = any(_step(r) is not None for r in after[detect_i + 1:])
            m.went_down = not stepped_on
            m.lost_steps = None if m.went_down else 0
            return m

        m.went_down = True
        m.came_back_t = float(after[back_i]["t"])
        rest = after[back_i + 1:]
        first_step = next((i for i, r in enumerate(rest) if _step(r) is not None), len(rest))
        resumed = [_resumed_step(r) for r in [after[back_i], *rest[:first_step]] if came_back(r)]
        resumed_known = [s for s in resumed if s is not None]
        m.resumed_from_step = min(resumed_known) if resumed_known else None
        m.lost_steps = (max(0, high_water - m.resumed_from_step)
                        if m.resumed_from_step is not None else None)

        progress = [r for r in rest if _step(r) is not None or _is_clean_exit(r)]
        if progress:
            m.resume_time_s = float(progress[0]["t"]) - T
        for r in progress:
            step = _step(r) if r.get("kind") == "step" else _int(r.get("step"))
            if (r.get("kind") == "exit" and step is None) or (step is not None
                                                              and step >= high_water):
                m.recovery_time_s = float(r["t"]) - T
                break
        return m


def _victim_ranks(fault: FaultRecord) -> set[int]:
    ranks = (fault.details or {}).get("ranks")
    if isinstance(ranks, list):
        return {r for r in map(_int, ranks) if r is not None}
    kind, _, value = fault.target.partition(" ")
    return {int(value)} if kind == "rank" and value.isdigit() else set()


def _resumed_step(record: Record) -> int | None:
    key = "resumed_from_step" if record.get("kind") == "start" else "step"
    return _int(record.get(key))


def _describe(record: Record) -> str:
    kind = str(record.get("kind"))
    detail = record.get("reason") if kind == "exit" else record.get("what")
    text = f"{kind}:{detail}" if detail is not None else kind
    rank = record.get("rank")
    return f"{text} (rank {rank})" if rank is not None else text


# --- run level -------------------------------------------------------------------------------

def _committed(records: list[Record]) -> dict[int, Record]:
    """The committed trajectory: step number -> the rank-0 step record that stands."""
    trajectory: dict[int, Record] = {}
    last = 0
    for r in records:
        step = _step(r)
        if step is None or r.get("rank") != 0:
            continue
        trajectory[step] = r
        last = step
    return {s: r for s, r in sorted(trajectory.items()) if s <= last}


def _corrupt_never_loaded(records: list[Record], faults: list[FaultRecord]) -> bool | None:
    damaged = [(str(path), f.injected_t) for f in faults
               for path in (f.details.get("checkpoints") or []) if isinstance(path, str)]
    if not damaged:
        return None
    for path, struck_t in damaged:
        rewritten_t = min((r["t"] for r in records if r.get("kind") == "checkpoint_saved"
                           and r.get("path") == path and r["t"] > struck_t), default=math.inf)
        if any(r.get("kind") == "checkpoint_loaded" and r.get("path") == path
               and struck_t < r["t"] < rewritten_t for r in records):
            return False
    return True


def _samples_exactly_once(records: list[Record], committed: dict[int, Record]) -> bool | None:
    if not committed:
        return None
    ranges: dict[int, tuple[int, int]] = {}
    for step, r in committed.items():
        rng = _range(r.get("samples"))
        if rng is None:
            return None
        ranges[step] = rng
    if list(committed) != list(range(1, len(committed) + 1)):
        return False
    spans = sorted(ranges.values())
    for (_, stop), (start, _) in zip(spans, spans[1:], strict=False):
        if start != stop:
            return False  # a gap, or a sample counted twice

    # Every rank's slice of every committed step, from the incarnation that committed it.
    slices: dict[int, dict[Any, Record]] = {s: {} for s in committed}
    for r in records:
        n = _step(r)
        if n in slices and r.get("world_size") == committed[n].get("world_size"):
            slices[n][_key(r.get("rank"))] = r  # sorted by t: the last record per rank wins
    for n, by_rank in slices.items():
        lo, hi = ranges[n]
        world_size = _int(committed[n].get("world_size"))
        parts = {rank: _range(r.get("local_samples")) for rank, r in by_rank.items()}
        present = sorted(p for p in parts.values() if p is not None)
        if not present:
            continue
        if present[0][0] < lo or max(stop for _, stop in present) > hi:
            return False
        if any(b[0] < a[1] for a, b in zip(present, present[1:], strict=False)):
            return False  # two ranks trained on the same sample
        complete = world_size is not None and all(
            parts.get(rank) is not None for rank in range(world_size))
        if complete and sum(b - a for a, b in present) != hi - lo:
            return False
    return True


def _world_sizes(records: list[Record]) -> list[int]:
    starts = [r for r in records if r.get("kind") == "start"] or records
    sizes: list[int] = []
    for r in starts:
        ws = _int(r.get("world_size"))
        if ws is not None and (not sizes or sizes[-1] != ws):
            sizes.append(ws)
    return sizes


def _step_times(records: list[Record]) -> list[float]:
    """Rank 0's ``step_time_s`` of its steps among ``records`` (a restart's first step is
    warm-up and left out, as is step 1)."""
    out, warm = [], set()
    for r in records:
        if r.get("kind") == "start" and r.get("rank") == 0:
            warm.add(r.get("pid"))
        if r.get("kind") == "step" and r.get("rank") == 0 and not r.get("skipped"):
            seconds = _float(r.get("step_time_s"))
            if r.get("pid") in warm:
                warm.discard(r.get("pid"))
            elif seconds is not None and r.get("step") != 1:
                out.append(seconds)
    return out


def _slowdown(before: list[Record], after: list[Record], undone_t: float | None) -> float | None:
    """Median step time while the fault was in force over the median before it."""
    during = [r for r in after if undone_t is None or r["t"] <= undone_t]
    base, slow = _step_times(before), _step_times(during)
    if len(base) < 3 or not slow or statistics.median(base) <= 0:
        return None
    return round(statistics.median(slow) / statistics.median(base), 3)


def _completes(records: list[Record]) -> bool:
    rank0_exits = [r for r in records if r.get("kind") == "exit" and r.get("rank") == 0]
    if not rank0_exits or rank0_exits[-1].get("reason") != "completed":
        return False
    last_start_t = max((r["t"] for r in records if r.get("kind") == "start"), default=None)
    final = records if last_start_t is None else [r for r in records if r["t"] >= last_start_t]
    return ((last_start_t is None or rank0_exits[-1]["t"] >= last_start_t)
            and any(r.get("kind") == "final_digest" for r in final)
            and all(_is_clean_exit(r) for r in final if r.get("kind") == "exit"))


def _worst(values: list[Any], unmeasurable: bool) -> Any:
    if unmeasurable:
        return None
    known = [v for v in values if v is not None]
    return max(known) if known else None


def compute_metrics(events: Iterable[Record], faults: Iterable[FaultRecord]) -> Metrics:
    """The metrics of one run from its event records and the faults injected into it."""
    timeline = _Timeline(events)
    records = timeline.records
    per_fault = [timeline.analyse(f) for f in sorted(faults, key=lambda f: f.injected_t)]

    committed = _committed(records)
    useful_s = sum(_float(r.get("step_time_s")) or 0.0 for r in committed.values()
                   if not r.get("skipped"))
    wall_s = timeline.ts[-1] - timeline.ts[0] if records else 0.0
    digests = [r for r in records if r.get("kind") == "final_digest"]
    digest = digests[-1].get("digest") if digests else None
    rank0_starts = sum(1 for r in records if r.get("kind") == "start" and r.get("rank") == 0)

    def worst(name: str) -> Any:
        down = [f for f in per_fault if f.went_down]
        unmeasurable = any(getattr(f, name) is None for f in down)
        return _worst([getattr(f, name) for f in down], unmeasurable)

    lost = worst("lost_steps")
    with_deadline = [f for f in per_fault if f.emergency_checkpoint_before_deadline is not None]
    slowing = [f.straggler_detected_s for f in per_fault if f.type in SLOWING_FAULTS]
    slowdowns = [f.slowdown for f in per_fault if f.type in SLOWING_FAULTS]
    emergency_s = [f.emergency_checkpoint_s for f in with_deadline]
    return Metrics(
        completes=_completes(records),
        final_digest=digest if isinstance(digest, str) else None,
        restarts=max(0, rank0_starts - 1),
        max_step=max((s for s in map(_step, records) if s is not None), default=0),
        steps_committed=len(committed),
        wall_s=wall_s,
        goodput=useful_s / wall_s if wall_s > 0 else None,
        samples_exactly_once=_samples_exactly_once(records, committed),
        world_sizes=_world_sizes(records),
        corrupt_checkpoint_never_loaded=_corrupt_never_loaded(records, faults),
        detection_latency_s=_worst([f.detection_latency_s for f in per_fault], False),
        resume_time_s=worst("resume_time_s"),
        recovery_time_s=worst("recovery_time_s"),
        lost_steps=0 if lost is None and not any(f.went_down for f in per_fault) else lost,
        emergency_checkpoint_s=_worst(emergency_s, None in emergency_s),
        emergency_checkpoint_before_deadline=(
            all(f.emergency_checkpoint_before_deadline for f in with_deadline)
            if with_deadline else None),
        straggler_detected_within_s=_worst(slowing, None in slowing),
        slowdown=_worst(slowdowns, None in slowdowns) if slowdowns else None,
        faults=per_fault,
    )
