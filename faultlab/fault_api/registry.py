"""The fault registry: every fault type, built-in or third-party, comes from the entry-point
group ``faultlab.faults`` (name = YAML type, value = ``module:Class``), loaded through
``faultlab.registry`` and checked here. Looking a type up loads its module then, by name:
nothing here imports a fault's implementation."""

from __future__ import annotations

from functools import cache
from typing import Any

from faultlab import registry
from faultlab.errors import PluginError
from faultlab.fault_api.base import Fault
from faultlab.fault_api.context import CONTEXT_CAPABILITIES, declared_capabilities

__all__ = ["ENTRY_POINT_GROUP", "fault_types", "get_fault_type"]

ENTRY_POINT_GROUP = registry.GROUPS["fault"]


@cache
def fault_types() -> dict[str, type[Fault]]:
    """Every registered fault type by name. A broken plugin is an error, never skipped."""
    return {name: registry.load("fault", name, check=_checker(name))
            for name in registry.registered("fault")}


def _checker(name: str) -> Any:
    def check(cls: Any) -> str | None:
        if not (isinstance(cls, type) and issubclass(cls, Fault)):
            return "is not a faultlab.faults.Fault subclass"
        if getattr(cls, "type", None) != name:
            return f"declares type={getattr(cls, 'type', None)!r}; they must match"
        retired = [a for a in ("launchers", "launcher_reason") if hasattr(cls, a)]
        if retired:
            return (f"declares {' and '.join(retired)}, which faultlab no longer reads: declare "
                    f"what it needs of the target instead (needs = (...), from "
                    f"{', '.join(CONTEXT_CAPABILITIES)}), and every launcher whose target "
                    f"offers that can host it")
        try:
            declared_capabilities(getattr(cls, "needs", ()), "it", "needs")
        except PluginError as e:
            return f"is unfit: {e}"
        return None

    return check


def get_fault_type(name: str) -> type[Fault]:
    types = fault_types()
    if name not in types:
        raise KeyError(name)
    return types[name]
