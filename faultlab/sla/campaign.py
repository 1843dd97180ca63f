"""A campaign's own SLAs: declarations like every other, judged against the campaign's score.

A :class:`CampaignSla` is an :class:`~faultlab.sla.Sla` whose value a campaign's ``expect`` takes
beside the experiment SLAs (``faultlab.spec.campaign.CampaignExpect`` is built from them), and
which is measured on the whole campaign's score (``faultlab.observe.campaign.CampaignScore``:
its injections, detections, recoveries, the golden run's false positives), not on one run's
records. The built-ins below register under the ``faultlab.slas`` entry-point group as a team's
do: a team adds a campaign SLA by registering a ``CampaignSla`` there (overriding
:meth:`CampaignSla.measure_score` to measure what the score's fields show).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from faultlab.sla.base import Sla

__all__ = ["CampaignSla"]


@dataclass(frozen=True, kw_only=True)
class CampaignSla(Sla):
    """One of a campaign's own ``expect`` keys (module docstring)."""

    unmeasured: str = "not measured"
    """The note when the score has no value for it (why it could not be measured)."""

    def measure_score(self, score: Any) -> Any:
        """What the campaign's score shows (None: not measured); default: its metric
        ``metric`` (``CampaignScore.metric``, the field of that name)."""
        return score.metric(self.metric or self.key)


ETTR = CampaignSla(
    key="ettr", order=510, value=float, gt=0, le=1, kind="min", unit="ratio (0-1)",
    metric="ettr",
    description="effective training time ratio of the campaign: useful step time ÷ wall time",
    doc="Lower bound on the effective training time ratio: useful step time ÷ wall time.")

DETECTION_RATE = CampaignSla(
    key="detection_rate", order=520, value=float, ge=0, le=1, kind="min", unit="ratio (0-1)",
    metric="detection_rate", unmeasured="no fault was injected",
    description="injections the job detected ÷ injections",
    doc="Lower bound on the fraction of injections the job detected.")

ATTRIBUTION_ACCURACY = CampaignSla(
    key="attribution_accuracy", order=530, value=float, ge=0, le=1, kind="min",
    unit="ratio (0-1)", metric="attribution_accuracy",
    unmeasured="no detected injection was attributable (each struck every rank)",
    description="detected injections whose victim the job named ÷ attributable ones",
    doc="""Lower bound on the fraction of attributable detected injections whose victim the job
    named.""")

FALSE_POSITIVES_PER_HOUR = CampaignSla(
    key="false_positives_per_hour", order=540, value=float, ge=0, kind="max", unit="per hour",
    metric="false_positives_per_hour",
    description="detections, restarts and anomalies of the fault-free golden run per hour",
    doc="Upper bound on the golden run's detections, restarts and anomalies per hour.")

RECOVERY_TIME_P95_S = CampaignSla(
    key="recovery_time_p95_s", order=550, value=float, gt=0, kind="max", unit="s",
    metric="recovery_time_p95_s", unmeasured="no injection took the job down",
    description="95th percentile of the injections' recovery time (an unrecovered one counts "
                "as infinite)",
    doc="""Upper bound on the 95th percentile of the injections' recovery time, seconds, or in the
    job's own units (``{cold_starts: 3}``: ``faultlab.sla.timing``).""")
