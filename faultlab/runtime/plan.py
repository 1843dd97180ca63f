"""The runtime plan: which in-rank faults strike which ranks at which steps.

A plan is decided before launch and handed to every rank as a JSON file
(``FAULTLAB_RUNTIME_PLAN``)::

    {"faults": [{"id": "nan#1", "type": "grad_nan",
                 "action": "faultlab.runtime.actions.numeric:GradNan",
                 "ranks": [0], "steps": [5], "from_step": null, "to_step": null,
                 "params": {"param_glob": "blocks.0.*", "fraction": 1.0, "seed": 7}}]}

The same entries, one at a time, are what the live control channel's ``inject`` carries.
``action`` is the import path of the fault's rank-side action (``faultlab.runtime.hooks``),
``type`` the fault's name (for the events), ``params`` the action's parameters, complete and
already validated by the fault's ``Params`` model on faultlab's side: this module checks the
entry's shape only, and knows no fault. It imports neither torch nor the rest of faultlab: it
runs inside the training process.

Step matching: ``steps`` (a list) and the inclusive window ``from_step``..``to_step`` must all
hold; a missing one holds for every step. Steps are the 1-based step about to run, as passed to
``Agent.step``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from faultlab.errors import PlanError

__all__ = [
    "FaultEntry",
    "PlanError",
    "load_plan",
    "parse_entry",
    "parse_plan",
    "write_plan",
]



@dataclass(frozen=True, slots=True)
class FaultEntry:
    """One validated plan entry."""

    id: str
    type: str
    """The fault's name (what its events say)."""
    action: str
    """Import path of its rank-side action, ``"package.module:Class"``."""
    ranks: tuple[int, ...] | None = None
    """Victim ranks; None: every rank."""
    steps: tuple[int, ...] | None = None
    from_step: int | None = None
    to_step: int | None = None
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def has_step_filter(self) -> bool:
        return not (self.steps is None and self.from_step is None and self.to_step is None)

    def applies_to(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks

    def in_window(self, step: int) -> bool:
        return ((self.steps is None or step in self.steps)
                and (self.from_step is None or step >= self.from_step)
                and (self.to_step is None or step <= self.to_step))

    def at_step(self, step: int) -> FaultEntry:
        """This entry pinned to one step (a live at-step inject resolved at the next step)."""
        return replace(self, steps=(step,), from_step=None, to_step=None)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "type": self.type, "action": self.action,
                "ranks": None if self.ranks is None else list(self.ranks),
                "steps": None if self.steps is None else list(self.steps),
                "from_step": self.from_step, "to_step": self.to_step,
                "params": {k: list(v) if isinstance(v, tuple) else v
                           for k, v in self.params.items()}}


_ENTRY_KEYS = ("id", "type", "action", "ranks", "steps", "from_step", "to_step", "params")


def _int_list(v: Any, where: str, low: int) -> tuple[int, ...] | None:
    if v is None:
        return None
    if not isinstance(v, list | tuple) or not v:
        raise PlanError(f"{where}: {v!r} is not a non-empty list of integers (or null)")
    for x in v:
        if isinstance(x, bool) or not isinstance(x, int) or x < low:
            raise PlanError(f"{where}: {x!r} is not an integer >= {low}")
    return tuple(v)


def parse_entry(raw: Any, where: str = "fault", *, live: bool = False) -> FaultEntry:
    """Check one entry's shape (its parameters were validated by the fault's ``Params`` on
    faultlab's side; whether an at-step action has a step filter is checked once its action is
    loaded, by the agent). ``live``: a live inject (kept for the messages)."""
    if not isinstance(raw, Mapping):
        raise PlanError(f"{where}: expected an object, got {raw!r}")
    unknown = sorted(set(raw) - set(_ENTRY_KEYS))
    if unknown:
        raise PlanError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; valid: "
                        f"{', '.join(_ENTRY_KEYS)}")
    fid = raw.get("id")
    if not isinstance(fid, str) or not fid or len(fid) > 200:
        raise PlanError(f"{where}.id: {fid!r} must be a non-empty string of at most 200 chars")
    where = f"{where} ({fid!r})"
    ftype = raw.get("type")
    if not isinstance(ftype, str) or not ftype:
        raise PlanError(f"{where}.type: {ftype!r} is not a fault type name")
    action = raw.get("action")
    if not isinstance(action, str) or action.count(":") != 1 or not all(action.split(":")):
        raise PlanError(f"{where}.action: {action!r} is not an import path "
                        f"'package.module:Class'")
    steps = _int_list(raw.get("steps"), f"{where}.steps", 1)
    bounds = []
    for key in ("from_step", "to_step"):
        v = raw.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise PlanError(f"{where}.{key}: {v!r} is not an integer >= 1 (or null)")
        bounds.append(v)
    if bounds[0] is not None and bounds[1] is not None and bounds[0] > bounds[1]:
        raise PlanError(f"{where}: from_step {bounds[0]!r} is after to_step {bounds[1]!r}")
    params = raw.get("params") or {}
    if not isinstance(params, Mapping):
        raise PlanError(f"{where}.params: expected an object, got {params!r}")
    return FaultEntry(id=fid, type=ftype, action=action,
                      ranks=_int_list(raw.get("ranks"), f"{where}.ranks", 0),
                      steps=steps, from_step=bounds[0], to_step=bounds[1], params=dict(params))


def parse_plan(doc: Any, source: str = "<plan>") -> list[FaultEntry]:
    if not isinstance(doc, Mapping) or set(doc) - {"faults"}:
        raise PlanError(f"{source}: expected {{\"faults\": [...]}}, got {str(doc)[:200]}")
    faults = doc.get("faults") or []
    if not isinstance(faults, list):
        raise PlanError(f"{source}: 'faults' must be a list, got {faults!r}")
    entries = [parse_entry(f, f"{source}: faults[{i}]") for i, f in enumerate(faults)]
    ids = [e.id for e in entries]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise PlanError(f"{source}: fault id(s) {', '.join(map(repr, dupes))} appear more than "
                        f"once; every id must be unique (it keys the fire-once markers)")
    return entries


def load_plan(path: str | os.PathLike[str]) -> list[FaultEntry]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise PlanError(f"{path}: cannot read the runtime plan ({e.strerror}); check "
                        f"FAULTLAB_RUNTIME_PLAN") from None
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise PlanError(f"{path}: not valid JSON: {e}") from None
    return parse_plan(doc, str(path))


def write_plan(path: str | os.PathLike[str], faults: Sequence[Mapping[str, Any]]) -> Path:
    """Validate ``faults`` (plan entries as dicts) and write them atomically as a plan file."""
    entries = parse_plan({"faults": list(faults)}, str(path))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"faults": [e.to_json() for e in entries]}, indent=1) + "\n",
                   encoding="utf-8")
    os.replace(tmp, path)
    return path
