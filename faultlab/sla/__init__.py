"""The SLAs: what an experiment may assert under ``expect``, each one declaration.

An SLA is one :class:`Sla` (``base.py``): its ``expect`` key and the type and range of its value,
its unit and bound kind (an upper bound, a lower bound or an expected truth value), what it
measures (a metric of ``faultlab.observe``, or its own :meth:`Sla.measure` over the run's
records), how it compares and how its note is written, and its reference text. Everything else
is derived from the declarations: ``faultlab.spec``'s ``Expect`` model (so the YAML it accepts,
its error messages and the JSON schema), ``faultlab.judge.judge``'s verdict, ``faultlab list
slas`` and the SLA reference. The built-ins (``builtin.py``) are ordinary declarations; a team
registers its own under the entry-point group ``faultlab.slas`` (``registry.py``) and it is
judged from the same records.

Why a package of its own, beneath ``spec`` and ``judge``: the spec builds ``Expect`` from the
declarations when it is imported, and the spec may not import the judge (the judge reads
experiments: imports point one way). So the declarations, a team's included, live where both
may import them. It may import ``faultlab.errors`` only. What a declaration
needs to know of a run reaches it as :class:`Evidence`, which ``faultlab.judge`` builds from
the records and answers with ``faultlab.observe``: one contract, read by the spec for its YAML
half and by the judge for its verdict half, with no registry of either kept in step by hand.

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
from faultlab.sla.registry import ENTRY_POINT_GROUP, slas

__all__ = ["ENTRY_POINT_GROUP", "NOISE_K_DEFAULT", "Evidence", "Kind", "Outcome", "Sla", "slas"]
