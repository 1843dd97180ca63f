"""The verdict of one run: every SLA of ``expect`` against the measured metrics, the final
digest against the golden run's, and whether each fault was injected at all.

``judge`` returns one ``SLAResult`` per check; the run passes when every one of them does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from faultlab.judge.slas import SLA_KINDS, SLAS
from faultlab.observe import FaultRecord, Metrics
from faultlab.observe.final_state import FinalState, first_difference
from faultlab.spec import Experiment

__all__ = ["Golden", "SLAResult", "judge"]


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

    def describe(self) -> str:
        kind = SLA_KINDS.get(self.name, "bool")
        op = {"max": "<=", "min": ">=", "bool": "=="}[kind]
        measured = "not measured" if self.measured is None else repr(self.measured)
        return f"{self.name}: measured {measured}, required {op} {self.bound!r}" + \
            (f" ({self.note})" if self.note else "")


def judge(exp: Experiment, metrics: Metrics, golden: Golden | None, *,
          timed_out: bool, faults: list[FaultRecord],
          events: Sequence[Mapping[str, Any]] = (),
          final_state: FinalState | None = None) -> list[SLAResult]:
    """Every SLA of ``expect`` against the measured metrics, plus the implicit check that each
    fault was injected at least once (an experiment whose fault never fired proved nothing).

    ``events`` and ``final_state`` (a job judged by its final checkpoint) only sharpen the
    notes: which tensor differs first from the golden run, which damaged checkpoint was loaded
    at which step, why the bitwise verdict could not be measured."""
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
            if not metrics.max_step:
                note += " without reaching a single step (see the nodes' logs)"
        if name == "bitwise_equal_to_golden":
            note = _bitwise_note(measured, golden, final_state) or note
        if name == "corrupt_checkpoint_never_loaded" and measured is False:
            note = _loaded_damage(faults, events) or note
        if name == "detection_latency_s" and measured is None and fired and \
                not any(f.went_down or f.detection_latency_s is not None
                        for f in metrics.faults):
            note = note or "not measured: the job never noticed the fault (no error, restart, " \
                           "anomaly or exit after it)"
        if measured is None:
            note = note or "not measured: the run ended without the events it needs"
        passed = measured is not None and sla.holds(measured, bound)
        out.append(SLAResult(name, bound, measured, passed, note))
    return out


def _bitwise_note(measured: Any, golden: Golden | None, final: FinalState | None) -> str:
    """Why the bitwise verdict is what it is, where a checkpoint read-back says more."""
    if measured is None:
        for side, state in (("this run", final), ("the golden run", golden)):
            reason = getattr(state, "not_measured", None)
            if reason:
                return f"not measured: {reason} ({side})"
        return ""
    ours, theirs = (final.tensors if final else {}), (getattr(golden, "tensors", None) or {})
    if measured is False and ours and theirs:
        differs = first_difference(ours, theirs)
        return f"first differing tensor: {differs}" if differs else ""
    return ""


def _loaded_damage(faults: list[FaultRecord], events: Sequence[Mapping[str, Any]]) -> str:
    """Which checkpoint a storage fault damaged the job then loaded: file, offset and step."""
    for f in faults:
        damaged = set(f.details.get("checkpoints") or [])
        for e in events:
            if e.get("kind") == "checkpoint_loaded" and e.get("path") in damaged and \
                    float(e.get("t") or 0) > f.injected_t:
                hits = [h for key in ("flips", "truncated", "zeroed") for h in
                        (f.details.get(key) or []) if isinstance(h, dict)]
                where = "; ".join(f"{h.get('file')} at offset {h.get('offset')}"
                                  for h in hits[:3]) or ", ".join(map(str, f.details.get(
                                      "deleted") or [])) or "its files"
                return (f"rank {e.get('rank')} loaded {e.get('path')} (step {e.get('step')}) "
                        f"after {f.id} ({f.type}) damaged {where}, and trained on")
    return ""
