"""The bar's run for a team's monitors: the same faults on the reference trainer, its monitors on.

``faultlab run --bar`` sets a team's declared monitors (``observe.detections``) beside the
reference trainer's bar monitors when the experiment injects a fault that corrupts silently or
slows the job (``monitor_bar_applies``). ``monitor_bar_experiment`` builds that second
experiment: the reference trainer (``tiny``; one replica per rank, ``replicate`` = the world
size, so its cross-replica fingerprint compares every rank and names the odd one out by
majority from 3 ranks), the team's topology, steps, timeout and seed, and its faults as
written (the same victims, triggers and magnitudes). It is validated as every experiment is,
so a fault the reference trainer cannot host is refused with the reason and the location in
the team's file; it judges only ``completes`` and ``false_alarms: 0`` (the golden run's
alarms are counted) and declares no signal: the bar's detections are its ``anomaly`` records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from faultlab.errors import InvalidExperimentError
from faultlab.spec._yaml import read_yaml
from faultlab.spec.loader import experiment_from_dict
from faultlab.spec.model import Experiment

__all__ = ["BAR_TRAINER", "monitor_bar_applies", "monitor_bar_experiment"]

BAR_TRAINER = "reference"
"""The trainer whose monitors are the bar."""


def monitor_bar_applies(exp: Experiment) -> str | None:
    """Why ``--bar`` has no monitors of ``exp`` to set beside the bar's; None: it has."""
    if exp.target.trainer == BAR_TRAINER and not exp.target.command:
        return f"{exp.name!r} runs the reference trainer: its monitors are the bar's own"
    if not exp.observe.detections:
        return f"{exp.name!r} declares no monitor of the team's (observe.detections)"
    if not any(f.fault_class.slows_job or f.fault_class.corrupts_silently for f in exp.faults):
        return (f"{exp.name!r} injects no fault that corrupts silently or slows the job "
                f"(sdc, gpu_slow, collective_delay, ...): there is nothing for a monitor to "
                f"notice")
    return None


def monitor_bar_experiment(exp: Experiment, source: Path | None = None) -> Experiment:
    """The bar's experiment for ``exp`` (module docstring). Raises ``InvalidExperimentError``
    when the reference trainer cannot run the same faults, a fault's problem located in
    ``source`` (the team's file) where it has that fault."""
    world = exp.topology.nodes * exp.topology.procs_per_node
    data: dict[str, Any] = {
        "name": f"{exp.name}_bar_monitors",
        "description": f"The faults of {exp.name!r} on the reference trainer, its bar "
                       f"monitors on (faultlab run --bar).",
        "seed": exp.seed,
        "target": {"trainer": BAR_TRAINER, "preset": "tiny",
                   "overrides": {"replicate": world}},
        "topology": exp.topology.model_dump(mode="json", exclude_unset=True),
        "run": exp.run.model_dump(mode="json", exclude_unset=True),
        "faults": [f.model_dump(mode="json", exclude_unset=True) for f in exp.faults],
        "expect": {"completes": True, "false_alarms": 0},
    }
    return experiment_from_dict(data, source, lines=_fault_lines(source))


def _fault_lines(source: Path | None) -> dict[tuple[Any, ...], int]:
    """The lines of the team's ``faults`` in ``source`` (nothing else of it is the bar's)."""
    if source is None:
        return {}
    try:
        doc = read_yaml(Path(source).read_text(), source)
    except (OSError, ValueError, InvalidExperimentError):
        return {}
    return {k: v for k, v in doc.lines.items() if k[:1] == ("faults",)}
