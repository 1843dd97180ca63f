"""Where a run computed, from its own records, and whether a reference from elsewhere fits it.

Rank 0's ``start`` record carries the site it computes on (``faultlab.runtime.site``); the
run's site is that of its first incarnation, the job as it was launched (a later incarnation of
an elastic job may train at another world size, which is the run's behaviour, not its site).
A golden run records its own the same way (``GoldenRun.site``). ``other_hardware`` is the note
of a reference that is not this run's: ``reference from other hardware (A vs B)``, the
reference's site first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from faultlab.runtime.site import difference

__all__ = ["other_hardware", "run_site"]


def run_site(records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The site of the run's first rank-0 ``start`` record that carries one (None: no record
    says it, e.g. a trainer that writes its own events without faultlab's emitter)."""
    starts = [r for r in records if r.get("kind") == "start" and r.get("rank") == 0
              and isinstance(r.get("site"), dict)]
    if not starts:
        return None
    return dict(min(starts, key=lambda r: float(r.get("t") or 0))["site"])


def other_hardware(reference: Mapping[str, Any] | None,
                   run: Mapping[str, Any] | None) -> str:
    """``reference from other hardware (A vs B)`` when the reference's site differs from the
    run's where it decides the bits; '' when they agree or either is unknown."""
    differs = difference(dict(reference) if reference else None, dict(run) if run else None)
    return f"reference from other hardware ({differs})" if differs else ""
