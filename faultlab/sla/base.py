"""The contract of an SLA: one declaration holds all that faultlab knows of it.

An :class:`Sla` says what an experiment writes under ``expect`` (its key, the type and range of
its value, the text the YAML reference shows), what the bound means (``kind``: an upper bound,
a lower bound or an expected truth value, and its ``unit``), how the run is measured (a metric
of ``faultlab.observe``'s ``Metrics``, or :meth:`Sla.measure` reading the run's records) and how
the verdict's note is written (:meth:`Sla.explain`). The built-ins (``faultlab.sla.builtin``)
are ordinary declarations of it; a team's are too (``faultlab.sla.registry``).

A declaration reads the run through :class:`Evidence`: the records ``faultlab.judge.judge``
receives, and the few questions about them that ``faultlab.observe`` and ``faultlab.judge``
answer (this package sits beneath both and imports neither; ``faultlab.judge.evidence`` is the
implementation).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol, TypedDict

from pydantic import Field, ValidationError

from faultlab.sla.timing import RelativeSeconds, in_units

__all__ = ["Evidence", "Kind", "Outcome", "Sla"]

Kind = Literal["max", "min", "bool"]
"""``max``: measured <= bound; ``min``: measured >= bound; ``bool``: measured == expected."""


class Evidence(Protocol):
    """What one run left to judge it by (built by ``faultlab.judge.judge``).

    The records are those ``judge()`` receives; ``None`` means the run did not leave it."""

    exp: Any
    """The experiment (``faultlab.spec.Experiment``)."""
    metrics: Any
    """What ``faultlab.observe.compute_metrics`` measured (``faultlab.observe.Metrics``)."""
    golden: Any
    """The fault-free golden run (``faultlab.judge.Golden``: ``digest``, ``tensors``,
    ``not_measured``), or None."""
    timed_out: bool
    """faultlab stopped the job at ``run.timeout_s``."""
    faults: Sequence[Any]
    """What faultlab injected (``faultlab.observe.FaultRecord``: ``id``, ``type``,
    ``injected_t``, ``details``)."""
    events: Sequence[Mapping[str, Any]]
    """The job's event records, every rank's (``kind``, ``t``, ``rank``, ``step``, ``loss`` ...)."""
    final_state: Any
    """The job's final checkpoint read back (``faultlab.observe.final_state.FinalState``), or
    None."""
    job_s: float | None
    """How long the job ran, on the clock the triggers read."""
    node_exits: Mapping[str, int | None] | None
    """Exit code per node (None: not known)."""
    lost_nodes: Collection[str]
    """Nodes lost on purpose (killed)."""
    stopped_nodes: Collection[str]
    """Nodes the engine stopped because training had completed and they still ran."""
    losses: Mapping[int, float] | None
    """Loss per step read from the nodes' logs (a trainer without events), or None."""
    fired: Collection[str]
    """Ids of the faults injected without error."""
    unfinished: str
    """How the run fell short of finishing ('' if it completed)."""
    units: Any
    """The run's fault-free timings, the units of a relative bound
    (``faultlab.sla.timing.TimingUnits``), or None."""
    detection: Any
    """The run's detection report (``faultlab.observe.detection_score.DetectionReport``: the
    onset of a fault that slows the job or corrupts silently, each signal scored against it),
    or None. An ``Evidence`` of a team's may lack it: read it with ``getattr``."""

    def value(self, metric: str) -> Any:
        """The run-level metric ``metric`` of ``metrics`` (None: not measured or unknown)."""
        ...

    def findings_for(self, key: str) -> list[str]:
        """What the team's launch line explains about a failed ``key`` (its findings)."""
        ...

    def unfinished_why(self, metric: str | None) -> str | None:
        """Why a run that did not complete cannot show ``metric`` (None: it can)."""
        ...

    def completion_reason(self) -> str:
        """Why the job did not complete, read from its exit records ('' if unknown)."""
        ...

    def nodes_fell_short(self) -> str:
        """Why a job whose ranks completed did not complete on its nodes ('' if it did)."""
        ...

    def first_differing_tensor(self) -> str:
        """The first tensor in which the final checkpoint differs from the golden run's."""
        ...

    def reproducibility(self) -> Any:
        """Whether two fault-free runs ended equal (``faultlab.judge.noise``), or None."""
        ...

    def within_noise(self, k: float) -> Any:
        """The distance to the golden run in noise units (``faultlab.judge.noise``)."""
        ...

    def struck(self, fault: Any) -> bool:
        """A storage fault made a save fail or hang (``faultlab.observe.save_failures``)."""
        ...

    def save_failure_sign(self, fault: Any) -> str:
        """What the job showed, or did not, of the save that ``fault`` made fail."""
        ...


class FieldBounds(TypedDict, total=False):
    """The bounds on an SLA's value, as the keywords of ``pydantic.Field`` (``Sla.bounds``)."""

    gt: float | None
    ge: float | None
    lt: float | None
    le: float | None


@dataclass(frozen=True, slots=True)
class Outcome:
    """One SLA judged: what was measured (None: not measured), whether it held, and why.

    ``inconclusive``: not measured for want of evidence that the run did not lose (no
    reference to compare with: two fault-free runs that differ, golden runs that went NaN, a
    trainer that printed no loss): neither passed nor failed. It is never ``passed``; the
    run's verdict is ``inconclusive`` when nothing failed. Its note says what to add."""

    measured: Any
    passed: bool
    note: str = ""
    limit: float | None = None
    """A relative bound in seconds on this run (None: the bound is as written)."""
    ratio: str = ""
    """The measured seconds in the run's own units (``2.10 cold starts``), for every bound in
    seconds whose unit the run measured."""
    inconclusive: bool = False

    def __post_init__(self) -> None:
        if self.inconclusive and self.passed:
            raise ValueError("an inconclusive outcome is never passed (it was not measured)")


@dataclass(frozen=True, kw_only=True)
class Sla:
    """One SLA: its ``expect`` key and value, its meaning, its measurement and its notes.

    The plain case needs no code: name ``metric`` (a field of ``Metrics``) and ``kind``.
    Override :meth:`measure` to measure from the run's records, :meth:`explain` to say more in
    the note, :meth:`holds` for another comparison, :meth:`annotation` and :meth:`parse` for a
    value that is not one plain type (``matches_golden_within_noise``: a number or ``true``).
    """

    key: str
    """The key under ``expect`` (a Python identifier, unique among the SLAs)."""
    value: type[bool] | type[int] | type[float]
    """Type of the value an experiment gives (YAML: true/false, an integer, a number)."""
    kind: Kind
    """How the bound is compared with the measured value."""
    unit: str
    """What the measured value counts: ``s``, ``steps``, ``restarts``, ``ratio (0-1)``, ``bool``."""
    description: str
    """What is measured, one sentence without a final period (``faultlab list slas`` and the
    SLA reference)."""
    doc: str
    """What the value means, for the experiment YAML reference and the JSON schema (the field's
    description); indentation is removed as from a docstring."""
    metric: str | None = None
    """Field of ``faultlab.observe.Metrics`` the default :meth:`measure` reads (None: the
    declaration measures itself)."""
    gt: float | None = None
    """Bounds on the value an experiment may give (pydantic's ``gt``, ``ge``, ``lt``, ``le``)."""
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    correctness: bool = False
    """A correctness SLA: it judges what the job computed (its final state, its losses), not
    how fast or how often it recovered. Not measured on a run that completed (no reference,
    a reference that cannot be used), it makes the verdict ``inconclusive``, not failed:
    nothing showed the run wrong, and nothing showed it right. On a run that did not complete
    it fails like any other. The built-in ones: ``bitwise_equal_to_golden``,
    ``matches_golden_within_noise``, ``healed_state_matches_peer``."""
    order: int = 1000
    """Where the key is listed among the SLAs: the ``Expect`` fields, the schema, the reference,
    the verdict and ``faultlab list slas`` sort by ``(order, key)``. The built-ins take 10,
    20 ...; a team's, by default, come after them, by key."""

    # ------------------------------------------------------------------------- the YAML side

    @property
    def relative(self) -> bool:
        """An upper bound in seconds: it may also be written in the run's own units
        (``{cold_starts: 2.5}``, ``faultlab.sla.timing``)."""
        return self.unit == "s" and self.kind == "max"

    def annotation(self) -> Any:
        """The value's type for the ``Expect`` model (``None`` is always allowed: not judged)."""
        if self.relative:
            return Annotated[self.value, Field(**self.bounds())] | RelativeSeconds | None
        return self.value | None

    def bounds(self) -> FieldBounds:
        """The bounds, as keywords of ``pydantic.Field`` (None: not set, as pydantic reads it)."""
        return FieldBounds(gt=self.gt, ge=self.ge, lt=self.lt, le=self.le)

    def field_bounds(self) -> FieldBounds:
        """The bounds the ``Expect`` field itself carries (a relative bound's are inside its
        annotation, on the number)."""
        return FieldBounds() if self.relative else self.bounds()

    def field_doc(self) -> str:
        return inspect.cleandoc(self.doc)

    def parse(self, value: Any) -> Any:
        """Turn the YAML value into the bound, before its type is checked (default: as is, a
        mapping of a bound in seconds into ``RelativeSeconds``); raise ``ValueError`` with a
        message to refuse it."""
        if self.relative and isinstance(value, dict):
            return relative_bound(value)
        return value

    # ------------------------------------------------------------------------ the judge side

    def measure(self, ev: Evidence) -> Any:
        """What the run shows (None: not measured); default: the metric ``metric``."""
        return ev.value(self.metric) if self.metric else None

    def holds(self, measured: Any, bound: Any) -> bool:
        """``measured`` meets ``bound``; NaN never does (``bool(nan)`` is True, and NaN
        compares False both ways: each comparison must fail it, not pass it)."""
        if isinstance(measured, float) and math.isnan(measured):
            return False
        if self.kind == "max":
            return bool(measured <= bound)
        if self.kind == "min":
            return bool(measured >= bound)
        return bool(measured) == bool(bound)

    def explain(self, ev: Evidence, measured: Any, bound: Any) -> tuple[Any, str]:
        """The measured value and the note to give with it (default: as measured, no note).
        A declaration may also change the value (``completes``: a run that timed out is
        False, whatever its events say)."""
        return measured, ""

    def unfinished_why(self, ev: Evidence) -> str | None:
        """Why a run that did not complete cannot show this (None: it can, or nothing
        specific); the note then says ``not measured: <how it ended>; <why>``."""
        return ev.unfinished_why(self.metric)

    def judge(self, ev: Evidence, bound: Any) -> Outcome:
        """The verdict: measure, explain, then the notes every SLA shares (not measured, and
        why; the launch findings that explain a failure). A relative bound is first made
        seconds with the run's own units; one whose unit the run did not measure is not
        measured."""
        units = getattr(ev, "units", None)  # an Evidence double of a team's may have none
        limit = bound.seconds(units) if isinstance(bound, RelativeSeconds) else bound
        measured = self.measure(ev)
        if limit is None:
            return Outcome(measured, False, f"not measured: the bound is {bound}, and this run "
                           f"measured no such unit ({_describe(units)}) nor did its golden "
                           f"run")
        measured, note = self.explain(ev, measured, limit)
        out = self.conclude(ev, limit, measured, note)
        if not self.relative:
            return out
        ratio = in_units(measured, units) if isinstance(measured, int | float) else ""
        return dataclasses.replace(out, limit=limit if isinstance(bound, RelativeSeconds)
                                   else None, ratio=ratio)

    def conclude(self, ev: Evidence, bound: Any, measured: Any, note: str) -> Outcome:
        if measured is None and ev.unfinished and (why := self.unfinished_why(ev)):
            note = note or f"not measured: {ev.unfinished}; {why}"
        if measured is None:
            note = note or "not measured: the run ended without the events it needs"
        passed = measured is not None and self.holds(measured, bound)
        inconclusive = measured is None and self.correctness and not ev.unfinished
        if not passed and not inconclusive:
            note = "; ".join(filter(None, [note, *ev.findings_for(self.key)]))
        return Outcome(measured, passed, note, inconclusive=inconclusive)


def relative_bound(value: dict[Any, Any]) -> RelativeSeconds:
    """A mapping written for a bound in seconds, checked; ``ValueError`` says what is wrong."""
    try:
        return RelativeSeconds(**{str(k): v for k, v in value.items()})
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        if first["type"] == "extra_forbidden":
            why = f"unknown key {where!r}"
        elif where:
            why = f"{where}: {first['msg'].lower()}, not {first['input']!r}"
        else:
            why = first["msg"].removeprefix("Value error, ")
        raise ValueError(f"{why}; a bound in seconds is a number, or a mapping of s (fixed "
                         f"seconds), cold_starts (times the run's launch-to-first-step) and "
                         f"step_times (times its median step), e.g. {{cold_starts: 2.5}}") \
            from None


def _describe(units: Any) -> str:
    return units.describe() if units is not None else "no timings recorded"
