"""When a fault fires: at a step, at a time, after the N-th matching event, or at random.

``every`` fires at the seeded arrival times of ``faultlab.spec.arrival_times_s`` (exponential
gaps with mean ``mtbf_s``), the same offsets the dry run prints. A trigger is evaluated against
the event stream and the seconds since launch; it never reads the clock itself, which keeps it
testable with synthetic streams.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from faultlab.spec import Experiment, arrival_times_s

__all__ = ["TriggerState"]


class _Stream(Protocol):
    def max_step(self) -> int: ...
    def count(self, kind: str, **match: Any) -> int: ...


@dataclass
class TriggerState:
    """The firing schedule of fault ``index`` of ``exp``."""

    exp: Experiment
    index: int
    fired: int = 0
    _arrivals_s: list[float] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.exp.faults[self.index].trigger.every is not None:
            self._arrivals_s = arrival_times_s(self.exp, self.index)

    @property
    def exhausted(self) -> bool:
        if self._arrivals_s is None:
            return self.fired >= 1
        return self.fired >= len(self._arrivals_s)

    def due(self, stream: _Stream, elapsed_s: float) -> bool:
        """True when the fault should fire now; call ``mark_fired`` after firing."""
        if self.exhausted:
            return False
        t = self.exp.faults[self.index].trigger
        if t.at_step is not None:
            return stream.max_step() >= t.at_step
        if t.at_time_s is not None:
            return elapsed_s >= t.at_time_s
        if t.after_event is not None:
            return stream.count(t.after_event.kind, **t.after_event.match) >= t.after_event.count
        assert self._arrivals_s is not None
        return elapsed_s >= self._arrivals_s[self.fired]

    def mark_fired(self) -> None:
        self.fired += 1
