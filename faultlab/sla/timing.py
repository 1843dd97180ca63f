"""Time bounds a team can carry between machines: seconds relative to the job's own fault-free
timings, measured in the same run on the same target.

A bound in seconds (``resume_time_s: 40``) is a claim about one machine: the same stack takes
twice as long to restart on a machine half as fast, and a gate written on a fast one turns red
on a slow CI runner with no change to the stack (or, set loose enough for the slowest, hides a
regression on the fastest). Every SLA whose unit is seconds may instead be written in the job's
own units::

    resume_time_s: {cold_starts: 2.5}              # 2.5 times the job's launch-to-first-step
    heal_time_s: {step_times: 20}                  # 20 fault-free steps
    recovery_time_s: {cold_starts: 2, step_times: 10}
    requeue_latency_s: {s: 11, cold_starts: 1}     # a configured timer, plus one start

The bound is the sum of its terms. ``s`` is the part that is a configured timer (SlurmdTimeout,
a watchdog, a rendezvous keep-alive): absolute by nature, on every machine the same.

The units (:class:`TimingUnits`) are measured per run, on the run's own target, by
``faultlab.observe.timing``: a **cold start** is the launch of the job to its first completed
step; a **step time** is the median time between consecutive steps. Both come from the run's own
fault-free start, before any fault struck, so the bound moves with the load the run itself met;
where a fault struck before the run had shown them, from its fault-free golden run. A bound
whose unit could not be measured is not measured, never passed.

The verdict gives both the seconds and the ratio (:func:`in_units`) for every bound in
seconds, written either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["UNIT_TERMS", "RelativeSeconds", "TimingUnits", "bound_text", "in_units"]

UNIT_TERMS = {"cold_starts": "cold start", "step_times": "step time"}
"""The relative terms of a bound, and what one of each is called."""


class RelativeSeconds(BaseModel):
    """A bound in seconds, as multiples of the job's own fault-free timings plus a fixed part."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    s: float = Field(0.0, ge=0, allow_inf_nan=False,
                     description="Fixed seconds: a configured timer (a watchdog, SlurmdTimeout).")
    cold_starts: float = Field(0.0, ge=0, allow_inf_nan=False,
                               description="Times the run's launch-to-first-step.")
    step_times: float = Field(0.0, ge=0, allow_inf_nan=False,
                              description="Times the run's median fault-free step time.")

    @model_validator(mode="after")
    def _relative(self) -> RelativeSeconds:
        if not (self.cold_starts > 0 or self.step_times > 0):
            fixed = f"{self.s:g}" if self.s > 0 else "<seconds>"
            raise ValueError(f"a relative bound needs cold_starts or step_times > 0; a bound of "
                             f"fixed seconds is written as a number ({fixed})")
        return self

    def terms(self) -> dict[str, float]:
        """The terms that are set, as written (``{"cold_starts": 2.5}``)."""
        return {k: v for k, v in self.model_dump().items() if v}

    def seconds(self, units: TimingUnits | None) -> float | None:
        """The bound in seconds on the run with ``units`` (None: a unit it needs is unknown)."""
        total = self.s
        for term, per in (("cold_starts", "cold_start_s"), ("step_times", "step_s")):
            k = getattr(self, term)
            if k:
                unit = getattr(units, per, None) if units is not None else None
                if unit is None or not math.isfinite(unit):
                    return None
                total += k * unit
        return total

    def __str__(self) -> str:
        parts = [f"{self.s:g} s"] if self.s else []
        parts += [f"{v:g} {UNIT_TERMS[k]}{'' if v == 1 else 's'}"
                  for k, v in self.terms().items() if k in UNIT_TERMS]
        return " + ".join(parts)


@dataclass(frozen=True, slots=True)
class TimingUnits:
    """One run's fault-free timings: the units of its relative bounds."""

    cold_start_s: float | None
    """Launch to the first completed step (None: not seen)."""
    step_s: float | None
    """Median time between consecutive fault-free steps (None: fewer than two seen)."""
    cold_start_from: str = ""
    """Where ``cold_start_s`` was measured: ``this run`` or ``the golden run``."""
    step_from: str = ""

    def describe(self) -> str:
        parts = []
        if self.cold_start_s is not None:
            parts.append(f"cold start {self.cold_start_s:.2f} s ({self.cold_start_from}'s "
                         f"launch to first step)")
        if self.step_s is not None:
            parts.append(f"step time {self.step_s:.3f} s ({self.step_from}'s median)")
        return "; ".join(parts) or "no fault-free start or step measured"

    def to_dict(self) -> dict[str, Any]:
        return {"cold_start_s": self.cold_start_s, "step_s": self.step_s,
                "cold_start_from": self.cold_start_from, "step_from": self.step_from}


def in_units(seconds: float, units: TimingUnits | None) -> str:
    """``seconds`` as cold starts (and step times where the run has no cold start): the ratio
    that carries between machines ('' when neither unit is known)."""
    if units is None or not math.isfinite(seconds):
        return ""
    if units.cold_start_s:
        return f"{seconds / units.cold_start_s:.2f} cold starts"
    if units.step_s:
        return f"{seconds / units.step_s:.1f} step times"
    return ""


def bound_text(bound: Any, limit: float | None) -> str:
    """A bound as the verdict shows it: as written, and in seconds when written relative."""
    if isinstance(bound, dict) and set(bound) <= {"s", *UNIT_TERMS}:
        written = str(RelativeSeconds(**bound))
        return f"{written} = {limit:.2f} s" if limit is not None else \
            f"{written} (unit not measured)"
    return str(bound)
