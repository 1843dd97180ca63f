"""The campaign document: a month of a cluster's failures compressed into minutes.

    name: campaign_reference
    seed: 7
    target: {trainer: reference, preset: tiny}
    topology: {nodes: 2, procs_per_node: 1}
    run: {steps: 80, checkpoint_every: 10, timeout_s: 150}
    campaign:
      duration_s: 40          # faults arrive in [start_after_s, duration_s) after the launch
      start_after_s: 4
      mtbf_s: 10              # mean time between failures of the whole job (Poisson arrivals)
      mix:                    # each arrival is one entry, drawn by weight
        - {type: rank_kill, weight: 3, target: random, params: {signal: KILL}}
        - {type: grad_nan, weight: 1, target: random}
    expect:
      completes: true
      ettr: 0.4               # campaign SLAs (faultlab.observe.campaign) beside the usual ones
      detection_rate: 0.9

A file is a campaign when it has a ``campaign`` key (a suite has ``suite``). It has an
experiment's sections except ``faults``: those come from the mix. ``compile_campaign`` turns it
into an ordinary ``Experiment`` whose faults are the seeded schedule (``at_time_s`` triggers,
concrete victims), so it runs through ``run_experiment`` with every guarantee of one (undo,
guard, journal). Each mix entry is validated as a fault of that experiment (its params, its
victim against the topology, whether the target accepts its type) and located at
``campaign.mix[i]``.

The schedule is a pure function of the document: ``numpy.random.default_rng(seed)`` draws, per
arrival, an exponential gap (mean ``mtbf_s``), the mix entry (probability weight ÷ sum of
weights) and, for a ``random`` victim, the rank or node — always the same three draws, so the
same seed gives the same schedule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from pydantic import BeforeValidator, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails

from faultlab.spec._base import SpecModel, as_tuple, located, relocate, slug_name, spec_error
from faultlab.spec.expect import Expect
from faultlab.spec.faults import Selector
from faultlab.spec.model import Experiment
from faultlab.spec.observation import ObserveSpec
from faultlab.spec.target import RunSpec, TargetSpec, Topology

__all__ = ["CAMPAIGN_SLAS", "Campaign", "CampaignExpect", "CampaignSpec", "MixEntry",
           "Planned", "campaign_schedule", "compile_campaign"]

MAX_INJECTIONS = 1000
"""Most arrivals a campaign may schedule (a tiny ``mtbf_s`` must not make an endless list)."""


class MixEntry(SpecModel):
    """One kind of failure of the mix: a fault, its victim selection and its weight."""

    type: str
    """Fault type, e.g. ``rank_kill`` (``faultlab list faults``)."""
    weight: float
    """Relative share of the arrivals, > 0 (e.g. the percentage of a published breakdown)."""
    target: Selector = Selector(kind="random")
    """Victim: ``random`` (drawn per arrival from the seed), ``{rank: N}``, ``{node: N}`` or
    ``all``."""
    params: dict[str, Any] = Field(default_factory=dict)
    """The fault's own parameters (checked against its ``Params``)."""
    duration_s: float | None = Field(default=None, gt=0)
    """Undo a reversible fault after this many seconds."""
    until: str | None = None
    """``reaction``: undo a reversible fault once the job reacts to it."""
    source: str | None = None
    """Where the weight comes from (shown in reports; ``faultlab campaign init`` fills it)."""

    @field_validator("weight")
    @classmethod
    def _positive(cls, value: float) -> float:
        if not value > 0:
            raise ValueError(f"a weight must be positive (the entry's share of the arrivals), "
                             f"got {value!r}; remove the entry to leave this fault out")
        return value

    def fault_dict(self, target: Selector, at_time_s: float, fault_id: str) -> dict[str, Any]:
        d: dict[str, Any] = {"id": fault_id, "type": self.type, "params": self.params,
                             "target": target.model_dump(), "trigger": {"at_time_s": at_time_s}}
        if self.duration_s is not None:
            d["duration_s"] = self.duration_s
        if self.until is not None:
            d["until"] = self.until
        return d


class CampaignSpec(SpecModel):
    """What ``campaign:`` holds: the failure rate, its window and the mix."""

    mtbf_s: float = Field(gt=0)
    """Mean time between failures of the whole job, seconds (compressed: a cluster's month
    into minutes)."""
    duration_s: float = Field(gt=0)
    """Faults arrive before this many seconds after the launch (the job itself runs
    ``run.steps``; arrivals after it finished are not injected, and reported so)."""
    start_after_s: float = Field(default=0.0, ge=0)
    """No fault before this many seconds (the job's start-up)."""
    mix: Annotated[tuple[MixEntry, ...], BeforeValidator(as_tuple), Field(min_length=1)]
    """The fault mix: each arrival is one entry, drawn with probability weight ÷ total."""

    @model_validator(mode="after")
    def _window(self) -> CampaignSpec:
        if self.start_after_s >= self.duration_s:
            raise located([spec_error(("start_after_s",), f"{self.start_after_s:g} s is not "
                                      f"before campaign.duration_s ({self.duration_s:g} s), so "
                                      f"no fault would arrive", self.start_after_s)])
        return self


CAMPAIGN_SLAS = ("ettr", "detection_rate", "attribution_accuracy", "false_positives_per_hour",
                 "recovery_time_p95_s")
"""The campaign's own ``expect`` keys, judged by ``faultlab.observe.campaign``."""


class CampaignExpect(Expect):
    """A campaign's SLAs: every experiment key, and the campaign's own."""

    ettr: float | None = Field(default=None, gt=0, le=1)
    """Lower bound on the effective training time ratio: useful step time ÷ wall time."""
    detection_rate: float | None = Field(default=None, ge=0, le=1)
    """Lower bound on the fraction of injections the job detected."""
    attribution_accuracy: float | None = Field(default=None, ge=0, le=1)
    """Lower bound on the fraction of attributable detected injections whose victim the job
    named."""
    false_positives_per_hour: float | None = Field(default=None, ge=0)
    """Upper bound on the golden run's detections, restarts and anomalies per hour."""
    recovery_time_p95_s: float | None = Field(default=None, gt=0)
    """Upper bound on the 95th percentile of the injections' recovery time, seconds."""

    def experiment_part(self) -> Expect:
        return Expect(**{k: getattr(self, k) for k in Expect.model_fields
                         if getattr(self, k) is not None})

    def campaign_items(self) -> list[tuple[str, float]]:
        return [(k, getattr(self, k)) for k in CAMPAIGN_SLAS if getattr(self, k) is not None]


class Campaign(SpecModel):
    """A campaign document: an experiment whose faults arrive from a seeded, weighted mix."""

    name: str
    """Identifier of the campaign: lowercase letters, digits, ``_`` and ``-``."""
    description: str | None = None
    """What the campaign shows."""
    seed: int = Field(default=0, ge=0, lt=2**63)
    """Seed of the schedule (times, mix entries, victims) and of the trainer."""
    topology: Topology = Topology()
    """Nodes, ranks per node, elasticity and backend of the job."""
    run: RunSpec = RunSpec()
    """Steps, checkpoint interval and the timeout."""
    target: TargetSpec = TargetSpec()
    """The trainer under test."""
    campaign: CampaignSpec
    """The failure rate, its window and the fault mix."""
    expect: CampaignExpect = CampaignExpect()
    """SLAs: the campaign's (``ettr`` ...) and any experiment key (``completes`` ...)."""
    observe: ObserveSpec = ObserveSpec()
    """What faultlab reads from the job's output beside its events."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return slug_name(value, "campaign name")

    @model_validator(mode="after")
    def _mix_fits(self) -> Campaign:
        """Each mix entry, as a fault of this job: params, victim, target, launcher."""
        errors: list[InitErrorDetails] = []
        for i, entry in enumerate(self.campaign.mix):
            if entry.duration_s is not None and entry.duration_s >= self.run.timeout_s:
                errors.append(spec_error(("campaign", "mix", i, "duration_s"),
                                         f"{entry.duration_s:g} s is not shorter than "
                                         f"run.timeout_s ({self.run.timeout_s:g} s)",
                                         entry.duration_s))
        if self.campaign.duration_s > self.run.timeout_s:
            errors.append(spec_error(("campaign", "duration_s"), f"faults would arrive after "
                                     f"the experiment's timeout (run.timeout_s = "
                                     f"{self.run.timeout_s:g}); make duration_s at most that",
                                     self.campaign.duration_s))
        probe = self._experiment_dict([e.fault_dict(e.target, 0.0, f"mix-{i}")
                                       for i, e in enumerate(self.campaign.mix)])
        try:
            Experiment.model_validate(probe)
        except ValidationError as e:
            for err in relocate(e, ()):
                loc = tuple(err["loc"])
                if loc[:1] == ("faults",) and len(loc) > 1:
                    rest = tuple(p for p in loc[2:] if p != "trigger")
                    err["loc"] = ("campaign", "mix", loc[1], *rest)
                errors.append(err)
        if errors:
            raise located(errors)
        return self

    def _experiment_dict(self, faults: list[dict[str, Any]]) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "seed": self.seed,
                "topology": self.topology.model_dump(mode="json", exclude_none=True),
                "run": self.run.model_dump(mode="json"),
                "target": self.target.model_dump(mode="json", exclude_none=True),
                "observe": self.observe.model_dump(mode="json", exclude_none=True),
                "expect": self.expect.experiment_part().model_dump(mode="json",
                                                                   exclude_none=True),
                "faults": faults}


@dataclass(frozen=True, slots=True)
class Planned:
    """One arrival of the schedule."""

    index: int
    """Its number in the schedule (0-based)."""
    at_s: float
    """Seconds after the launch."""
    entry: int
    """Index of its mix entry."""
    type: str
    victim: Selector

    @property
    def fault_id(self) -> str:
        return f"c{self.index:03d}-{self.type}"


def campaign_schedule(campaign: Campaign) -> list[Planned]:
    """The seeded arrivals (module docstring): same document, same list."""
    spec = campaign.campaign
    weights = np.array([e.weight for e in spec.mix], dtype=float)
    probs = weights / weights.sum()
    rng = np.random.default_rng(campaign.seed)
    out: list[Planned] = []
    t = spec.start_after_s
    while len(out) < MAX_INJECTIONS:
        t += float(rng.exponential(spec.mtbf_s))
        entry = int(rng.choice(len(spec.mix), p=probs))
        draw = float(rng.random())  # always drawn, used only by a random victim
        if t >= spec.duration_s:
            break
        mix = spec.mix[entry]
        out.append(Planned(len(out), round(t, 3), entry, mix.type,
                           _victim(campaign, mix, draw)))
    return out


def _victim(campaign: Campaign, mix: MixEntry, draw: float) -> Selector:
    if mix.target.kind != "random":
        return mix.target
    from faultlab.faults import fault_types

    kind = next(k for k in fault_types()[mix.type].targets if k in ("rank", "node"))
    count = campaign.topology.world_size if kind == "rank" else campaign.topology.nodes
    return Selector(kind=kind, value=min(count - 1, int(draw * count)))


def compile_campaign(campaign: Campaign) -> Experiment:
    """The ordinary experiment that runs the campaign: one fault per arrival."""
    faults = [campaign.campaign.mix[p.entry].fault_dict(p.victim, p.at_s, p.fault_id)
              for p in campaign_schedule(campaign)]
    return Experiment.model_validate(campaign._experiment_dict(faults))

