"""``observe``: how faultlab reads what a trainer does not report through events.

A level-0 job (your trainer, unchanged) reports its steps and checkpoints through faultlab's
runtime agent but not its loss. ``log_pattern`` is a regular expression with the named groups
``step`` and ``loss``, matched against every line of the nodes' logs (``faultlab.observe.logs``);
it feeds the loss plots and the comparison with the golden run's loss.

``detections`` are the team's own monitors, declared with no code change: each a ``name`` and
exactly one source (``DetectionSignal``). What a signal can name (``DetectionSignal.names``):

- ``log_pattern``: a rank with a ``rank`` group, a node with a ``node`` group, else nobody;
  a ``step`` group gives the step it saw (else the job's highest step when the line appeared);
- ``exit_code``: the node whose launcher or trainer exited with it;
- ``node_excluded``: the node the launcher or Slurm left out or drained;
- ``file``: nobody (a file says that something fired, not where).

``faultlab.observe.detections`` reads them; ``faultlab.sla`` scores them (``expect``).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from faultlab.spec._base import SpecModel, as_tuple, located, show, spec_error

__all__ = ["DETECTION_GROUPS", "LOG_PATTERN_GROUPS", "SOURCES", "DetectionSignal", "ObserveSpec",
           "check_detection_pattern", "check_log_pattern"]

LOG_PATTERN_GROUPS = ("step", "loss")
DETECTION_GROUPS = ("step", "rank", "node")
"""The named groups a detection's ``log_pattern`` may have."""
SOURCES = ("log_pattern", "exit_code", "node_excluded", "file")
"""Where a detection signal comes from: exactly one per signal."""


def check_log_pattern(pattern: str) -> re.Pattern[str]:
    """Compile ``pattern``; ``ValueError`` says what is wrong (bad syntax, a missing group)."""
    try:
        compiled = re.compile(pattern)
    except re.error as e:
        raise ValueError(f"{show(pattern)} is not a regular expression: {e}") from None
    missing = [g for g in LOG_PATTERN_GROUPS if g not in compiled.groupindex]
    if missing:
        raise ValueError(f"{show(pattern)} needs the named groups (?P<step>...) and "
                         f"(?P<loss>...); missing: {', '.join(missing)}")
    return compiled


def check_detection_pattern(pattern: str) -> re.Pattern[str]:
    """Compile a detection's ``pattern``; ``ValueError`` says what is wrong (bad syntax, a
    named group other than step, rank and node)."""
    try:
        compiled = re.compile(pattern)
    except re.error as e:
        raise ValueError(f"{show(pattern)} is not a regular expression: {e}") from None
    other = [g for g in compiled.groupindex if g not in DETECTION_GROUPS]
    if other:
        raise ValueError(f"{show(pattern)} has the named group(s) {', '.join(other)}; a "
                         f"detection pattern may name only (?P<step>...), (?P<rank>...) and "
                         f"(?P<node>...): rename them, or make them unnamed (...)")
    return compiled


class DetectionSignal(SpecModel):
    """One of the team's own monitors: a ``name`` and exactly one source."""

    name: Annotated[str, Field(min_length=1)]
    """Unique among the signals; what the verdict and ``expect.detected_by`` call it."""
    log_pattern: str | None = None
    """A regex matched against each new line of every node's log, with optional named groups
    ``step``, ``rank`` and ``node``: ``'fingerprint of rank (?P<rank>\\d+) disagrees'``."""
    exit_code: int | None = None
    """A node's launcher or trainer exited with this code (NVRx's 93: do not restart)."""
    node_excluded: Literal[True] | None = None
    """The launcher or Slurm left a node out of the job or drained it (``true``)."""
    file: Annotated[str, Field(min_length=1)] | None = None
    """A file appears: a glob relative to the job's working directory or the run directory
    (absolute allowed), e.g. ``'sdc-suspect-*.txt'``."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if value.startswith("anomaly:"):
            raise ValueError(f"{show(value)}: names starting with 'anomaly:' are the trainer's "
                             f"own anomaly records; choose another name")
        return value

    @field_validator("log_pattern")
    @classmethod
    def _pattern(cls, value: str | None) -> str | None:
        if value is not None:
            check_detection_pattern(value)
        return value

    @model_validator(mode="after")
    def _one_source(self) -> DetectionSignal:
        given = [k for k in SOURCES if getattr(self, k) is not None]
        if len(given) != 1:
            what = f"it has {', '.join(given)}: split it into one signal per source" if given \
                else "it has none: add one, e.g. log_pattern: 'loss spike at step (?P<step>\\d+)'"
            raise ValueError(f"signal {self.name!r} needs exactly one of {', '.join(SOURCES)}; "
                             f"{what}")
        return self

    @property
    def source(self) -> str:
        return next(k for k in SOURCES if getattr(self, k) is not None)

    @property
    def names(self) -> frozenset[str]:
        """What its detections can name: ``rank``, ``node`` (module docstring)."""
        if self.log_pattern is not None:
            groups = re.compile(self.log_pattern).groupindex
            return frozenset(g for g in ("rank", "node") if g in groups)
        if self.exit_code is not None or self.node_excluded:
            return frozenset({"node"})
        return frozenset()


class ObserveSpec(SpecModel):
    """What faultlab reads from the job's output (level 0)."""

    log_pattern: str | None = None
    """A regex with named groups ``step`` and ``loss``, e.g.
    ``'step (?P<step>\\d+) loss (?P<loss>\\S+)'``, matched against each line the ranks print."""

    step_digest: bool = False
    """Every step record carries ``param_digest``, the SHA-256 of the rank's weights after
    that step (level 0: the primary optimizer's parameters): what
    ``healed_state_matches_peer`` compares. Costs one hash of the weights per step."""

    detections: Annotated[tuple[DetectionSignal, ...], BeforeValidator(as_tuple)] = ()
    """The team's own detection signals (``DetectionSignal``): what the detection SLAs
    (``detected_within_steps``, ``detection_attributed``, ``false_alarms`` ...) score, beside
    the trainer's own ``anomaly`` records (``anomaly:<what>``)."""

    @field_validator("log_pattern")
    @classmethod
    def _pattern(cls, value: str | None) -> str | None:
        if value is not None:
            check_log_pattern(value)
        return value

    @field_validator("detections")
    @classmethod
    def _unique(cls, value: tuple[DetectionSignal, ...]) -> tuple[DetectionSignal, ...]:
        seen: dict[str, int] = {}
        errors = []
        for i, signal in enumerate(value):
            if signal.name in seen:
                errors.append(spec_error((i, "name"), f"duplicate signal name {signal.name!r} "
                                         f"(also detections[{seen[signal.name]}]); give each "
                                         f"signal its own name", signal.name))
            seen.setdefault(signal.name, i)
        if errors:
            raise located(errors)
        return value
