"""The inputs of the metrics: fault records, and the fields of the job's event records read
so that nothing a killed or broken job leaves behind makes the metrics raise.

``FaultRecord`` is one fault the engine injected; ``Record`` is one event record. The ``_``
helpers are private to :mod:`faultlab.observe`: each returns None (``_is_clean_exit``: False)
for a missing or malformed field, and ``_json_safe`` makes the metrics' ``to_dict`` JSON-safe.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["FaultRecord"]

CLEAN_EXITS = frozenset({"completed", "stopped"})

Record = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class FaultRecord:
    """One fault as the engine injected it (the input to the metrics)."""

    id: str
    """The fault's id in the experiment (unique within a run)."""
    type: str
    """The fault's type, e.g. ``rank_kill``."""
    injected_t: float
    """Wall-clock time (``time.time()``, like the events' ``t``) at which it was injected."""
    undone_t: float | None = None
    """When ``undo`` began (nothing the fault held can move before it, and a continued rank
    may step before the call returns); None if it was not (yet) undone."""
    target: str = ""
    """What it hit, in words: ``rank 1``, ``node node0``."""
    details: dict[str, Any] = field(default_factory=dict)
    """What ``inject`` returned (pids, signal ...), for the journal."""
    capabilities: tuple[str, ...] = ()
    """What its class declares it does (``faultlab.faults.Fault.capabilities()``:
    ``slows_job``, ``fails_saves`` ...), copied by the engine when it records the fault, so
    the observers (and a journal read later, without the fault's package) never need to know
    a fault type by name. A record without them (an older journal) has none."""

    def declares(self, capability: str) -> bool:
        """Does the fault's class declare ``capability`` (one of ``Fault``'s)?"""
        return capability in self.capabilities

    def to_dict(self) -> dict[str, Any]:
        return _json_safe(asdict(self))


# --- field access that never raises -----------------------------------------------------------

def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _range(value: Any) -> tuple[int, int] | None:
    if not isinstance(value, list | tuple) or len(value) != 2:
        return None
    start, stop = _int(value[0]), _int(value[1])
    if start is None or stop is None or stop < start:
        return None
    return start, stop


def _step(record: Record) -> int | None:
    return _int(record.get("step")) if record.get("kind") == "step" else None


def _key(value: Any) -> Any:
    """``value`` if it can be a dict key or set member, else None (a garbled pid or rank)."""
    try:
        hash(value)
    except TypeError:
        return None
    return value


def _is_clean_exit(record: Record) -> bool:
    return record.get("kind") == "exit" and _key(record.get("reason")) in CLEAN_EXITS


def _one_start_per_process(records: list[Record]) -> list[Record]:
    """``records`` without the level-0 observer's ``start`` (``level: 0``) of a process that
    wrote its own: a level-2 trainer given as ``target.command`` is launched with the level-0
    bootstrap, which writes a start at ``import torch`` before the trainer writes its own (the
    one with ``resumed_from_step``). Counted twice, it would look like a restart."""
    own = {_key(r.get("pid")) for r in records
           if r.get("kind") == "start" and r.get("level") != 0}
    own.discard(None)
    return [r for r in records if not (r.get("kind") == "start" and r.get("level") == 0
                                       and _key(r.get("pid")) in own)]


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, str | int | bool):
        return value
    return repr(value)
