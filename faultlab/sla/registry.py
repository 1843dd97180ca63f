"""Every SLA an experiment may state: the built-ins, then each team's from the entry-point group
``faultlab.slas`` (name = the ``expect`` key, value = ``module:OBJECT``, an ``Sla``).

The built-ins come first and in their own order, which is the order of the ``expect`` keys in
the schema and the reference (an entry-point list is sorted by name, so it cannot keep one);
then the registered ones, sorted by key. A broken or clashing plugin is an error, never skipped.

The registry is read once per process, when ``faultlab.spec`` builds its ``Expect`` model from
it: a team's module is imported then, so it imports ``faultlab.sla`` (and what it needs of its
own), never ``faultlab.spec``, ``faultlab.judge`` or the engine.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points

from faultlab.errors import PluginError
from faultlab.sla.base import Sla

__all__ = ["ENTRY_POINT_GROUP", "slas"]

ENTRY_POINT_GROUP = "faultlab.slas"


@cache
def slas() -> dict[str, Sla]:
    """``expect`` key → its declaration: the built-ins in their order, then the registered."""
    from faultlab.sla.builtin import BUILTIN

    found: dict[str, Sla] = {s.key: s for s in BUILTIN}
    registered: dict[str, Sla] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        where = f"SLA plugin {ep.name!r} ({ep.value})"
        try:
            sla = ep.load()
        except Exception as e:  # a plugin's import error must be seen, not swallowed
            raise PluginError(f"{where} failed to import: {type(e).__name__}: {e}") from e
        if not isinstance(sla, Sla):
            raise PluginError(f"{where} is not a faultlab.sla.Sla (a declaration: an instance, "
                              f"not its class)")
        if sla.key != ep.name:
            raise PluginError(f"{where} declares key={sla.key!r}; they must match")
        if not sla.key.isidentifier() or sla.key.startswith("_"):
            raise PluginError(f"{where}: {sla.key!r} is not a valid expect key")
        if sla.key in found or (sla.key in registered and registered[sla.key] is not sla):
            raise PluginError(f"SLA {sla.key!r} is registered twice ({ep.value} and "
                              f"{type(found.get(sla.key) or registered[sla.key]).__module__})")
        registered[sla.key] = sla
    return {**found, **dict(sorted(registered.items()))}
