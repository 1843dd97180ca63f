"""The fault registry: every fault type, built-in or third-party, comes from the entry-point
group ``faultlab.faults`` (name = YAML type, value = ``module:Class``). Looking a type up loads
its module then, by name: nothing here imports a fault's implementation."""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points

from faultlab.errors import PluginError
from faultlab.fault_api.base import Fault
from faultlab.fault_api.context import CONTEXT_CAPABILITIES, declared_capabilities

__all__ = ["ENTRY_POINT_GROUP", "fault_types", "get_fault_type"]

ENTRY_POINT_GROUP = "faultlab.faults"


@cache
def fault_types() -> dict[str, type[Fault]]:
    """Every registered fault type by name. A broken plugin is an error, never skipped."""
    found: dict[str, type[Fault]] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            cls = ep.load()
        except Exception as e:  # a plugin's import error must be seen, not swallowed
            raise PluginError(f"fault plugin {ep.name!r} ({ep.value}) failed to import: "
                              f"{type(e).__name__}: {e}") from e
        if not (isinstance(cls, type) and issubclass(cls, Fault)):
            raise PluginError(f"fault plugin {ep.name!r} ({ep.value}) is not a "
                              f"faultlab.faults.Fault subclass")
        if getattr(cls, "type", None) != ep.name:
            raise PluginError(f"fault plugin {ep.name!r} ({ep.value}) declares "
                              f"type={getattr(cls, 'type', None)!r}; they must match")
        retired = [a for a in ("launchers", "launcher_reason") if hasattr(cls, a)]
        if retired:
            raise PluginError(f"fault plugin {ep.name!r} ({ep.value}) declares "
                              f"{' and '.join(retired)}, which faultlab no longer reads: "
                              f"declare what it needs of the target instead (needs = "
                              f"(...), from {', '.join(CONTEXT_CAPABILITIES)}), and every "
                              f"launcher whose target offers that can host it")
        declared_capabilities(getattr(cls, "needs", ()), f"fault plugin {ep.name!r} "
                              f"({ep.value})", "needs")
        if ep.name in found and found[ep.name] is not cls:
            raise PluginError(f"fault type {ep.name!r} is registered twice "
                              f"({found[ep.name].__module__} and {cls.__module__})")
        found[ep.name] = cls
    return dict(sorted(found.items()))


def get_fault_type(name: str) -> type[Fault]:
    types = fault_types()
    if name not in types:
        raise KeyError(name)
    return types[name]
