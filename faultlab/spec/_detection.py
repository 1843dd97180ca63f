"""What the detection SLAs ask of the rest of an experiment (``Experiment``'s ``expect`` check).

- ``detected_by`` names declared signals (or ``anomaly:<what>``, the trainer's own records);
- a detection SLA on a trainer that writes no records of its own (``target.command``: faultlab
  cannot tell a level-0 command from one that writes anomaly records before it runs) needs a
  declared signal, or ``detected_by`` naming an ``anomaly:`` one;
- ``detection_attributed`` needs a counted signal that can name a rank or a node
  (``DetectionSignal.names``; the trainer's anomaly records can, where they count);
- an SLA that asks for the detection of a fault needs a fault that slows the job or corrupts
  silently (``Fault.slows_job``, ``Fault.corrupts_silently``).
"""

from __future__ import annotations

from typing import Any

from pydantic_core import InitErrorDetails

from faultlab.sla.detection import DETECTION_KEYS
from faultlab.spec._base import choices, did_you_mean, spec_error
from faultlab.spec.observation import ObserveSpec
from faultlab.spec.target import TargetSpec

__all__: list[str] = []

ASKS_FOR_FAULT = DETECTION_KEYS - {"false_alarms"}
"""The detection SLAs measured from a fault's onset (``false_alarms`` needs no fault)."""


def detection_problems(expect: Any, target: TargetSpec | None, observe: ObserveSpec | None,
                       faults: tuple[Any, ...] | None) -> list[InitErrorDetails]:
    observe = observe or ObserveSpec()
    asked = [k for k, _ in expect.items() if k in DETECTION_KEYS]
    errors = _named(expect, observe)
    if not asked or errors:
        return errors
    declared = observe.detections
    by = expect.detected_by
    anomalies = [n for n in by or () if n.startswith("anomaly:")]
    if target is not None and target.command and not declared and not anomalies:
        errors.append(spec_error((asked[0],), (
            f"{asked[0]} asks whether the team's monitors notice, but your trainer "
            f"(target.command) writes no records faultlab reads as a detection and "
            f"observe.detections declares no signal: declare one, e.g. observe: {{detections: "
            f"[{{name: spike, log_pattern: 'loss spike at step (?P<step>\\\\d+)'}}]}} (or "
            f"exit_code, node_excluded, file)"), getattr(expect, asked[0])))
    if expect.detection_attributed is not None:
        errors += _attributable(expect, target, declared, by)
    fault_keys = [k for k in asked if k in ASKS_FOR_FAULT]
    if fault_keys and faults is not None and not any(
            f.fault_class.slows_job or f.fault_class.corrupts_silently for f in faults):
        types = ", ".join(sorted({f.type for f in faults})) or "none"
        errors += [spec_error((k,), (
            f"{k} asks for the detection of a fault, but no fault of this experiment slows the "
            f"job or corrupts silently (faults: {types}); add one (e.g. sdc, gpu_slow, "
            f"collective_delay), or drop {k}: a fault that raises an error is judged by "
            f"detection_latency_s"), getattr(expect, k)) for k in fault_keys]
    return errors


def _named(expect: Any, observe: ObserveSpec) -> list[InitErrorDetails]:
    names = [s.name for s in observe.detections]
    return [spec_error(("detected_by", i), (
        f"{n!r} is no declared signal; declared: {choices(names) if names else 'none'}, or "
        f"anomaly:<what> for the trainer's own anomaly records{did_you_mean(n, names)}"), n)
        for i, n in enumerate(expect.detected_by or ())
        if n not in names and not n.startswith("anomaly:")]


def _attributable(expect: Any, target: TargetSpec | None, declared: tuple[Any, ...],
                  by: tuple[str, ...] | None) -> list[InitErrorDetails]:
    counted = [(i, s) for i, s in enumerate(declared) if by is None or s.name in by]
    anomalies = any(n.startswith("anomaly:") for n in by) if by is not None else \
        target is not None and not target.command
    if anomalies or any(s.names for _, s in counted):
        return []
    blind = "; ".join(f"{s.name!r} (observe.detections[{i}].{s.source}) names nobody"
                      + (": its pattern has no (?P<rank>...) or (?P<node>...) group"
                         if s.log_pattern is not None else ": a file says something fired, "
                         "not where") for i, s in counted) or "no signal is counted"
    return [spec_error(("detection_attributed",), (
        f"detection_attributed needs a signal that can name a rank or a node; {blind}. Add a "
        f"(?P<rank>\\d+) or (?P<node>\\S+) group to a log_pattern, count an exit_code or "
        f"node_excluded signal (they name the node), or drop detection_attributed"), True)]
