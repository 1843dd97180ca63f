"""Plan entries as faultlab writes them, from the short form tests write by hand.

A rank checks an entry's shape only: the action's import path and its complete, validated
parameters come from the fault class (``rank_action`` and ``Params``), as the engine's launch
plan and a live inject do. ``entry({"id": "n", "type": "grad_nan", "steps": [2]})`` fills both
in; an entry that already names its action is left as it is.
"""

from __future__ import annotations

from typing import Any

from faultlab.fault_api import fault_types


def entry(raw: dict[str, Any]) -> dict[str, Any]:
    if "action" in raw or raw.get("type") not in fault_types():
        return raw
    cls = fault_types()[raw["type"]]
    params = cls.Params(**(raw.get("params") or {}))
    full = params.runtime_params()  # type: ignore[attr-defined]
    if "seed" in full and full["seed"] is None:
        full["seed"] = 0
    return {**raw, "action": cls.rank_action, "params": full}


def entries(raws: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry(r) for r in raws]


def gpu_entry(fid: str, fault_type: str, devices: list[int] | None = None,
              t: float | None = None, **params: Any) -> dict[str, Any]:
    """A node GPU state entry as the fault writes it (``faultlab.faults.gpu``): its action,
    its fields and its NVML view, from the fault class and ``params``; ``t``: when it was
    written (a sticky fault is older than a process started after it)."""
    cls = fault_types()[fault_type]
    fault = cls(cls.Params(**params))
    return {"id": fid, "type": fault_type, "action": cls.rank_action, "devices": devices,
            **({} if t is None else {"t": t}), **fault._entry()}  # type: ignore[attr-defined]
