"""The documents: an ``Experiment``, and ``Suite`` (the older list of experiment files),
each validated as a whole.

An experiment's sections are models of their own, each checking itself: ``target``,
``topology`` and ``run`` (``faultlab.spec.target``), ``faults`` (``faultlab.spec.faults``, a
fault's ``params`` against that fault's own ``Params`` included) and ``expect``
(``faultlab.spec.expect``). Rules that span sections — a rank inside the world size, what a
fault needs against what the topology's launcher offers, a trigger inside the run, the
trainer's config against ``run`` and the seed — are checked here, so
``Experiment.model_validate(data)`` from Python is exactly as strict as loading a YAML file.
Every model is frozen, rejects unknown keys and does not coerce (``"10"`` is not an integer).
``faultlab.spec.loader`` turns the errors into located ``Problem`` s.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import BeforeValidator, Field, PrivateAttr, ValidationInfo, field_validator
from pydantic_core import InitErrorDetails

from faultlab.fault_api.context import CONTEXT_CAPABILITIES, unmet
from faultlab.spec._base import SpecModel, as_tuple, located, slug_name, spec_error
from faultlab.spec._detection import detection_problems
from faultlab.spec._trainer import check_train_config
from faultlab.spec.checkpoint_args import steps_of_command
from faultlab.spec.expect import Expect
from faultlab.spec.faults import FaultSpec, Selector, Trigger
from faultlab.spec.observation import ObserveSpec
from faultlab.spec.target import (
    RunSpec,
    TargetSpec,
    Topology,
    launcher_class,
    launcher_offers,
    launchers_offering,
)
from faultlab.spec.trainers import get_trainer

__all__ = ["Experiment", "GoldenSpec", "JobSpec", "Suite"]


class JobSpec(SpecModel):
    """What an experiment and a campaign (``faultlab.spec.campaign``) share: the job under
    test, how it runs, and what faultlab reads from it."""

    document: ClassVar[str] = "job"
    """What the document is called in messages (``experiment name``)."""

    name: str
    """Identifier of the document: lowercase letters, digits, ``_`` and ``-``."""
    description: str | None = None
    """What it shows, in a sentence or two."""
    seed: int = Field(default=0, ge=0, lt=2**63)
    """Seed of the trainer and of every random choice of faultlab (targets, MTBF draws, a
    campaign's schedule)."""
    topology: Topology = Field(default_factory=Topology)
    """Nodes, ranks per node, elasticity and backend of the job."""
    run: RunSpec = RunSpec()
    """Steps, checkpoint interval and the timeout."""
    target: TargetSpec = TargetSpec()
    """The trainer under test (the reference trainer unless a command is given)."""
    observe: ObserveSpec = ObserveSpec()
    """What faultlab reads from the job's output beside its events (``log_pattern``)."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return slug_name(value, f"{cls.document} name")

    @property
    def planned_steps(self) -> int | None:
        """The steps the job runs, for a progress line: ``run.steps`` when it was given or the
        trainer is a registered one (faultlab passes it on); for a command of the user's own,
        the number its arguments name (``--steps 30``, ``max_steps=30`` ...:
        ``steps_of_command``); None when nothing says (``run.steps`` is then only the
        schedule's horizon, not what the trainer runs)."""
        if self.target.command is None or "steps" in self.run.model_fields_set:
            return self.run.steps
        return steps_of_command(self.target.command)

    @field_validator("target")
    @classmethod
    def _launch_fits(cls, value: TargetSpec, info: ValidationInfo) -> TargetSpec:
        topology: Topology | None = info.data.get("topology")
        if topology is not None and value.services and \
                "services" not in launcher_offers(topology.launcher):
            hosts = launchers_offering(["services"])
            what = CONTEXT_CAPABILITIES["services"].description
            raise located([spec_error(("services",), f"services run beside the nodes only where "
                                      f"the target offers them ({what}): topology.launcher "
                                      f"{topology.launcher!r} does not; launchers that do: "
                                      f"{', '.join(hosts)}", list(value.services))])
        if topology is None:
            return value
        check = getattr(launcher_class(topology.launcher), "check_launch", None)
        problems = [] if check is None else check(value, topology)  # Target.check_launch
        if problems:
            raise located([_launch_error(path, message, value) for path, message in problems])
        return value

    @field_validator("target")
    @classmethod
    def _train_config(cls, value: TargetSpec, info: ValidationInfo) -> TargetSpec:
        if value.trainer is not None:
            run = info.data.get("run") or RunSpec()
            trainer = get_trainer(value.trainer)
            errors = check_train_config(trainer, preset=value.preset or trainer.presets[0],
                                        overrides=value.overrides, steps=run.steps,
                                        checkpoint_every=run.checkpoint_every,
                                        seed=info.data.get("seed", 0))
            if errors:
                raise located(errors)
        return value


class GoldenSpec(SpecModel):
    """How the fault-free reference is computed (on the experiment's own target)."""

    runs: int = Field(default=1, ge=1, le=2)
    """Fault-free runs: 2 also measures whether the trainer is reproducible (two runs that
    differ make ``bitwise_equal_to_golden`` not measured) and its run-to-run noise
    (``matches_golden_within_noise``, which asks for 2 itself)."""


class Experiment(JobSpec):
    """One experiment: run the target with this topology, inject the faults, judge ``expect``.
    """

    document: ClassVar[str] = "experiment"

    faults: Annotated[tuple[FaultSpec, ...], BeforeValidator(as_tuple)] = ()
    """The faults to inject, in any order (each has its own trigger)."""
    expect: Expect = Expect()
    """SLAs judged after the run."""
    golden: GoldenSpec = GoldenSpec()
    """The fault-free reference run(s) the bitwise and noise verdicts compare with."""
    _campaign: bool = PrivateAttr(default=False)
    """Compiled from a campaign (``as_campaign``): its score counts every alarm, restart and
    unclean exit of the golden run as a false positive."""

    def as_campaign(self) -> Experiment:
        """This experiment as a campaign runs it (``faultlab.spec.campaign.compile_campaign``)."""
        compiled = self.model_copy()
        compiled._campaign = True
        return compiled

    @property
    def scored_for_detection(self) -> bool:
        """The run is scored for detection: signals are declared, or a fault that slows the
        job or corrupts silently is injected (the trainer's anomalies may catch it)."""
        return bool(self.observe.detections) or any(
            f.fault_class.slows_job or f.fault_class.corrupts_silently for f in self.faults)

    @property
    def counts_golden_alarms(self) -> bool:
        """A verdict of this experiment counts what its golden run's monitors reported: a
        campaign's false positives, ``false_alarms``, or a run ``scored_for_detection``. The
        golden run's key then holds the trainer's monitor settings
        (``faultlab.engine.golden``): they change no bit, but they decide those alarms."""
        return (self._campaign or self.expect.false_alarms is not None
                or self.scored_for_detection)

    @property
    def golden_runs(self) -> int:
        """Fault-free runs needed: none without a verdict that compares with them."""
        if self.expect.matches_golden_within_noise is not None:
            return 2
        if self.expect.bitwise_equal_to_golden is not None:
            return self.golden.runs
        return self.golden.runs if self.expect.false_alarms is not None else 0

    @field_validator("expect")
    @classmethod
    def _detection_fits(cls, expect: Expect, info: ValidationInfo) -> Expect:
        errors = detection_problems(expect, info.data.get("target"), info.data.get("observe"),
                                    info.data.get("faults"))
        if errors:
            raise located(errors)
        return expect

    @field_validator("expect")
    @classmethod
    def _noise_needs_losses(cls, expect: Expect, info: ValidationInfo) -> Expect:
        target: TargetSpec | None = info.data.get("target")
        observe: ObserveSpec | None = info.data.get("observe")
        if expect.matches_golden_within_noise is not None and target is not None and \
                target.command and not (observe and observe.log_pattern):
            raise located([spec_error(
                ("matches_golden_within_noise",),
                "needs the loss of every step of your trainer to compare with its fault-free "
                "runs: set observe.log_pattern (a regular expression with the groups step and "
                "loss, e.g. 'step (?P<step>\\d+) loss (?P<loss>\\S+)')",
                expect.matches_golden_within_noise)])
        return expect

    @field_validator("faults")
    @classmethod
    def _faults_fit(cls, faults: tuple[FaultSpec, ...],
                    info: ValidationInfo) -> tuple[FaultSpec, ...]:
        topology: Topology | None = info.data.get("topology")
        run: RunSpec | None = info.data.get("run")
        target: TargetSpec | None = info.data.get("target")
        errors: list[InitErrorDetails] = []
        out = []
        first_at: dict[str, int] = {}
        for i, fault in enumerate(faults):
            if fault.id is None:
                fault = fault.model_copy(update={"id": f"{fault.type}-{i}"})
            if fault.id in first_at:
                errors.append(spec_error((i, "id"), f"duplicate fault id {fault.id!r} (also "
                                         f"faults[{first_at[fault.id]}]); ids must be unique",
                                         fault.id))
            first_at.setdefault(fault.fault_id, i)
            if topology is not None:
                errors += _target_in_range(i, fault.target, topology)
                errors += _launcher_fits(i, fault, topology)
            why = None if target is None else fault.fault_class.refuses_target(target)
            if why is not None:
                errors.append(spec_error((i, "type"), f"{fault.type}: {why}", fault.type))
            misfit = None if target is None else \
                fault.fault_class.refuses_params(fault.params, target)
            if misfit is not None:
                errors.append(spec_error((i, "params", misfit[0]), f"{fault.type}: {misfit[1]}",
                                         getattr(fault.params, misfit[0], None)))
            if run is not None:
                errors += _trigger_in_run(i, fault.trigger, run)
            out.append(fault)
        if errors:
            raise located(errors)
        return tuple(out)


def _target_in_range(i: int, target: Selector, topology: Topology) -> list[InitErrorDetails]:
    if target.kind == "rank" and target.value >= topology.world_size:  # type: ignore[operator]
        return [spec_error((i, "target", "rank"), f"rank {target.value} does not exist: the "
                           f"job has {_count(topology.world_size, 'rank')} "
                           f"(0..{topology.world_size - 1} = topology.nodes × procs_per_node)",
                           target.value)]
    if target.kind == "node" and target.value >= topology.nodes:  # type: ignore[operator]
        return [spec_error((i, "target", "node"), f"node {target.value} does not exist: the "
                           f"job has {_count(topology.nodes, 'node')} (0..{topology.nodes - 1})",
                           target.value)]
    return []


def _launcher_fits(i: int, fault: FaultSpec, topology: Topology) -> list[InitErrorDetails]:
    """The fault's error when the target ``topology.launcher`` names does not offer every
    context capability it ``needs`` (which, what it is, and the launchers that offer it all), or
    when the fault ``refuses`` the topology."""
    needs = fault.fault_class.needs
    missing = unmet(needs, launcher_offers(topology.launcher)) if needs else []
    if not missing:
        why = fault.fault_class.refuses(topology)
        return [] if why is None else [spec_error((i, "type"), f"{fault.type}: {why}",
                                                  fault.type)]
    hosts = launchers_offering(needs)
    what = " and ".join(f"{n} ({CONTEXT_CAPABILITIES[n].description})" for n in missing)
    those = "launchers that do" if len(needs) == 1 else "launchers that offer all it needs"
    where = f"{those}: {', '.join(hosts)}" if hosts else "no registered launcher does"
    return [spec_error((i, "type"), f"{fault.type} needs {what}, which launcher "
                       f"{topology.launcher!r} does not offer; {where}", fault.type)]


def _launch_error(path: tuple[str | int, ...], message: str, target: TargetSpec
                  ) -> InitErrorDetails:
    """A ``check_launch`` problem (a path under the experiment) as an error of the ``target``
    field, showing the value found there; a path outside ``target`` is named in the message."""
    if not path or path[0] != "target":
        return spec_error((), f"{'.'.join(map(str, path))}: {message}", None)
    value: Any = target
    for key in path[1:]:
        try:
            if isinstance(value, dict):
                value = value[key]
            elif isinstance(value, tuple | list) and isinstance(key, int):
                value = value[key]
            else:
                value = getattr(value, str(key))
        except (LookupError, AttributeError, TypeError):
            value = None
            break
    if isinstance(value, tuple):
        value = list(value)
    return spec_error(path[1:], message, value)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _trigger_in_run(i: int, trigger: Trigger, run: RunSpec) -> list[InitErrorDetails]:
    never = "so the fault would never fire"
    if trigger.at_step is not None and trigger.at_step > run.steps:
        return [spec_error((i, "trigger", "at_step"), f"step {trigger.at_step} is past the "
                           f"end of the run (run.steps = {run.steps}), {never}",
                           trigger.at_step)]
    if trigger.at_time_s is not None and trigger.at_time_s >= run.timeout_s:
        return [spec_error((i, "trigger", "at_time_s"), f"{trigger.at_time_s:g} s is not "
                           f"before the experiment's timeout (run.timeout_s = "
                           f"{run.timeout_s:g}), {never}", trigger.at_time_s)]
    if trigger.every is not None and trigger.every.start_after_s >= run.timeout_s:
        return [spec_error((i, "trigger", "every", "start_after_s"),
                           f"{trigger.every.start_after_s:g} s is not before the experiment's "
                           f"timeout (run.timeout_s = {run.timeout_s:g}), {never}",
                           trigger.every.start_after_s)]
    return []


class Suite(SpecModel):
    """A list of experiment files run in order: one verdict each and one overall."""

    name: str
    """Identifier of the suite: lowercase letters, digits, ``_`` and ``-``."""
    description: str | None = None
    """What the suite is for."""
    suite: Annotated[tuple[Annotated[str, Field(min_length=1)], ...],
                     BeforeValidator(as_tuple), Field(min_length=1)]
    """Experiment (or suite) files, relative to this file."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return slug_name(value, "suite name")
