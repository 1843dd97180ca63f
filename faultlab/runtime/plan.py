"""The runtime plan: which in-rank faults strike which ranks at which steps.

A plan is decided before launch and handed to every rank as a JSON file
(``FAULTLAB_RUNTIME_PLAN``)::

    {"faults": [{"id": "nan#1", "type": "grad_nan", "ranks": [0], "steps": [5],
                 "from_step": null, "to_step": null, "params": {"param_glob": "blocks.0.*"}}]}

The same entries, one at a time, are what the live control channel's ``inject`` carries. This
module is the one place that says what an entry may contain: the agent validates with it, and
the faultlab side (``faultlab.faults.numeric``/``collective``) validates with it too, so a plan
that faultlab writes is a plan every rank accepts. It imports neither torch nor the rest of
faultlab: it runs inside the training process and inside ``faultlab validate``.

Step matching: ``steps`` (a list) and the inclusive window ``from_step``..``to_step`` must all
hold; a missing one holds for every step. Steps are the 1-based step about to run, as passed to
``Agent.step``.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = [
    "COLLECTIVE_TYPES",
    "FAULT_TYPES",
    "NUMERIC_TYPES",
    "OP_NAMES",
    "FaultEntry",
    "PlanError",
    "load_plan",
    "parse_entry",
    "parse_plan",
    "validate_params",
    "write_plan",
]


class PlanError(ValueError):
    """A runtime plan or a live-inject entry is invalid; the message says where and why."""


#: Every operation the interposer can intercept: ``torch.distributed`` functions by their own
#: name, ``torch.distributed._functional_collectives`` (what DTensor uses) as ``funcol.<name>``.
C10D_OPS: tuple[str, ...] = (
    "all_gather_single", "reduce_scatter_single", "all_gather_into_tensor",
    "reduce_scatter_tensor", "_all_gather_base", "_reduce_scatter_base", "all_reduce",
    "all_reduce_coalesced", "broadcast", "reduce", "barrier", "monitored_barrier", "all_gather",
    "all_gather_coalesced", "all_gather_object", "gather", "gather_object", "scatter",
    "scatter_object_list", "broadcast_object_list", "reduce_scatter", "all_to_all",
    "all_to_all_single", "send", "recv", "isend", "irecv", "batch_isend_irecv",
    "send_object_list", "recv_object_list",
)
FUNCOL_OPS: tuple[str, ...] = (
    "broadcast", "all_reduce", "all_gather_single", "reduce_scatter_single",
    "all_gather_tensor", "reduce_scatter_tensor", "all_reduce_coalesced",
    "all_gather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced",
    "all_gather_single_coalesced", "reduce_scatter_single_coalesced", "all_to_all_single",
    "all_gather_single_autograd", "reduce_scatter_single_autograd",
    "all_gather_tensor_autograd", "reduce_scatter_tensor_autograd", "all_to_all_single_autograd",
)
OP_NAMES: tuple[str, ...] = C10D_OPS + tuple(f"funcol.{n}" for n in FUNCOL_OPS)

NUMERIC_TYPES = ("grad_nan", "grad_inf", "loss_spike", "weight_bitflip")
COLLECTIVE_TYPES = ("collective_delay", "collective_hang", "collective_error",
                    "collective_partition")
FAULT_TYPES = NUMERIC_TYPES + COLLECTIVE_TYPES


# --- parameter checks: each returns the normalised value or raises ValueError ---------------

def _int(low: int, high: int | None = None) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{v!r} is not an integer")
        if v < low or (high is not None and v > high):
            raise ValueError(f"{v!r} must be in {low}..{'' if high is None else high}")
        return v
    return check


def _float(low: float, high: float | None = None, *, low_open: bool = False,
           nonzero: bool = False) -> Callable[[Any], float]:
    def check(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ValueError(f"{v!r} is not a finite number")
        if v < low or (low_open and v == low) or (high is not None and v > high):
            lo = f"({low}" if low_open else f"[{low}"
            hi = "inf)" if high is None else f"{high}]"
            raise ValueError(f"{v!r} must be in {lo}, {hi}")
        if nonzero and v == 0:
            raise ValueError("0 is not allowed")
        return float(v)
    return check


def _str(v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise ValueError(f"{v!r} is not a non-empty string")
    return v


def _optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda v: None if v is None else check(v)


def _ops(v: Any) -> tuple[str, ...] | None:
    if v is None:
        return None
    if not isinstance(v, list | tuple) or not v:
        raise ValueError(f"{v!r} is not a non-empty list of operation names (or null for all)")
    for name in v:
        if not isinstance(name, str) or not fnmatch.filter(OP_NAMES, name):
            raise ValueError(f"{name!r} matches no interceptable operation; valid: "
                             f"{', '.join(OP_NAMES)} (fnmatch patterns allowed)")
    return tuple(v)


def _groups(v: Any) -> tuple[tuple[int, ...], ...]:
    if not isinstance(v, list | tuple) or len(v) < 2:
        raise ValueError(f"{v!r} must list at least two groups of ranks, e.g. [[0], [1]]")
    seen: set[int] = set()
    out = []
    for g in v:
        if not isinstance(g, list | tuple) or not g:
            raise ValueError(f"group {g!r} is not a non-empty list of ranks")
        for r in g:
            _int(0)(r)
            if r in seen:
                raise ValueError(f"rank {r!r} is in more than one group")
            seen.add(r)
        out.append(tuple(g))
    return tuple(out)


def _mode(v: Any) -> str:
    if v not in ("hang", "error"):
        raise ValueError(f"{v!r} is not one of hang, error")
    return str(v)


_SEED = (0, _int(0, 2**63 - 1))
_GLOB = ("*", _str)
_OPS = (None, _ops)

#: type -> param -> (default, check). ``...`` as default: required.
PARAMS: dict[str, dict[str, tuple[Any, Callable[[Any], Any]]]] = {
    "grad_nan": {"param_glob": _GLOB, "fraction": (1.0, _float(0.0, 1.0, low_open=True)),
                 "seed": _SEED},
    "grad_inf": {"param_glob": _GLOB, "fraction": (1.0, _float(0.0, 1.0, low_open=True)),
                 "seed": _SEED},
    "loss_spike": {"scale": (1e4, _float(-math.inf, nonzero=True))},
    "weight_bitflip": {"param_glob": _GLOB, "num_bits": (1, _int(1, 4096)),
                       "bit_index": (None, _optional(_int(0, 63))), "seed": _SEED},
    "collective_delay": {"delay_ms": (100.0, _float(0.0, 3_600_000.0)),
                         "jitter_ms": (0.0, _float(0.0, 3_600_000.0)), "ops": _OPS,
                         "seed": _SEED},
    "collective_hang": {"ops": _OPS, "after_num_calls": (1, _int(1))},
    "collective_error": {"ops": _OPS, "after_num_calls": (1, _int(1)),
                         "num_calls": (1, _int(1))},
    "collective_partition": {"groups": (..., _groups), "mode": ("hang", _mode), "ops": _OPS},
}


def validate_params(fault_type: str, params: Mapping[str, Any],
                    where: str = "params") -> dict[str, Any]:
    """``params`` with defaults filled in and values normalised; PlanError names ``where``."""
    if fault_type not in PARAMS:
        raise PlanError(f"{where}: unknown runtime fault type {fault_type!r}; valid: "
                        f"{', '.join(FAULT_TYPES)}")
    spec = PARAMS[fault_type]
    unknown = sorted(set(params) - set(spec))
    if unknown:
        raise PlanError(f"{where}: unknown parameter(s) {', '.join(map(repr, unknown))} for "
                        f"{fault_type}; valid: {', '.join(spec)}")
    out: dict[str, Any] = {}
    for name, (default, check) in spec.items():
        if name not in params:
            if default is ...:
                raise PlanError(f"{where}.{name}: required for {fault_type}")
            out[name] = default
            continue
        try:
            out[name] = check(params[name])
        except ValueError as e:
            raise PlanError(f"{where}.{name}: {e}") from None
    return out


@dataclass(frozen=True, slots=True)
class FaultEntry:
    """One validated plan entry."""

    id: str
    type: str
    ranks: tuple[int, ...] | None = None
    """Victim ranks; None: every rank."""
    steps: tuple[int, ...] | None = None
    from_step: int | None = None
    to_step: int | None = None
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def family(self) -> str:
        return "numeric" if self.type in NUMERIC_TYPES else "collective"

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
        """This entry pinned to one step (a live numeric inject resolved at the next step)."""
        return replace(self, steps=(step,), from_step=None, to_step=None)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "type": self.type,
                "ranks": None if self.ranks is None else list(self.ranks),
                "steps": None if self.steps is None else list(self.steps),
                "from_step": self.from_step, "to_step": self.to_step,
                "params": {k: list(v) if isinstance(v, tuple) else v
                           for k, v in self.params.items()}}


_ENTRY_KEYS = ("id", "type", "ranks", "steps", "from_step", "to_step", "params")


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
    """Validate one entry. A plan's numeric fault needs a step filter (else it would strike at
    every step); a live one without steps strikes at the next step."""
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
    if ftype not in FAULT_TYPES:
        raise PlanError(f"{where}.type: {ftype!r} is not a runtime fault type; valid: "
                        f"{', '.join(FAULT_TYPES)}")
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
    entry = FaultEntry(id=fid, type=ftype, ranks=_int_list(raw.get("ranks"), f"{where}.ranks", 0),
                       steps=steps, from_step=bounds[0], to_step=bounds[1],
                       params=validate_params(ftype, params, f"{where}.params"))
    if entry.family == "numeric" and not live and entry.steps is None \
            and entry.from_step is None:
        raise PlanError(f"{where}: a planned {ftype} needs 'steps' or 'from_step' (without "
                        f"them it would strike at every step)")
    return entry


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
