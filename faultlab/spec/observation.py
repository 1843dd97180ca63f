"""``observe``: how faultlab reads what a trainer does not report through events.

A level-0 job (your trainer, unchanged) reports its steps and checkpoints through faultlab's
runtime agent but not its loss. ``log_pattern`` is a regular expression with the named groups
``step`` and ``loss``, matched against every line of the nodes' logs (``faultlab.observe.logs``);
it feeds the loss plots and the comparison with the golden run's loss.
"""

from __future__ import annotations

import re

from pydantic import field_validator

from faultlab.spec._base import SpecModel, show

__all__ = ["LOG_PATTERN_GROUPS", "ObserveSpec", "check_log_pattern"]

LOG_PATTERN_GROUPS = ("step", "loss")


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


class ObserveSpec(SpecModel):
    """What faultlab reads from the job's output (level 0)."""

    log_pattern: str | None = None
    """A regex with named groups ``step`` and ``loss``, e.g.
    ``'step (?P<step>\\d+) loss (?P<loss>\\S+)'``, matched against each line the ranks print."""

    step_digest: bool = False
    """Every step record carries ``param_digest``, the SHA-256 of the rank's weights after
    that step (level 0: the primary optimizer's parameters): what
    ``healed_state_matches_peer`` compares. Costs one hash of the weights per step."""

    @field_validator("log_pattern")
    @classmethod
    def _pattern(cls, value: str | None) -> str | None:
        if value is not None:
            check_log_pattern(value)
        return value
