"""The experiment schema and its YAML loader: documents validated as a whole, every error
located (``my_job.yaml:14 faults[1].trigger.at_step: expected an integer, got 'ten'``).

    load_experiments(["experiments/prelaunch.yaml"], seed=7)  # suites expanded, all validated
    load_document("experiments/prelaunch.yaml")               # a PlannedSuite: experiments + plan
    describe_schedule(exp)                                    # what a dry run prints

It may import ``faultlab.errors``, ``faultlab.fault_api`` (each ``faults:`` entry is checked
against its fault's declaration) and ``faultlab.sla`` (the ``Expect`` model is built from the
SLA declarations); it is the start of the data flow, so nothing downstream of it.
"""

from faultlab.spec._suite import Plan, PlannedSuite, SuiteSpec
from faultlab.spec.campaign import Campaign, CampaignExpect, campaign_schedule, compile_campaign
from faultlab.spec.expect import Expect
from faultlab.spec.faults import EVENT_KINDS, AfterEvent, Every, FaultSpec, Selector, Trigger
from faultlab.spec.loader import (
    experiment_from_dict,
    load_campaign,
    load_document,
    load_experiment,
    load_experiments,
    parse_document,
    parse_experiment,
)
from faultlab.spec.model import Experiment, Suite
from faultlab.spec.observation import ObserveSpec
from faultlab.spec.schedule import arrival_times_s, describe_schedule, resolve_selector
from faultlab.spec.target import RunSpec, TargetSpec, Topology

__all__ = [
    "EVENT_KINDS",
    "AfterEvent",
    "Campaign",
    "CampaignExpect",
    "Every",
    "Expect",
    "Experiment",
    "FaultSpec",
    "ObserveSpec",
    "Plan",
    "PlannedSuite",
    "RunSpec",
    "Selector",
    "Suite",
    "SuiteSpec",
    "TargetSpec",
    "Topology",
    "Trigger",
    "arrival_times_s",
    "campaign_schedule",
    "compile_campaign",
    "describe_schedule",
    "experiment_from_dict",
    "load_campaign",
    "load_document",
    "load_experiment",
    "load_experiments",
    "parse_document",
    "parse_experiment",
    "resolve_selector",
]
