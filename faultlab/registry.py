"""The one registry: every plugin faultlab loads, built-in or a team's, is an entry point.

Four entry-point groups (``GROUPS``), one per kind of plugin: faults, SLAs, targets and
trainers. The built-ins register in faultlab's own ``pyproject.toml`` exactly as a team's
package does in its own (``[project.entry-points."faultlab.faults"]`` ...), so nothing tells
them apart but their distribution. :func:`registered` lists a group by name without importing
anything; :func:`load` imports one entry point and checks it.

One error path: whatever goes wrong (a name nobody registered, a module that fails to import,
an object that is not what its group needs, a name two distributions register) is a
``PluginError`` that names the plugin (its distribution), the entry point (``name =
module:attr``) and the fix. The loaders of each kind (``faultlab.fault_api.registry``,
``faultlab.sla.registry``, ``faultlab.spec.trainers``, ``faultlab.spec.target``) pass their
checks as ``check``; none reads a group itself.

Imports nothing of faultlab but ``faultlab.errors``: every layer may use it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from faultlab.errors import PluginError

__all__ = ["GROUPS", "describe", "load", "registered"]

GROUPS = {"fault": "faultlab.faults", "sla": "faultlab.slas", "target": "faultlab.targets",
          "trainer": "faultlab.trainers"}
"""Kind of plugin → its entry-point group (name = what an experiment writes, value =
``module:attr``)."""

_LABEL = {"fault": "fault", "sla": "SLA", "target": "target", "trainer": "trainer"}


def _group(kind: str) -> str:
    if kind not in GROUPS:
        raise ValueError(f"no plugin kind {kind!r}; the kinds: {', '.join(GROUPS)}")
    return GROUPS[kind]


def distribution(ep: EntryPoint) -> str:
    """The distribution that registers ``ep``, as ``name version`` (pip's name for it)."""
    dist = ep.dist
    return f"{dist.name} {dist.version}" if dist is not None else "an unknown distribution"


def describe(kind: str, ep: EntryPoint) -> str:
    """``fault plugin 'team-faults 0.1' (entry point team_x = team_faults:X in faultlab.faults)``:
    how every error about a plugin names it."""
    return (f"{_LABEL[kind]} plugin {distribution(ep)!r} (entry point {ep.name} = {ep.value} "
            f"in {ep.group})")


def _fix(ep: EntryPoint) -> str:
    dist = ep.dist.name if ep.dist is not None else "its distribution"
    return (f"fix {ep.value} (or the entry point in {dist}'s pyproject.toml, then reinstall "
            f"it: pip install -e <its folder>), or uninstall {dist}")


@cache
def registered(kind: str) -> dict[str, EntryPoint]:
    """Every entry point of ``kind``'s group by name, sorted; nothing is imported. A name two
    distributions register (with different values) is a PluginError naming both."""
    found: dict[str, EntryPoint] = {}
    for ep in sorted(entry_points(group=_group(kind)), key=lambda e: (e.name, e.value)):
        other = found.get(ep.name)
        if other is not None and other.value != ep.value:
            raise PluginError(f"{_LABEL[kind]} {ep.name!r} is registered twice: by "
                              f"{describe(kind, other)} and by {describe(kind, ep)}; uninstall "
                              f"one, or rename its entry point")
        found[ep.name] = ep
    return found


def load(kind: str, name: str, *,
         check: Callable[[Any], str | None] | None = None) -> Any:
    """The object registered as ``name`` in ``kind``'s group, its module imported now.

    ``check(obj)`` returns why the object is unfit (a sentence that follows the plugin's name:
    ``"is not a faultlab.sla.Sla"``), or None. An unknown name, an import error or a reason is
    a PluginError (module docstring), never skipped."""
    eps = registered(kind)
    if name not in eps:
        group = _group(kind)
        raise PluginError(f"no {_LABEL[kind]} registered as {name!r}; the {group} entry points: "
                          f"{', '.join(eps) or 'none'}. Name one of those, or install the "
                          f"package that registers {name!r} (its pyproject.toml: "
                          f"[project.entry-points.\"{group}\"] {name} = \"module:attr\"; "
                          f"pip install -e <its folder>)")
    ep = eps[name]
    try:
        obj = ep.load()
    except Exception as e:  # a plugin's import error must be seen, not swallowed
        raise PluginError(f"{describe(kind, ep)} failed to import: {type(e).__name__}: {e}; "
                          f"{_fix(ep)}") from e
    why = check(obj) if check is not None else None
    if why:
        raise PluginError(f"{describe(kind, ep)} {why}; {_fix(ep)}")
    return obj
