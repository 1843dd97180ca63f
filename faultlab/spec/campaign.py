"""The campaign document: a month of a cluster's failures compressed into minutes.

    name: campaign_reference
    seed: 7
    target: {trainer: reference, preset: tiny}
    topology: {nodes: 2, procs_per_node: 1}
    run: {steps: 80, checkpoint_every: 10, timeout_s: 150}
    campaign:
      mtbf_steps: 12          # mean training steps between failures of the whole job
      start_after_step: 5     # no fault before step 6 (until_step: the last one; default
                              # run.steps - 1)
      mix:                    # each arrival is one entry, drawn by weight
        - {type: rank_kill, weight: 3, target: random, params: {signal: KILL}}
        - {type: grad_nan, weight: 1, target: random}
    expect:
      completes: true
      ettr: 0.4               # campaign SLAs (faultlab.observe.campaign) beside the usual ones
      detection_rate: 0.9

A file is a campaign when it has a ``campaign`` key (a suite has ``suite``). It has an
experiment's sections except ``faults``: those come from the mix. ``compile_campaign`` turns it
into an ordinary ``Experiment`` whose faults are the seeded schedule (concrete triggers and
victims), so it runs through ``run_experiment`` with every guarantee of one (undo, guard,
journal). Each mix entry is validated as a fault of that experiment (its params, its victim
against the topology, whether the target accepts its type) and located at
``campaign.mix[i]``.

Two clocks, exactly one per campaign:

``mtbf_steps`` (the step clock; the shipped campaigns use it)
    Arrivals are a Poisson process over training progress: the k-th arrives at step
    ``ceil(x_k)``, ``x_k`` the running sum of exponential gaps of mean ``mtbf_steps`` from
    ``start_after_step``, and fires through an ``at_step`` trigger. A step-triggered fault meets
    the job right after that step, held there by the step gate (``faultlab.runtime.gates``),
    so where each fault lands, what the job does about it and how it is scored do not depend
    on the machine's load: the same seed gives the same schedule, the same scoring and the same
    verdict. What this clock cannot do: strike while the job is down or replaying lost steps
    (no new step is made then, so the next arrival waits for the first new one). Overlaps it
    does make, deterministically: arrivals drawn onto the same step strike together, and a fault
    undone ``until: reaction`` stays in force, step after step, until the job reacts.
``mtbf_s`` (the wall clock)
    Arrivals in seconds after the launch (gaps of mean ``mtbf_s``, in
    ``[start_after_s, duration_s)``), fired by ``at_time_s`` triggers: as a real cluster's
    failures come, also while the job starts, restarts or replays. Where each one lands then
    depends on how fast the job runs on that machine at that moment, so the scoring and the
    verdict of one seed can differ from run to run (``faultlab run --repeat N`` shows by how
    much).

The schedule is a pure function of the document: ``numpy.random.default_rng(seed)`` draws, per
arrival, an exponential gap, the mix entry (probability weight ÷ sum of weights) and, for a
``random`` victim, the rank or node — always the same three draws, so the same seed gives the
same schedule. ``seed`` is the document's, which also seeds the job, unless ``campaign.seed``
gives the schedule its own: the arrivals then change without changing what the job computes,
so its golden run is that of every experiment of the same job (``faultlab.engine.golden``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

import numpy as np
from pydantic import BeforeValidator, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails

from faultlab.sla import campaign_slas
from faultlab.spec._base import SpecModel, as_tuple, located, relocate, spec_error
from faultlab.spec.expect import Expect, expect_model
from faultlab.spec.faults import Selector
from faultlab.spec.model import Experiment, JobSpec

__all__ = ["Campaign", "CampaignExpect", "CampaignSpec", "MixEntry", "Planned",
           "campaign_schedule", "compile_campaign"]

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

    def fault_dict(self, target: Selector, trigger: dict[str, Any], fault_id: str
                   ) -> dict[str, Any]:
        d: dict[str, Any] = {"id": fault_id, "type": self.type, "params": self.params,
                             "target": target.model_dump(), "trigger": trigger}
        if self.duration_s is not None:
            d["duration_s"] = self.duration_s
        if self.until is not None:
            d["until"] = self.until
        return d


class CampaignSpec(SpecModel):
    """What ``campaign:`` holds: the failure rate on one of two clocks, its window and the mix
    (module docstring)."""

    mtbf_steps: float | None = Field(default=None, gt=0)
    """Mean training steps between failures of the whole job (the step clock: reproducible)."""
    start_after_step: int | None = Field(default=None, ge=0)
    """Step clock: no fault at or before this step (the job's start-up). Default 0."""
    until_step: int | None = Field(default=None, ge=1)
    """Step clock: no fault after this step. Default ``run.steps - 1`` (a fault after the last
    step has nothing left to break)."""
    mtbf_s: float | None = Field(default=None, gt=0)
    """Mean seconds between failures of the whole job (the wall clock: a cluster's month
    compressed into minutes; where faults land varies run to run)."""
    duration_s: float | None = Field(default=None, gt=0)
    """Wall clock: faults arrive before this many seconds after the launch (arrivals after the
    job finished are not injected, and reported so)."""
    start_after_s: float | None = Field(default=None, ge=0)
    """Wall clock: no fault before this many seconds (the job's start-up). Default 0."""
    mix: Annotated[tuple[MixEntry, ...], BeforeValidator(as_tuple), Field(min_length=1)]
    """The fault mix: each arrival is one entry, drawn with probability weight ÷ total."""
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    """The schedule's own seed. Default: the document's ``seed``, which also seeds the job.
    With it, the arrivals change while the job computes what it did: its golden run stays the
    one every experiment of the same job (trainer, seed, steps, topology) shares."""

    @property
    def clock(self) -> str:
        """``steps`` or ``seconds``."""
        return "steps" if self.mtbf_steps is not None else "seconds"

    @model_validator(mode="after")
    def _window(self) -> CampaignSpec:
        errors: list[InitErrorDetails] = []
        steps_keys = [k for k in ("start_after_step", "until_step") if getattr(self, k) is not None]
        seconds_keys = [k for k in ("duration_s", "start_after_s") if getattr(self, k) is not None]
        if (self.mtbf_steps is None) == (self.mtbf_s is None):
            got = "both" if self.mtbf_steps is not None else "neither"
            errors.append(spec_error(("mtbf_steps",), f"set exactly one of mtbf_steps (arrivals "
                                     f"by training step: the same seed gives the same scoring "
                                     f"and verdict every run) and mtbf_s (arrivals by seconds "
                                     f"since the launch: faults also strike while the job "
                                     f"restarts, but where they land varies with the load); "
                                     f"got {got}", self.mtbf_steps))
        elif self.mtbf_steps is not None:
            if self.mtbf_steps < 1:
                errors.append(spec_error(("mtbf_steps",), f"{self.mtbf_steps:g} steps between "
                                         f"faults is less than one: no step could finish "
                                         f"between two faults; make it several checkpoint "
                                         f"intervals (e.g. 20)", self.mtbf_steps))
            errors += [spec_error((k,), f"{k} is a window in seconds, for the wall clock "
                                  f"(mtbf_s); with mtbf_steps use start_after_step and "
                                  f"until_step", getattr(self, k)) for k in seconds_keys]
            start, until = self.start_after_step or 0, self.until_step
            if until is not None and start >= until:
                errors.append(spec_error(("start_after_step",), f"step {start} is not before "
                                         f"campaign.until_step ({until}), so no fault would "
                                         f"arrive", start))
        else:
            errors += [spec_error((k,), f"{k} is a window in steps, for the step clock "
                                  f"(mtbf_steps); with mtbf_s use start_after_s and "
                                  f"duration_s", getattr(self, k)) for k in steps_keys]
            if self.duration_s is None:
                errors.append(spec_error(("duration_s",), "the wall clock (mtbf_s) needs "
                                         "duration_s: faults arrive before this many seconds "
                                         "after the launch", None))
            elif (self.start_after_s or 0.0) >= self.duration_s:
                errors.append(spec_error(("start_after_s",), f"{self.start_after_s:g} s is not "
                                         f"before campaign.duration_s ({self.duration_s:g} s), "
                                         f"so no fault would arrive", self.start_after_s))
        if errors:
            raise located(errors)
        return self


class _CampaignExpectBase(Expect):
    """What a campaign's ``expect`` has besides the fields of its own SLAs."""

    def experiment_part(self) -> Expect:
        return Expect(**{k: getattr(self, k) for k in Expect.model_fields
                         if getattr(self, k) is not None})

    def campaign_items(self) -> list[tuple[str, Any]]:
        """``(key, bound)`` of each campaign SLA that is set, in the declarations' order."""
        return [(k, getattr(self, k)) for k in campaign_slas() if getattr(self, k) is not None]


if TYPE_CHECKING:
    class CampaignExpect(_CampaignExpectBase):
        """A campaign's SLAs: every experiment key, and one field per campaign SLA."""

        def __getattr__(self, key: str) -> Any: ...
else:
    CampaignExpect = expect_model(campaign_slas(), "CampaignExpect", _CampaignExpectBase,
                                  "A campaign's SLAs: every experiment key, and the campaign's "
                                  "own.")


class Campaign(JobSpec):
    """A campaign document: an experiment whose faults arrive from a seeded, weighted mix."""

    document: ClassVar[str] = "campaign"

    campaign: CampaignSpec
    """The failure rate, its window and the fault mix."""
    expect: CampaignExpect = CampaignExpect()
    """SLAs: the campaign's (``ettr`` ...) and any experiment key (``completes`` ...)."""

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
        spec = self.campaign
        if spec.duration_s is not None and spec.duration_s > self.run.timeout_s:
            errors.append(spec_error(("campaign", "duration_s"), f"faults would arrive after "
                                     f"the experiment's timeout (run.timeout_s = "
                                     f"{self.run.timeout_s:g}); make duration_s at most that",
                                     spec.duration_s))
        if spec.until_step is not None and spec.until_step >= self.run.steps:
            errors.append(spec_error(("campaign", "until_step"), f"step {spec.until_step} is "
                                     f"not before the job's last step (run.steps = "
                                     f"{self.run.steps}); a fault after the last step has "
                                     f"nothing left to break", spec.until_step))
        elif spec.clock == "steps" and (spec.start_after_step or 0) >= self.last_step:
            errors.append(spec_error(("campaign", "start_after_step"), f"step "
                                     f"{spec.start_after_step} leaves no step before the last "
                                     f"one (run.steps = {self.run.steps}) for a fault",
                                     spec.start_after_step))
        # A step trigger in the probe: a step window (params.num_steps) needs one.
        trigger = {"at_step": 1} if spec.clock == "steps" else {"at_time_s": 0.0}
        probe = self._experiment_dict([e.fault_dict(e.target, trigger, f"mix-{i}")
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

    @property
    def schedule_seed(self) -> int:
        """The seed the arrivals are drawn from: ``campaign.seed``, else the document's."""
        return self.campaign.seed if self.campaign.seed is not None else self.seed

    @property
    def last_step(self) -> int:
        """The last step a step-clock arrival may land on."""
        spec = self.campaign
        return spec.until_step if spec.until_step is not None else self.run.steps - 1

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
    at_step: int | None
    """Step clock: it strikes right after this step (None on the wall clock)."""
    at_s: float | None
    """Wall clock: seconds after the launch (None on the step clock)."""
    entry: int
    """Index of its mix entry."""
    type: str
    victim: Selector

    @property
    def fault_id(self) -> str:
        return f"c{self.index:03d}-{self.type}"

    @property
    def trigger(self) -> dict[str, Any]:
        return {"at_step": self.at_step} if self.at_step is not None \
            else {"at_time_s": self.at_s}

    @property
    def when(self) -> str:
        """``step 34`` or ``12.3 s``."""
        return f"step {self.at_step}" if self.at_step is not None else f"{self.at_s:g} s"


def campaign_schedule(campaign: Campaign) -> list[Planned]:
    """The seeded arrivals (module docstring): same document, same list."""
    spec = campaign.campaign
    weights = np.array([e.weight for e in spec.mix], dtype=float)
    probs = weights / weights.sum()
    rng = np.random.default_rng(campaign.schedule_seed)
    out: list[Planned] = []
    steps = spec.mtbf_steps is not None
    mean = spec.mtbf_steps if steps else spec.mtbf_s
    x = float(spec.start_after_step or 0) if steps else (spec.start_after_s or 0.0)
    end = campaign.last_step if steps else spec.duration_s
    assert mean is not None and end is not None  # the validators' work
    while len(out) < MAX_INJECTIONS:
        x += float(rng.exponential(mean))
        entry = int(rng.choice(len(spec.mix), p=probs))
        draw = float(rng.random())  # always drawn, used only by a random victim
        mix = spec.mix[entry]
        victim = _victim(campaign, mix, draw)
        if steps:
            if math.ceil(x) > end:
                break
            out.append(Planned(len(out), math.ceil(x), None, entry, mix.type, victim))
        else:
            if x >= end:
                break
            out.append(Planned(len(out), None, round(x, 3), entry, mix.type, victim))
    return out


def _victim(campaign: Campaign, mix: MixEntry, draw: float) -> Selector:
    if mix.target.kind != "random":
        return mix.target
    from faultlab.fault_api import fault_types

    first = next(k for k in fault_types()[mix.type].targets if k in ("rank", "node"))
    kind: Literal["rank", "node"] = "rank" if first == "rank" else "node"
    count = campaign.topology.world_size if kind == "rank" else campaign.topology.nodes
    return Selector(kind=kind, value=min(count - 1, int(draw * count)))


def compile_campaign(campaign: Campaign) -> Experiment:
    """The ordinary experiment that runs the campaign: one fault per arrival."""
    faults = [campaign.campaign.mix[p.entry].fault_dict(p.victim, p.trigger, p.fault_id)
              for p in campaign_schedule(campaign)]
    return Experiment.model_validate(campaign._experiment_dict(faults)).as_campaign()
