"""The verdict of one run: every SLA of ``expect`` against the measured metrics, the final
digest against the golden run's, and whether each fault was injected at all.

``judge`` returns one ``SLAResult`` per check; the run passes when every one of them does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from faultlab.judge.slas import SLA_KINDS, SLAS
from faultlab.observe import FaultRecord, Metrics
from faultlab.spec import Experiment

__all__ = ["Golden", "SLAResult", "judge"]


class Golden(Protocol):
    """What the judge needs of a golden run (the engine's ``GoldenRun``): its final digest."""

    @property
    def digest(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class SLAResult:
    name: str
    bound: Any
    measured: Any
    passed: bool
    note: str = ""

    def describe(self) -> str:
        kind = SLA_KINDS.get(self.name, "bool")
        op = {"max": "<=", "min": ">=", "bool": "=="}[kind]
        measured = "not measured" if self.measured is None else repr(self.measured)
        return f"{self.name}: measured {measured}, required {op} {self.bound!r}" + \
            (f" ({self.note})" if self.note else "")


def judge(exp: Experiment, metrics: Metrics, golden: Golden | None, *,
          timed_out: bool, faults: list[FaultRecord]) -> list[SLAResult]:
    """Every SLA of ``expect`` against the measured metrics, plus the implicit check that each
    fault was injected at least once (an experiment whose fault never fired proved nothing)."""
    out = []
    fired = {f.id.split("#")[0] for f in faults if not f.details.get("error")}
    for spec in exp.faults:
        fid = spec.id
        out.append(SLAResult(f"fault_injected[{fid}]", True, fid in fired, fid in fired,
                             "" if fid in fired else "the trigger never fired or the "
                                                     "injection failed"))
    values = metrics.to_dict()
    if golden is not None and metrics.final_digest is not None and golden.digest is not None:
        values["bitwise_equal_to_golden"] = metrics.final_digest == golden.digest
    for name, bound in exp.expect.items():
        sla = SLAS[name]
        measured = values.get(sla.metric)
        note = ""
        if name == "bitwise_equal_to_golden" and golden is None:
            note = "no golden run"
        if name == "completes" and timed_out:
            measured, note = False, f"timed out after {exp.run.timeout_s:g} s"
        if measured is None:
            note = note or "not measured: the run ended without the events it needs"
        passed = measured is not None and sla.holds(measured, bound)
        out.append(SLAResult(name, bound, measured, passed, note))
    return out
