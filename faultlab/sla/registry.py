"""Every SLA an experiment or a campaign may state: the entry points of the group
``faultlab.slas`` (name = the ``expect`` key, value = ``module:OBJECT``, an ``Sla``), loaded
through ``faultlab.registry``. The built-ins register there in faultlab's own ``pyproject.toml``
exactly as a team's do in theirs.

The order is each declaration's own (``Sla.order``, then the key): the order of the ``expect``
keys in the schema, the reference and the verdict. A broken or clashing plugin is an error,
never skipped. A :class:`~faultlab.sla.campaign.CampaignSla` is a campaign's (``campaign_slas``),
every other an experiment's (``slas``).

The registry is read once per process, when ``faultlab.spec`` builds its ``Expect`` model from
it: a team's module is imported then, so it imports ``faultlab.sla`` (and what it needs of its
own), never ``faultlab.spec``, ``faultlab.judge`` or the engine.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from faultlab import registry
from faultlab.sla.base import Sla
from faultlab.sla.campaign import CampaignSla

__all__ = ["ENTRY_POINT_GROUP", "campaign_slas", "slas"]

ENTRY_POINT_GROUP = registry.GROUPS["sla"]


@cache
def _declared() -> dict[str, Sla]:
    loaded: list[Sla] = [registry.load("sla", name, check=_checker(name))
                         for name in registry.registered("sla")]
    return {s.key: s for s in sorted(loaded, key=lambda s: (s.order, s.key))}


def _checker(name: str) -> Any:
    def check(sla: Any) -> str | None:
        if not isinstance(sla, Sla):
            return "is not a faultlab.sla.Sla (a declaration: an instance, not its class)"
        if sla.key != name:
            return f"declares key={sla.key!r}; they must match"
        if not sla.key.isidentifier() or sla.key.startswith("_"):
            return f"declares key={sla.key!r}, which is not a valid expect key"
        return None

    return check


def slas() -> dict[str, Sla]:
    """An experiment's ``expect`` key → its declaration, in the declarations' order."""
    return {k: s for k, s in _declared().items() if not isinstance(s, CampaignSla)}


def campaign_slas() -> dict[str, CampaignSla]:
    """A campaign's own ``expect`` key → its declaration, in the declarations' order (a
    campaign also takes every key of ``slas``)."""
    return {k: s for k, s in _declared().items() if isinstance(s, CampaignSla)}
