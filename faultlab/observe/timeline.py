"""Per-fault metrics: what one fault did to the job, read from the job's event records.

``_Timeline`` sorts the records once and holds the per-process facts; ``_Timeline.analyse``
measures one fault against them. :func:`faultlab.observe.metrics.compute_metrics` aggregates
the results over a run's faults.

Definitions (records are first sorted by ``t``; a record without a finite numeric ``t`` is
ignored; a "step record" is a record of kind ``step`` with an integer ``step``, skipped steps
included). For each fault injected at time ``T``:

high_water_step ``H``
    The highest ``step`` of any step record with ``t <= T``; 0 if none.

Process classification (relative to ``T``)
    A pid is *seen* if it has a record with ``t <= T``. A process is *new* (started after the
    fault) unless its pid is seen or its ``start`` record's ``t_main`` (wall clock when its
    ``main`` began) is ``<= T``: a process already running at ``T`` but still starting up is not
    a reaction. A process was *training* at ``T`` if its ``start`` record has ``t <= T`` (if it
    has no start record at all: if its pid is seen).

Reaction records (``t > T``)
    ``exit`` with ``reason`` not in {completed, stopped}; any ``anomaly``; any
    ``preemption_notice``; ``start`` of a new
    process; ``checkpoint_loaded`` of a new process or of a process training at ``T`` (an
    in-process rollback).

The launcher's respawn (a reaction at a time no record carries)
    A new process's ``start`` record is written only once it has imported torch and set up
    (seconds after the launcher started it), yet the launcher reacted when it *created* the
    process: its ``t_process_created`` (the kernel's start time of the process, read by the
    process itself from ``/proc/self/stat`` against ``CLOCK_BOOTTIME``: 10 ms resolution, the
    same wall clock as ``t``). A new process whose ``t_process_created`` is ``> T`` is a
    reaction at that time. With no survivor (one rank, or a whole node's ranks killed) it is
    the first sign there is; it needs nothing of the launcher, whichever launcher it is.

detection_source
    What the first reaction was, whatever wrote it: ``error_exit`` (a rank left with an
    error: a survivor's failed collective, or a restarted rank failing again), ``anomaly``
    (the trainer's own detector), ``preemption_notice``, ``launcher_respawn`` (a new process
    created, above), ``restart_record`` (a new process's ``start`` or ``checkpoint_loaded``,
    without a creation time), ``rollback`` (a ``checkpoint_loaded`` of a process training at
    ``T``).

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

resumed_from_steps, resumed_by_rank
    The distinct steps of those same came-back records, sorted, and what each rank resumed
    from (its first such record): ``{rank: {"step": S, "node": N}}``; None if none carries a
    step. More than one step: the ranks of one restart loaded different checkpoints
    (``same_resume_point``).

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
    ``max(0, H − resumed_from_step)`` if the job came back; 0 if it did not go down and made
    progress after ``T`` (a step record, or a clean ``exit``); None if it went down and never
    came back, the came-back records carry no step, or nothing progressed after the fault (a
    job hung until faultlab stopped it: what the fault cost it is unknown, not 0).

emergency_checkpoint_s, emergency_checkpoint_before_deadline
    Only for a fault whose details carry a ``deadline_t`` (a preemption notice): ``t`` of the
    first ``checkpoint_saved`` record with ``t > T`` marked ``emergency`` (written by rank 0 once
    the checkpoint is committed) − ``T``, and whether that ``t`` is ``<= deadline_t``. None and
    False if no emergency checkpoint was committed; both None for other faults.
straggler_detected_s
    Only for faults that slow ranks down (their class declares ``slows_job``): ``t`` of
    the first ``anomaly`` with ``what: straggler`` after ``T`` whose ``straggler_rank`` is one
    of the fault's ranks (``details["ranks"]``, else the ``rank N`` of its target) − ``T``;
    None if none named it.
slowdown
    Only for slowing faults (``slows_job``): rank 0's median ``step_time_s`` while the
    fault was in force (``T`` to its undo) over its median before ``T`` (warm-up steps left
    out); None with fewer than 3 steps before or none during. A fault planned for a window
    of steps (``num_steps``; its record's ``details["window_steps"] = [first, last]``) is in
    force for exactly those steps: "during" is the steps numbered ``first..last`` after ``T``
    (a replayed step of the window counts, as it is delayed again), not every step after
    ``T``, which would dilute a 12-step window with the rest of a 40-step run. Run level: the
    worst (max) over the slowing faults.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from faultlab.observe.records import (
    CLEAN_EXITS,
    FaultRecord,
    Record,
    _float,
    _int,
    _is_clean_exit,
    _json_safe,
    _key,
    _one_start_per_process,
    _step,
)

__all__ = ["FaultMetrics"]


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
    detection_source: str | None = None
    """Where the first reaction was seen (module docstring: ``detection_source``)."""
    came_back_t: float | None = None
    resumed_from_step: int | None = None
    resumed_from_steps: list[int] | None = None
    resumed_by_rank: dict[int, dict[str, Any]] | None = None
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


class _Timeline:
    """The sorted records and the per-process facts every fault's analysis needs."""

    def __init__(self, events: Iterable[Record]) -> None:
        records = [r for r in events if isinstance(r, Mapping) and _float(r.get("t")) is not None]
        records.sort(key=lambda r: r["t"])
        self.records = records = _one_start_per_process(records)
        self.ts = [float(r["t"]) for r in records]
        self.start_t: dict[Any, float] = {}  # pid -> t of its first start record
        self.main_t: dict[Any, float] = {}  # pid -> t_main: the process existed by then
        self.created: dict[Any, tuple[float, Record]] = {}  # pid -> (t_process_created, start)
        for r in records:
            pid = _key(r.get("pid"))
            if r.get("kind") == "start" and pid is not None:
                self.start_t.setdefault(pid, r["t"])
                t_main = _float(r.get("t_main"))
                if t_main is not None:
                    self.main_t.setdefault(pid, t_main)
                created = _float(r.get("t_process_created"))
                if created is not None:
                    self.created.setdefault(pid, (created, r))

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
        if fault.declares("slows_job"):
            victims = _victim_ranks(fault)
            named = next((r for r in after if r.get("kind") == "anomaly"
                          and r.get("what") == "straggler"
                          and _int(r.get("straggler_rank")) in victims), None)
            if named is not None:
                m.straggler_detected_s = float(named["t"]) - T
            m.slowdown = _slowdown(before, after, fault.undone_t,
                                   _window((fault.details or {}).get("window_steps")))
        detect_i = next((i for i, r in enumerate(after) if reacted(r)), None)
        spawned = min(((t, r) for pid, (t, r) in self.created.items()
                       if t > T and is_new(pid)), key=lambda tr: tr[0], default=None)
        if spawned is not None and (detect_i is None or spawned[0] < after[detect_i]["t"]):
            t_spawn, record = spawned
            m.detection_t, m.detection_source = t_spawn, "launcher_respawn"
            m.detected_by = f"process_spawned ({_whose(record)})"
            detect_i = bisect.bisect_right(self.ts, t_spawn) - split  # the records after it
        elif detect_i is None:  # nobody noticed: not down; nothing lost if it trained on
            progressed = any(_step(r) is not None or _is_clean_exit(r) for r in after)
            m.lost_steps = 0 if progressed else None
            return m
        else:
            detection = after[detect_i]
            m.detection_t = float(detection["t"])
            m.detected_by = _describe(detection)
            m.detection_source = _source(detection, is_new(_key(detection.get("pid"))))
        m.detection_latency_s = m.detection_t - T

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
        back = [r for r in [after[back_i], *rest[:first_step]] if came_back(r)]
        resumed_known = [s for s in map(_resumed_step, back) if s is not None]
        m.resumed_from_step = min(resumed_known) if resumed_known else None
        if resumed_known:
            m.resumed_from_steps = sorted(set(resumed_known))
            by_rank: dict[int, dict[str, Any]] = {}
            for r in back:
                rank, step = _int(r.get("rank")), _resumed_step(r)
                if rank is not None and step is not None:
                    by_rank.setdefault(rank, {"step": step, "node": r.get("node")})
            m.resumed_by_rank = dict(sorted(by_rank.items()))
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


def _whose(record: Record) -> str:
    """``rank R, pid P``: the process a start record belongs to."""
    parts = [f"rank {record['rank']}" if record.get("rank") is not None else None,
             f"pid {record['pid']}" if record.get("pid") is not None else None]
    return ", ".join(p for p in parts if p) or "a new process"


def _source(record: Record, new_process: bool) -> str:
    """``detection_source`` of a reaction record (module docstring)."""
    kind = record.get("kind")
    if kind == "exit":
        return "error_exit"
    if kind in ("anomaly", "preemption_notice"):
        return str(kind)
    if kind == "checkpoint_loaded" and not new_process:
        return "rollback"
    return "restart_record"


def _step_times(records: list[Record]) -> list[float]:
    """Rank 0's ``step_time_s`` of its steps among ``records`` (a restart's first step is
    warm-up and left out, as is step 1)."""
    out, warm = [], set()
    for r in records:
        if r.get("kind") == "start" and r.get("rank") == 0:
            warm.add(_key(r.get("pid")))  # a garbled pid may be unhashable: never raise
        if r.get("kind") == "step" and r.get("rank") == 0 and not r.get("skipped"):
            seconds = _float(r.get("step_time_s"))
            if _key(r.get("pid")) in warm:
                warm.discard(_key(r.get("pid")))
            elif seconds is not None and r.get("step") != 1:
                out.append(seconds)
    return out


def _window(value: Any) -> tuple[int, int] | None:
    """A fault's planned step window ``[first, last]``; None when absent or garbled."""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        first, last = _int(value[0]), _int(value[1])
        if first is not None and last is not None and first <= last:
            return first, last
    return None


def _slowdown(before: list[Record], after: list[Record], undone_t: float | None,
              window: tuple[int, int] | None = None) -> float | None:
    """Median step time while the fault was in force over the median before it; with a step
    window, only that window's steps are "while in force" (start records are kept: they mark a
    restart's warm-up step)."""
    during = [r for r in after if (undone_t is None or r["t"] <= undone_t) and (
        window is None or r.get("kind") != "step"
        or ((step := _step(r)) is not None and window[0] <= step <= window[1]))]
    base, slow = _step_times(before), _step_times(during)
    if len(base) < 3 or not slow or statistics.median(base) <= 0:
        return None
    return round(statistics.median(slow) / statistics.median(base), 3)
