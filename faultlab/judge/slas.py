"""The SLAs by ``expect`` key: an experiment's (``SLAS``) and a campaign's own
(``CAMPAIGN_SLAS``), each one declaration of ``faultlab.sla`` (the built-ins and each team's,
registered alike under the ``faultlab.slas`` entry-point group).

An SLA is one declaration (``faultlab.sla.Sla``): the spec's ``Expect`` and ``CampaignExpect``
models, the verdict, ``faultlab list slas`` and the reference all read it; there is nothing to
keep in step here. A campaign's own (``faultlab.sla.CampaignSla``) are judged against its score
(``faultlab.observe.campaign``, by ``faultlab.engine.campaign.judge_campaign``), not a run's
records.
"""

from __future__ import annotations

from typing import Literal

from faultlab.sla import CampaignSla, Sla, campaign_slas, slas

__all__ = ["CAMPAIGN_SLAS", "SLAS", "SLA_KINDS", "CampaignSla", "Sla"]

SLAS: dict[str, Sla] = slas()
"""Every SLA an experiment may state under ``expect``, in the order of ``Expect``'s fields; a
declaration of ``faultlab.sla.Sla`` adds one (``faultlab.sla.builtin``, or a team's under the
``faultlab.slas`` entry-point group)."""

CAMPAIGN_SLAS: dict[str, CampaignSla] = campaign_slas()
"""A campaign's own ``expect`` keys (``faultlab.spec.campaign.CampaignExpect``), judged against
``faultlab.observe.campaign.CampaignScore``, in the declarations' order
(``faultlab.sla.campaign``'s built-ins, and a team's ``CampaignSla``)."""

SLA_KINDS: dict[str, Literal["max", "min", "bool"]] = {k: s.kind for k, s in SLAS.items()}
"""``expect`` key → comparison kind (an experiment's; a campaign's are in CAMPAIGN_SLAS)."""
