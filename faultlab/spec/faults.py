"""The ``faults`` section: what each fault is (``type``, ``params``), where it strikes
(``target``: a ``Selector``), when (``trigger``: at a step, at a time, after an event, or at
seeded random intervals) and how it is undone (``duration_s``, ``until``).

A fault's ``params`` are checked against that fault's own ``Params`` and its target against the
kinds it accepts, here; whether the target exists in the topology and the trigger falls inside
the run is the whole document's check, in ``faultlab.spec.model``.
"""

from __future__ import annotations

import builtins
import re
from typing import Any, ClassVar, Literal, cast

from pydantic import Field, SerializeAsAny, ValidationInfo, field_validator, model_validator
from pydantic_core import InitErrorDetails

from faultlab.fault_api import Fault, FaultParams, fault_types
from faultlab.spec._base import SpecModel, choices, located, show, spec_error, unknown

__all__ = ["EVENT_KINDS", "AfterEvent", "Every", "FaultSpec", "Selector", "Trigger"]

ID_RE = re.compile(r"[A-Za-z0-9_.-]+")

EVENT_KINDS = ("start", "step", "checkpoint_saved", "checkpoint_loaded", "anomaly",
               "preemption_notice", "fault_injected", "final_digest", "exit")
"""Event kinds of the protocol (``faultlab.runtime.events``) that ``after_event`` may wait for."""


class Selector(SpecModel):
    """Which part of the job a fault hits: ``{rank: N}``, ``{node: N}``, ``random`` or ``all``.

    ``random`` draws a rank or a node (the fault's first target kind) from the experiment
    seed; see ``faultlab.spec.resolve_selector``. The attributes match ``faults.Victim``.
    """

    yaml_keys: ClassVar[tuple[str, ...]] = ("rank", "node")
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
        keys = [k for k in data if k in cls.yaml_keys]
        errors = [InitErrorDetails(type="extra_forbidden", loc=(k,), input=v)
                  for k, v in data.items() if k not in cls.yaml_keys]
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

    @property
    def fault_id(self) -> str:
        """``id`` as the experiment filled it in (``<type>-<index>`` where the YAML gave none):
        every fault of a loaded ``Experiment`` has one."""
        if self.id is None:
            raise ValueError(f"this {self.type} fault is not part of a loaded experiment: "
                             f"its id is given when the experiment is validated")
        return self.id

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
        if fault.reversible_with(self.params):
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

    @model_validator(mode="after")
    def _plannable(self) -> FaultSpec:
        """A fault that only the launch plan can carry (``Fault.refuses_live``) needs what the
        plan needs: an ``at_step`` trigger and a target known before launch."""
        refused = self.fault_class.refuses_live(self.params)
        if refused is None:
            return self
        param, why = refused
        errors = []
        if self.trigger.at_step is None:
            errors.append(spec_error(("trigger",), f"{why}: give it an at_step trigger, or "
                                     f"change params.{param}", self.trigger))
        if self.target.kind not in ("rank", "all"):
            errors.append(spec_error(("target",), f"{why}: target {{rank: N}} or all, not "
                                     f"{self.target.kind!r}, or change params.{param}",
                                     self.target.kind))
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
