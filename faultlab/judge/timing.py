"""A run's fault-free timings, the units of its relative bounds (``faultlab.sla.timing``).

- **cold start**: the job's launch (the moment the target started it) to its first completed
  step, any rank's.
- **step time**: the median time between consecutive steps of the lowest rank that recorded
  steps, in its first incarnation.

Both are read from the run's own records before its first fault struck, so they carry the load
the run itself met; where a fault struck before the run had shown one (a fault at step 1 or at
a time before the first step), the golden run's (``GoldenRun.cold_start_s``, ``step_s``,
measured the same way on the same target) stands in, unless it ran on other hardware. The
golden run keeps its own, measured by the same functions.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from faultlab.observe.site import other_hardware, run_site
from faultlab.sla.timing import RelativeSeconds, TimingUnits, bound_text, in_units

__all__ = ["RelativeSeconds", "TimingUnits", "bound_text", "cold_start_s", "in_units",
           "step_time_s", "timing_units"]

THIS_RUN, GOLDEN_RUN = "this run", "the golden run"


def _steps(events: Iterable[Mapping[str, Any]], before_t: float) -> list[Mapping[str, Any]]:
    return [e for e in events if e.get("kind") == "step" and isinstance(e.get("t"), int | float)
            and isinstance(e.get("step"), int) and float(e["t"]) < before_t]


def cold_start_s(events: Iterable[Mapping[str, Any]], launched_t: float | None,
                 before_t: float = math.inf) -> float | None:
    """Launch to the first step completed before ``before_t`` (None: none, or no launch time)."""
    if launched_t is None:
        return None
    first = min((float(e["t"]) for e in _steps(events, before_t)), default=None)
    return None if first is None or first <= launched_t else first - launched_t


def step_time_s(events: Iterable[Mapping[str, Any]], before_t: float = math.inf) -> float | None:
    """Median gap between consecutive steps (step n, then n + 1) of the lowest rank, in its
    first incarnation, before ``before_t`` (None: fewer than two such steps)."""
    steps = _steps(events, before_t)
    if not steps:
        return None
    rank = min(int(e.get("rank") or 0) for e in steps)
    mine = [e for e in steps if int(e.get("rank") or 0) == rank]
    first = min(int(e.get("restart") or 0) for e in mine)
    at = {int(e["step"]): float(e["t"]) for e in sorted(mine, key=lambda e: float(e["t"]))
          if int(e.get("restart") or 0) == first}
    gaps = [at[s + 1] - at[s] for s in at if s + 1 in at and at[s + 1] > at[s]]
    return statistics.median(gaps) if gaps else None


def timing_units(events: Sequence[Mapping[str, Any]], launched_t: float | None,
                 faults: Sequence[Any], golden: Any = None) -> TimingUnits:
    """The run's units: from its own records before its first fault (``faults``: what was
    injected, each with ``injected_t``), else from ``golden``'s."""
    before = min((float(f.injected_t) for f in faults), default=math.inf)
    cold, step = cold_start_s(events, launched_t, before), step_time_s(events, before)
    if golden is not None and other_hardware(getattr(golden, "site", None), run_site(events)):
        golden = None  # a reference from other hardware times other hardware
    cold_from = step_from = THIS_RUN
    if cold is None and getattr(golden, "cold_start_s", None) is not None:
        cold, cold_from = golden.cold_start_s, GOLDEN_RUN
    if step is None and getattr(golden, "step_s", None) is not None:
        step, step_from = golden.step_s, GOLDEN_RUN
    return TimingUnits(cold, step, cold_from if cold is not None else "",
                       step_from if step is not None else "")
