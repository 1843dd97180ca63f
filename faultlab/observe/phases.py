"""Where a recovery's time goes: the recovery time of one fault cut into consecutive phases.

Pure functions over the same event records as :mod:`faultlab.observe.metrics`, whose
per-fault definitions (detection, came back, recovery: :mod:`faultlab.observe.timeline`) they
reuse. For a fault injected at ``T`` the boundaries are, in order (wall clock, seconds):

injected_t
    ``T``, the fault's injection time.
detected_t
    ``T`` + detection_latency_s: the first reaction record (timeline module).
torn_down_t
    The last ``exit`` record, with ``T < t <=`` came_back_t, of an *old* process (a pid with a
    record at or before ``T``): the last of the broken incarnation has gone. A SIGKILLed process
    writes no exit, so this is the last one that could say so.
spawned_t
    The latest ``t_process_created`` of the *new incarnation*: the ``start`` records of new
    pids (none at or before ``T``) written after ``T`` and before the first step record after
    the job came back; if several restarts happened before that step, only those with the
    highest ``restart``. (The launcher's rendezvous is over once every rank is spawned.)
main_t
    The latest ``t_main`` of the new incarnation: the interpreters are up, imports done.
pg_ready_t
    The latest ``t_pg_ready``: the process group is initialised on every rank.
ready_t
    The latest ``t_ready`` (else the ``start`` record's ``t``): model built, checkpoint verified
    and loaded, about to train. Without a new incarnation (an in-process rollback) it is the
    came-back record's ``t`` (its ``checkpoint_loaded``).
recovered_t
    ``T`` + recovery_time_s: back at the highest step reached before the fault.

and the phases are the spans between consecutive boundaries: detection (injected →
detected), teardown (→ torn_down), rendezvous (→ spawned: the agents notice, re-rendezvous and
spawn), process_start (→ main: interpreter start and imports), process_group_init (→
pg_ready), checkpoint_load (→ ready: model build, checkpoint verification and load) and
replay (→ recovered: recomputing the steps lost since the checkpoint).

Each boundary is clamped to be no earlier than the one before it (clocks of different
processes, and ``t_process_created`` read from the kernel, can disagree by milliseconds), so no
phase is negative. A boundary that cannot be measured makes its phase ``None``, and the next
measured phase starts at the last measured boundary: the measured phases always add up to the
recovery time. ``restart_overhead_s`` = ready_t − injected_t is everything but the replay;
the replay depends on the checkpoint interval, the overhead does not.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from faultlab.observe.metrics import FaultRecord, compute_metrics
from faultlab.observe.records import _one_start_per_process

__all__ = ["PHASES", "Phase", "RecoveryBreakdown", "recovery_breakdown"]

PHASES = ("detection", "teardown", "rendezvous", "process_start", "process_group_init",
          "checkpoint_load", "replay")
"""The phases of a recovery, in order."""

BOUNDARIES = ("detected_t", "torn_down_t", "spawned_t", "main_t", "pg_ready_t", "ready_t",
              "recovered_t")
"""The end of each phase of ``PHASES``, in the same order."""

Record = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    start_t: float | None
    end_t: float | None

    @property
    def seconds(self) -> float | None:
        if self.start_t is None or self.end_t is None:
            return None
        return self.end_t - self.start_t


@dataclass(slots=True)
class RecoveryBreakdown:
    """The phases of one fault's recovery (definitions: module docstring)."""

    fault_id: str
    type: str
    injected_t: float
    went_down: bool
    """False: the job trained through the fault (or never noticed it); only detection applies."""
    boundaries: dict[str, float | None] = field(default_factory=dict)
    """``BOUNDARIES`` → wall-clock time after clamping, None if not measured."""
    phases: list[Phase] = field(default_factory=list)
    recovery_time_s: float | None = None
    restart_overhead_s: float | None = None
    """ready_t − injected_t: detection through checkpoint load, the replay left out."""
    new_processes: int = 0
    """Processes of the new incarnation (0: recovered in place, or did not go down)."""

    def seconds(self) -> dict[str, float | None]:
        return {p.name: p.seconds for p in self.phases}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["phases"] = [{"name": p.name, "start_t": p.start_t, "end_t": p.end_t,
                        "seconds": p.seconds} for p in self.phases]
        return d


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _latest(records: list[Record], key: str) -> float | None:
    values = [v for v in (_num(r.get(key)) for r in records) if v is not None]
    return max(values) if values else None


def recovery_breakdown(events: Iterable[Record], fault: FaultRecord) -> RecoveryBreakdown:
    """The recovery phases of ``fault`` from the job's event records (any order)."""
    records = _one_start_per_process(sorted((r for r in events if _num(r.get("t")) is not None),
                                            key=lambda r: float(r["t"])))
    m = compute_metrics(records, [fault]).faults[0]
    T = fault.injected_t
    out = RecoveryBreakdown(fault.id, fault.type, T, m.went_down,
                            recovery_time_s=m.recovery_time_s)
    measured: dict[str, float | None] = dict.fromkeys(BOUNDARIES)
    measured["detected_t"] = m.detection_t
    if m.went_down:
        old_pids = {r.get("pid") for r in records if r["t"] <= T}
        came_back = m.came_back_t if m.came_back_t is not None else math.inf
        measured["torn_down_t"] = max(
            (r["t"] for r in records if r.get("kind") == "exit" and r.get("pid") in old_pids
             and T < r["t"] <= came_back), default=None)
        first_step_t = next((r["t"] for r in records if r.get("kind") == "step"
                             and r["t"] > came_back), math.inf)
        starts = [r for r in records if r.get("kind") == "start" and T < r["t"] <= first_step_t
                  and r.get("pid") not in old_pids]
        if starts:
            last = max((_num(r.get("restart")) or 0.0) for r in starts)
            incarnation = [r for r in starts if (_num(r.get("restart")) or 0.0) == last]
            out.new_processes = len({r.get("pid") for r in incarnation})
            measured["spawned_t"] = _latest(incarnation, "t_process_created")
            measured["main_t"] = _latest(incarnation, "t_main")
            measured["pg_ready_t"] = _latest(incarnation, "t_pg_ready")
            ready = _latest(incarnation, "t_ready")
            measured["ready_t"] = ready if ready is not None else _latest(incarnation, "t")
        elif m.came_back_t is not None:
            measured["ready_t"] = m.came_back_t
        if m.recovery_time_s is not None:
            measured["recovered_t"] = T + m.recovery_time_s

    # Clamp, then cut: a missing boundary leaves its phase unmeasured and the next phase
    # starts at the last boundary that was measured.
    last = T
    for name, boundary in zip(PHASES, BOUNDARIES, strict=True):
        end = measured[boundary]
        if end is None:
            out.boundaries[boundary] = None
            out.phases.append(Phase(name, None, None))
            continue
        end = max(end, last)
        out.boundaries[boundary] = end
        out.phases.append(Phase(name, last, end))
        last = end
        if not m.went_down:  # trained through it: only its detection applies
            break
    while len(out.phases) < len(PHASES):
        name = PHASES[len(out.phases)]
        out.boundaries[BOUNDARIES[len(out.phases)]] = None
        out.phases.append(Phase(name, None, None))
    ready = out.boundaries["ready_t"]
    out.restart_overhead_s = ready - T if ready is not None else None
    return out
