"""The SLAs by ``expect`` key (``SLAS``: the declarations of ``faultlab.sla``, the built-ins and
each team's) and a campaign's own (``CAMPAIGN_SLAS``), with the comparison each makes.

An experiment's SLA is one declaration (``faultlab.sla.Sla``): the spec's ``Expect`` model, the
verdict, ``faultlab list slas`` and the reference all read it; there is nothing to keep in step
here. A campaign's SLAs are judged against its score (``faultlab.observe.campaign``), not a
run's records, and keep the small table below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from faultlab.sla import Sla, slas

__all__ = ["CAMPAIGN_SLAS", "SLAS", "SLA_KINDS", "CampaignSla", "Sla"]

SLAS: dict[str, Sla] = slas()
"""Every SLA an experiment may state under ``expect``, in the order of ``Expect``'s fields; a
declaration of ``faultlab.sla.Sla`` adds one (``faultlab.sla.builtin``, or a team's under the
``faultlab.slas`` entry-point group)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CampaignSla:
    """How one of a campaign's own ``expect`` keys is judged against its score."""

    key: str
    """The key under ``expect``."""
    metric: str
    """Name of the campaign metric (``faultlab.observe.campaign.CampaignScore``)."""
    kind: Literal["max", "min", "bool"]
    """``max``: measured <= bound; ``min``: measured >= bound; ``bool``: measured == expected."""
    unit: str
    description: str

    def holds(self, measured: float | bool, bound: float | bool) -> bool:
        if self.kind == "max":
            return measured <= bound
        if self.kind == "min":
            return measured >= bound
        return bool(measured) == bool(bound)


CAMPAIGN_SLAS: dict[str, CampaignSla] = {s.key: s for s in [
    CampaignSla(key="ettr", unit="ratio (0-1)", metric="ettr", kind="min",
                description="effective training time ratio of the campaign: useful step time "
                            "÷ wall time"),
    CampaignSla(key="detection_rate", unit="ratio (0-1)", metric="detection_rate", kind="min",
                description="injections the job detected ÷ injections"),
    CampaignSla(key="attribution_accuracy", unit="ratio (0-1)", metric="attribution_accuracy",
                kind="min",
                description="detected injections whose victim the job named ÷ attributable "
                            "ones"),
    CampaignSla(key="false_positives_per_hour", unit="per hour",
                metric="false_positives_per_hour", kind="max",
                description="detections, restarts and anomalies of the fault-free golden run "
                            "per hour"),
    CampaignSla(key="recovery_time_p95_s", unit="s", metric="recovery_time_p95_s", kind="max",
                description="95th percentile of the injections' recovery time (an unrecovered "
                            "one counts as infinite)"),
]}
"""A campaign's own ``expect`` keys (``faultlab.spec.campaign.CampaignExpect``), judged against
``faultlab.observe.campaign.CampaignScore``, in the order of ``CAMPAIGN_SLAS`` there."""

SLA_KINDS: dict[str, Literal["max", "min", "bool"]] = {k: s.kind for k, s in SLAS.items()}
"""``expect`` key → comparison kind (an experiment's; a campaign's are in CAMPAIGN_SLAS)."""
