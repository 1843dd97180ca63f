"""The experiment schema: what an experiment document may say, validated as a whole.

Every model is frozen, rejects unknown keys and does not coerce (``"10"`` is not an
integer). Rules that span several parts of the document — a rank inside the world size, a
trigger inside the run, a fault's ``params`` against that fault's own ``Params`` — are
checked here too, so ``Experiment.model_validate(data)`` from Python is exactly as strict as
loading a YAML file. ``faultlab.spec.loader`` turns the errors into located ``Problem`` s.
"""

from __future__ import annotations

import builtins
import re
import shlex
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, cast

from pydantic import (
    BeforeValidator,
    Field,
    SerializeAsAny,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails

from faultlab.faults import Fault, FaultParams, fault_types
from faultlab.spec._base import SpecModel, choices, located, show, spec_error, unknown
from faultlab.spec._trainer import check_overrides, check_train_config
from reference_trainer.config import PRESETS

__all__ = [
    "EVENT_KINDS",
    "SLAS",
    "SLA_KINDS",
    "AfterEvent",
    "Every",
    "Expect",
    "Experiment",
    "FaultSpec",
    "RunSpec",
    "Selector",
    "Sla",
    "Suite",
    "TargetSpec",
    "Topology",
    "Trigger",
]

NAME_RE = re.compile(r"[a-z0-9_-]+")
ID_RE = re.compile(r"[A-Za-z0-9_.-]+")

EVENT_KINDS = ("start", "step", "checkpoint_saved", "checkpoint_loaded", "anomaly",
               "preemption_notice", "fault_injected", "final_digest", "exit")
"""Event kinds of the protocol (DESIGN.md) that ``after_event`` may wait for."""


def _as_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _slug_name(value: str, what: str, pattern: re.Pattern[str] = NAME_RE) -> str:
    if not pattern.fullmatch(value):
        slug = re.sub(r"[^a-z0-9_-]+", "_", value.lower()).strip("_") or "my_experiment"
        raise ValueError(f"{show(value)} is not a valid {what}: use only lowercase letters, "
                         f"digits, '_' and '-' (e.g. {slug!r})")
    return value


# ---------------------------------------------------------------------------------- target


class TargetSpec(SpecModel):
    """The job under test: the bundled reference trainer, or your own trainer's command."""

    trainer: Literal["reference"] | None = None
    """``reference``: the bundled FSDP2 trainer (the default unless ``command`` is given)."""
    preset: str | None = None
    """Model preset of the reference trainer, one of ``reference_trainer.config.PRESETS``."""
    overrides: dict[str, Any] = Field(default_factory=dict)
    """Reference-trainer settings by ``TrainConfig`` field name, e.g. ``global_batch: 12``."""
    command: Annotated[tuple[str, ...], Field(min_length=1)] | None = None
    """Your trainer's command (a list, or a string split like a shell would), run under
    torchrun by faultlab; it must emit the event protocol."""

    @model_validator(mode="before")
    @classmethod
    def _reference_by_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("command") is None:
            data = dict(data)
            if data.get("trainer") is None:
                data["trainer"] = "reference"
            if data.get("preset") is None:
                data["preset"] = "tiny"
        return data

    @field_validator("trainer", mode="before")
    @classmethod
    def _trainer(cls, value: Any) -> Any:
        if value is not None and value != "reference":
            raise ValueError(f"unknown trainer {show(value)}: the bundled trainer is "
                             f"'reference'; to run your own trainer, set command: [...] "
                             f"instead")
        return value

    @field_validator("preset")
    @classmethod
    def _preset(cls, value: str | None) -> str | None:
        if value is not None and value not in PRESETS:
            raise ValueError(unknown("preset", value, PRESETS, "choose from"))
        return value

    @field_validator("overrides")
    @classmethod
    def _overrides(cls, value: dict[str, Any]) -> dict[str, Any]:
        converted, errors = check_overrides(value)
        if errors:
            raise located(errors)
        return converted

    @field_validator("command", mode="before")
    @classmethod
    def _command(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return tuple(shlex.split(value))
            except ValueError as e:
                raise ValueError(f"cannot split {show(value)} into arguments: {e}; write "
                                 f"it as a list instead") from None
        return _as_tuple(value)

    @model_validator(mode="after")
    def _one_kind(self) -> TargetSpec:
        if self.command is None:
            return self
        errors = []
        if self.trainer is not None:
            errors.append(spec_error(("command",), "set either trainer (the bundled "
                                     "reference trainer) or command (your own), not both",
                                     list(self.command)))
        for key in ("preset", "overrides"):
            if getattr(self, key):
                errors.append(spec_error((key,), f"{key} applies to the reference trainer "
                                         f"only; pass your trainer's own flags in command",
                                         getattr(self, key)))
        if errors:
            raise located(errors)
        return self

    @property
    def is_reference(self) -> bool:
        return self.command is None


# -------------------------------------------------------------------------- topology, run


class Topology(SpecModel):
    """Shape of the job: ``nodes`` torchrun agents with ``procs_per_node`` ranks each."""

    nodes: int = Field(default=2, ge=1)
    """Number of nodes (torchrun agents)."""
    procs_per_node: int = Field(default=1, ge=1)
    """Ranks per node."""
    min_nodes: int | None = Field(default=None, ge=1)
    """Fewest nodes the job may shrink to (elastic); ``null`` means ``nodes`` (no shrinking)."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """Process-group backend; ``auto`` is NCCL with a GPU, else gloo."""
    max_restarts: int = Field(default=3, ge=0)
    """Restarts torchrun allows the job before it gives up."""
    launcher: Literal["local", "docker"] = "local"
    """Where the nodes run: ``local`` (torchrun agents on this host, sharing its network) or
    ``docker`` (one container per node on a bridge network of its own; needs a Docker engine,
    and is what the ``network`` faults and ``node_pause`` act on)."""

    @model_validator(mode="after")
    def _min_nodes(self) -> Topology:
        if self.min_nodes is not None and self.min_nodes > self.nodes:
            raise located([spec_error(("min_nodes",), f"min_nodes ({self.min_nodes}) cannot "
                                      f"exceed nodes ({self.nodes})", self.min_nodes)])
        return self

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def effective_min_nodes(self) -> int:
        return self.nodes if self.min_nodes is None else self.min_nodes


class RunSpec(SpecModel):
    """How long the experiment runs."""

    steps: int = Field(default=40, ge=1)
    """Training steps of the run (the schedule horizon)."""
    checkpoint_every: int = Field(default=10, ge=1)
    """Checkpoint after every N steps."""
    timeout_s: float = Field(default=300.0, gt=0)
    """Wall-clock limit of the whole experiment; past it the job is stopped and fails."""


# --------------------------------------------------------------------------------- faults


class Selector(SpecModel):
    """Which part of the job a fault hits: ``{rank: N}``, ``{node: N}``, ``random`` or ``all``.

    ``random`` draws a rank or a node (the fault's first target kind) from the experiment
    seed; see ``faultlab.spec.resolve_selector``. The attributes match ``faults.Victim``.
    """

    yaml_keys: ClassVar[tuple[str, ...] | None] = ("rank", "node")
    FORMS: ClassVar[str] = "{rank: N}, {node: N}, random or all"

    kind: Literal["rank", "node", "random", "all"]
    value: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_yaml(cls, data: Any) -> Any:
        if isinstance(data, str):
            if data in ("random", "all"):
                return {"kind": data}
            m = re.fullmatch(r"\s*(rank|node)\s*[:= ]?\s*(\d+)\s*", data)
            fix = f"; write {{{m[1]}: {m[2]}}}" if m else ""
            raise ValueError(f"expected {cls.FORMS}, got {show(data)}{fix}")
        if not isinstance(data, dict):
            raise ValueError(f"expected {cls.FORMS}, got {show(data)}")
        if "kind" in data:  # the Python form, Selector(kind="rank", value=1)
            return data
        keys = [k for k in data if k in cls.yaml_keys]  # type: ignore[operator]
        errors = [InitErrorDetails(type="extra_forbidden", loc=(k,), input=v)
                  for k, v in data.items() if k not in cls.yaml_keys]  # type: ignore[operator]
        if errors:
            raise located(errors)
        if len(keys) != 1:
            got = " and ".join(keys) if keys else "an empty mapping"
            raise ValueError(f"expected exactly one of {cls.FORMS}, got {got}")
        kind = keys[0]
        value = data[kind]
        if not isinstance(value, int) or isinstance(value, bool):
            raise located([InitErrorDetails(type="int_type", loc=(kind,), input=value)])
        if value < 0:
            raise located([InitErrorDetails(type="greater_than_equal", loc=(kind,),
                                            input=value, ctx={"ge": 0})])
        return {"kind": kind, "value": value}

    @model_validator(mode="after")
    def _value_matches_kind(self) -> Selector:
        if self.kind in ("rank", "node"):
            if self.value is None or self.value < 0:
                raise ValueError(f"a {self.kind} selector takes an integer value >= 0, got "
                                 f"{show(self.value)}")
        elif self.value is not None:
            raise ValueError(f"a {self.kind} selector takes no value, got {show(self.value)}")
        return self

    def __str__(self) -> str:
        if self.kind == "all":
            return "every rank"
        return f"a random {self.kind}" if self.kind == "random" else f"{self.kind} {self.value}"


class AfterEvent(SpecModel):
    """Fire when the job has emitted ``count`` events of ``kind`` matching ``match``."""

    kind: str
    """Event kind, e.g. ``checkpoint_saved`` (see ``EVENT_KINDS``)."""
    count: int = Field(default=1, ge=1)
    """Fire on the count-th matching event."""
    match: dict[str, Any] = Field(default_factory=dict)
    """Fields the event must carry with these values, e.g. ``{rank: 0}``."""

    @field_validator("match")
    @classmethod
    def _scalars(cls, value: dict[str, Any]) -> dict[str, Any]:
        errors = [spec_error((k, ), f"expected a string, number, true/false or null, got "
                             f"{show(v)}", v) for k, v in value.items()
                  if not (v is None or isinstance(v, str | int | float | bool))]
        if errors:
            raise located(errors)
        return value

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        if value not in EVENT_KINDS:
            raise ValueError(unknown("event kind", value, EVENT_KINDS, "known kinds"))
        return value


class Every(SpecModel):
    """Fire repeatedly at seeded, exponentially distributed intervals (a Poisson process)."""

    mtbf_s: float = Field(gt=0)
    """Mean time between failures, in seconds."""
    max_count: int | None = Field(default=None, ge=1)
    """Fire at most this many times (``null``: until the run ends)."""
    start_after_s: float = Field(default=0.0, ge=0)
    """No failure before this many seconds into the run."""


class Trigger(SpecModel):
    """When a fault fires: exactly one of ``at_step``, ``at_time_s``, ``after_event``,
    ``every``."""

    at_step: int | None = Field(default=None, ge=1)
    """Fire when the job reports this step done."""
    at_time_s: float | None = Field(default=None, ge=0)
    """Fire this many seconds after the job started."""
    after_event: AfterEvent | None = None
    """Fire after an event of the protocol (``kind``, ``count``, ``match``)."""
    every: Every | None = None
    """Fire repeatedly with a seeded mean time between failures."""

    @model_validator(mode="after")
    def _exactly_one(self) -> Trigger:
        given = [k for k in self.valid_keys() if getattr(self, k) is not None]
        if len(given) != 1:
            got = " and ".join(given) if given else "none"
            raise ValueError(f"set exactly one of {choices(self.valid_keys())}; got {got}")
        return self

    @property
    def kind(self) -> str:
        """``at_step``, ``at_time_s``, ``after_event`` or ``every``."""
        return next(k for k in self.valid_keys() if getattr(self, k) is not None)


def _target_forms(kinds: tuple[str, ...]) -> str:
    forms = [{"rank": "{rank: N}", "node": "{node: N}", "all": "all"}[k] for k in kinds
             if k in ("rank", "node", "all")]
    if "rank" in kinds or "node" in kinds:
        forms.insert(-1 if "all" in kinds else len(forms), "random")
    return ", ".join(forms[:-1]) + f" or {forms[-1]}" if len(forms) > 1 else "".join(forms)


class FaultSpec(SpecModel):
    """One fault: what (``type``, ``params``), where (``target``), when (``trigger``) and
    how it is undone (``duration_s``, ``until``)."""

    id: str | None = None
    """Name of this fault in reports; defaults to ``<type>-<index>``; unique."""
    type: str
    """Fault type, e.g. ``rank_kill`` (``faultlab list faults``)."""
    target: Selector
    """``{rank: N}``, ``{node: N}``, ``random`` (drawn from the seed) or ``all``."""
    trigger: Trigger
    """When it fires."""
    params: SerializeAsAny[FaultParams] = Field(default_factory=FaultParams)
    """The fault's own parameters, checked against its ``Params``."""
    duration_s: float | None = Field(default=None, gt=0)
    """Undo a reversible fault after this many seconds."""
    until: Literal["reaction"] | None = None
    """``reaction``: undo a reversible fault as soon as the job reacts to it."""

    @model_validator(mode="before")
    @classmethod
    def _params_default(cls, data: Any) -> Any:
        # A fault's defaults come from its own Params, so validate `params` even if omitted.
        if isinstance(data, dict) and data.get("params") is None:
            data = {**data, "params": {}}
        return data

    @field_validator("id")
    @classmethod
    def _id(cls, value: str | None) -> str | None:
        if value is not None and not ID_RE.fullmatch(value):
            raise ValueError(f"{show(value)} is not a valid fault id: use letters, digits, "
                             f"'_', '-' and '.'")
        return value

    @field_validator("type")
    @classmethod
    def _type(cls, value: str) -> str:
        known = fault_types()
        if value not in known:
            raise ValueError(unknown("fault type", value, known, "known types"))
        return value

    @field_validator("target")
    @classmethod
    def _target_allowed(cls, value: Selector, info: ValidationInfo) -> Selector:
        fault = fault_types().get(info.data.get("type", ""))
        if fault is None:
            return value
        kinds = fault.targets
        if value.kind == "random" and not ("rank" in kinds or "node" in kinds):
            raise ValueError(f"{fault.type} cannot target a random rank or node; it "
                             f"accepts {_target_forms(kinds)}")
        if value.kind != "random" and value.kind not in kinds:
            what = "every rank" if value.kind == "all" else f"a {value.kind}"
            sibling = _sibling(fault.type, value.kind)
            also = f" (to hit a whole {value.kind}, use {sibling})" if sibling else ""
            raise ValueError(f"{fault.type} cannot target {what}; it accepts "
                             f"{_target_forms(kinds)}{also}")
        return value

    @field_validator("params", mode="wrap")
    @classmethod
    def _params(cls, value: Any, handler: Any, info: ValidationInfo) -> FaultParams:
        fault = fault_types().get(info.data.get("type", ""))
        if fault is None:  # the type is reported; its params cannot be checked
            return FaultParams()
        # (cast: `Fault.type` shadows the builtin in Fault's own annotations, for mypy)
        params_model = cast("builtins.type[FaultParams]", fault.Params)
        if isinstance(value, params_model):
            return value
        return params_model.model_validate(value)

    @model_validator(mode="after")
    def _undo(self) -> FaultSpec:
        fault = self.fault_class
        num_steps = getattr(self.params, "num_steps", None)  # a planned step window
        if num_steps is not None:
            errors = [spec_error(("params", "num_steps"), "a step window needs an at_step "
                                 "trigger; with other triggers use duration_s", num_steps)
                      ] if self.trigger.at_step is None else []
            errors += [spec_error((key,), f"params.num_steps already ends the fault; remove "
                                  f"{key}", getattr(self, key))
                       for key in ("duration_s", "until") if getattr(self, key) is not None]
            if errors:
                raise located(errors)
            return self
        if fault.reversible:
            if self.duration_s is None and self.until is None:
                raise ValueError(f"{self.type} must be undone: add duration_s: <seconds>, "
                                 f"until: reaction, or both (whichever comes first)")
            return self
        errors = [spec_error((key,), f"{self.type} cannot be undone (it is not reversible), "
                             f"so it takes no {key}; remove it", getattr(self, key))
                  for key in ("duration_s", "until") if getattr(self, key) is not None]
        if errors:
            raise located(errors)
        return self

    @property
    def fault_class(self) -> builtins.type[Fault]:
        return fault_types()[self.type]

    def build(self) -> Fault:
        """A fresh instance of the fault, with these params."""
        return self.fault_class(self.params)


def _sibling(fault_type: str, kind: str) -> str | None:
    """``rank_kill`` asked to hit a node → ``node_kill``, when that fault exists."""
    for prefix in ("rank_", "node_"):
        if fault_type.startswith(prefix) and kind in ("rank", "node"):
            other = f"{kind}_{fault_type.removeprefix(prefix)}"
            if other != fault_type and kind in getattr(fault_types().get(other), "targets", ()):
                return other
    return None


# --------------------------------------------------------------------------------- expect


@dataclass(frozen=True, slots=True, kw_only=True)
class Sla:
    """How one ``expect`` key is judged against a measured metric."""

    key: str
    """The key under ``expect``."""
    metric: str
    """Name of the measured metric (faultlab.observe)."""
    kind: Literal["max", "min", "bool"]
    """``max``: measured <= bound; ``min``: measured >= bound; ``bool``: measured == expected."""
    description: str

    def holds(self, measured: float | bool, bound: float | bool) -> bool:
        if self.kind == "max":
            return measured <= bound
        if self.kind == "min":
            return measured >= bound
        return bool(measured) == bool(bound)


SLAS: dict[str, Sla] = {s.key: s for s in [
    Sla(key="completes", metric="completes", kind="bool",
        description="the job reached run.steps and exited cleanly"),
    Sla(key="max_restarts", metric="restarts", kind="max",
        description="restarts of the job (torchrun restarts of the worker group)"),
    Sla(key="detection_latency_s", metric="detection_latency_s", kind="max",
        description="fault injected → first sign the job noticed"),
    Sla(key="resume_time_s", metric="resume_time_s", kind="max",
        description="fault injected → first completed step after the job came back"),
    Sla(key="recovery_time_s", metric="recovery_time_s", kind="max",
        description="fault injected → the job is back at its highest step before the fault"),
    Sla(key="lost_steps", metric="lost_steps", kind="max",
        description="highest step before the fault − step it resumed from"),
    Sla(key="goodput", metric="goodput", kind="min",
        description="useful step time ÷ wall time over the run"),
    Sla(key="bitwise_equal_to_golden", metric="bitwise_equal_to_golden", kind="bool",
        description="final digest equals the fault-free golden run's"),
    Sla(key="samples_exactly_once", metric="samples_exactly_once", kind="bool",
        description="every sample was trained on exactly once"),
    Sla(key="corrupt_checkpoint_never_loaded", metric="corrupt_checkpoint_never_loaded",
        kind="bool", description="no checkpoint damaged by a storage fault was loaded"),
    Sla(key="emergency_checkpoint_before_deadline",
        metric="emergency_checkpoint_before_deadline", kind="bool",
        description="after a preemption notice, an emergency checkpoint was committed before "
                    "the termination deadline"),
    Sla(key="emergency_checkpoint_s", metric="emergency_checkpoint_s", kind="max",
        description="preemption notice → emergency checkpoint committed"),
    Sla(key="checkpoints_all_finite", metric="checkpoints_all_finite", kind="bool",
        description="every checkpoint the job left holds only finite values (read back after "
                    "the run)"),
    Sla(key="straggler_detected_within_s", metric="straggler_detected_within_s", kind="max",
        description="a rank slowed down → the trainer names it in an anomaly"),
    Sla(key="max_slowdown", metric="slowdown", kind="max",
        description="median step time while a slowing fault is in force ÷ the median before "
                    "it"),
]}
"""Every SLA an experiment may state under ``expect``; add a field to ``Expect`` and an
entry here to add one."""

SLA_KINDS: dict[str, Literal["max", "min", "bool"]] = {k: s.kind for k, s in SLAS.items()}
"""``expect`` key → comparison kind."""


class Expect(SpecModel):
    """Service-level assertions judged after the run; unset keys are not judged."""

    completes: bool | None = None
    """The job must (true) or must not (false) reach run.steps."""
    max_restarts: int | None = Field(default=None, ge=0)
    """At most this many restarts."""
    detection_latency_s: float | None = Field(default=None, gt=0)
    """Upper bound, seconds."""
    resume_time_s: float | None = Field(default=None, gt=0)
    """Upper bound, seconds."""
    recovery_time_s: float | None = Field(default=None, gt=0)
    """Upper bound, seconds."""
    lost_steps: int | None = Field(default=None, ge=0)
    """Upper bound, steps."""
    goodput: float | None = Field(default=None, gt=0, le=1)
    """Lower bound, a fraction in (0, 1]."""
    bitwise_equal_to_golden: bool | None = None
    """Final state bitwise equal (or not) to the fault-free golden run's."""
    samples_exactly_once: bool | None = None
    """Every sample trained on exactly once (or not)."""
    corrupt_checkpoint_never_loaded: bool | None = None
    """No checkpoint a storage fault damaged was ever loaded (or, if false, one was)."""
    emergency_checkpoint_before_deadline: bool | None = None
    """After a preemption notice, an emergency checkpoint was (or was not) committed before
    the deadline."""
    emergency_checkpoint_s: float | None = Field(default=None, gt=0)
    """Upper bound, seconds from the notice to the committed emergency checkpoint."""
    checkpoints_all_finite: bool | None = None
    """Every checkpoint left in the job's folder holds (or not) only finite values; keep them
    all with ``target.overrides.keep_checkpoints`` to cover every checkpoint ever saved."""
    straggler_detected_within_s: float | None = Field(default=None, gt=0)
    """Upper bound, seconds from slowing a rank down to the trainer naming it."""
    max_slowdown: float | None = Field(default=None, gt=0)
    """Upper bound on the slowdown a slowing fault causes (step time during ÷ before)."""

    def items(self) -> list[tuple[str, bool | int | float]]:
        """``(key, bound)`` for every key that is set, in ``SLAS`` order."""
        return [(k, getattr(self, k)) for k in SLAS if getattr(self, k) is not None]


# ----------------------------------------------------------------------- the documents


class Experiment(SpecModel):
    """One experiment: run the target with this topology, inject the faults, judge ``expect``.
    """

    name: str
    """Identifier of the experiment: lowercase letters, digits, ``_`` and ``-``."""
    description: str | None = None
    """What the experiment shows, in a sentence or two."""
    seed: int = Field(default=0, ge=0, lt=2**63)
    """Seed of the trainer and of every random choice of faultlab (targets, MTBF draws)."""
    topology: Topology = Topology()
    """Nodes, ranks per node, elasticity and backend of the job."""
    run: RunSpec = RunSpec()
    """Steps, checkpoint interval and the experiment's timeout."""
    target: TargetSpec = TargetSpec()
    """The trainer under test (the reference trainer unless a command is given)."""
    faults: Annotated[tuple[FaultSpec, ...], BeforeValidator(_as_tuple)] = ()
    """The faults to inject, in any order (each has its own trigger)."""
    expect: Expect = Expect()
    """SLAs judged after the run."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _slug_name(value, "experiment name")

    @field_validator("target")
    @classmethod
    def _train_config(cls, value: TargetSpec, info: ValidationInfo) -> TargetSpec:
        if value.is_reference:
            run = info.data.get("run") or RunSpec()
            errors = check_train_config(preset=value.preset or "tiny",
                                        overrides=value.overrides, steps=run.steps,
                                        checkpoint_every=run.checkpoint_every,
                                        seed=info.data.get("seed", 0))
            if errors:
                raise located(errors)
        return value

    @field_validator("faults")
    @classmethod
    def _faults_fit(cls, faults: tuple[FaultSpec, ...],
                    info: ValidationInfo) -> tuple[FaultSpec, ...]:
        topology: Topology | None = info.data.get("topology")
        run: RunSpec | None = info.data.get("run")
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
            first_at.setdefault(fault.id, i)  # type: ignore[arg-type]
            if topology is not None:
                errors += _target_in_range(i, fault.target, topology)
                errors += _launcher_fits(i, fault, topology)
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
    launchers = fault.fault_class.launchers
    if topology.launcher in launchers:
        return []
    return [spec_error((i, "type"), f"{fault.type} needs topology.launcher: "
                       f"{' or '.join(launchers)} (this experiment's nodes are "
                       f"{topology.launcher!r}): {fault.fault_class.launcher_reason}",
                       fault.type)]


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
                     BeforeValidator(_as_tuple), Field(min_length=1)]
    """Experiment (or suite) files, relative to this file."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _slug_name(value, "suite name")
