"""The SLAs: what an experiment may assert under ``expect``, each one declaration.

An SLA is one :class:`Sla` (``base.py``): its ``expect`` key and the type and range of its value,
its unit and bound kind (an upper bound, a lower bound or an expected truth value), what it
measures (a metric of ``faultlab.observe``, or its own :meth:`Sla.measure` over the run's
records), how it compares and how its note is written, and its reference text. Everything else
is derived from the declarations: ``faultlab.spec``'s ``Expect`` model (so the YAML it accepts,
its error messages and the JSON schema), ``faultlab.judge.judge``'s verdict, ``faultlab list
slas`` and the SLA reference. The built-ins (``builtin.py``, ``detection.py``, ``campaign.py``)
are ordinary declarations, registered under the entry-point group ``faultlab.slas`` in
faultlab's ``pyproject.toml``; a team registers its own there too (``registry.py``, through
``faultlab.registry``) and it is judged from the same records. A campaign's own SLAs
(``campaign.py``'s ``CampaignSla``) are declarations too, judged against the campaign's score.

Why a package of its own, beneath ``spec`` and ``judge``: the spec builds ``Expect`` from the
declarations when it is imported, and the spec may not import the judge (the judge reads
experiments: imports point one way). So the declarations, a team's included, live where both may
import them. It may import ``faultlab.errors`` and ``faultlab.registry`` (the plugin registry,
which loads the declarations' entry points). What a declaration needs to know of a run reaches
it as :class:`Evidence`, which ``faultlab.judge`` builds from the records and answers with
``faultlab.observe``: one contract, read by the spec for its YAML half and by the judge for its
verdict half, with no registry of either kept in step by hand.

    from faultlab.sla import Evidence, Sla

    @dataclass(frozen=True, kw_only=True)
    class MaxLoss(Sla):
        def measure(self, ev: Evidence) -> float | None:
            losses = [e["loss"] for e in ev.events if e.get("kind") == "step" and "loss" in e]
            return max(losses) if losses else None

    MAX_LOSS = MaxLoss(key="max_loss", value=float, gt=0, kind="max", unit="loss",
                       description="the largest loss any step recorded",
                       doc="Upper bound on the loss of any step.")
"""

from faultlab.sla.base import Evidence, Kind, Outcome, Sla
from faultlab.sla.builtin import NOISE_K_DEFAULT
from faultlab.sla.campaign import CampaignSla
from faultlab.sla.registry import ENTRY_POINT_GROUP, campaign_slas, slas

__all__ = ["ENTRY_POINT_GROUP", "NOISE_K_DEFAULT", "CampaignSla", "Evidence", "Kind", "Outcome",
           "Sla", "campaign_slas", "slas"]
