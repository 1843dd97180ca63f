"""The verdict of a repeated experiment: N independent runs of the same experiment, judged as one.

A single run's verdict says what happened once; a team that gates a release on it needs to know
how often it happens. ``summarize`` takes the journals of N runs (``journal.json`` documents,
or anything with their ``verdict``, ``slas`` and ``metrics``) and returns:

- verdict stability: how many runs passed (``19/20``) and the verdict of the whole set. By
  default every run must pass; ``min_pass_rate`` (a fraction in (0, 1]) sets another bar: the
  set passes when ``passed / runs >= min_pass_rate``, compared exactly (``Fraction``), so 19/20
  meets 0.95. An empty set, or one cut short by Ctrl-C, never passes: a verdict over runs that
  did not happen would be a vacuous one. An inconclusive run (``faultlab.judge.verdict``) is
  not a pass: a set that meets its bar only if its inconclusive runs are counted as passes is
  ``inconclusive``; one that misses it even so fails.
- per numeric metric: median and p95 over the runs that measured it, min and max, and how many
  runs measured it.
- per SLA: the bound, how many runs met it, the median and the tail of what was measured, and
  the headroom between that tail and the bound, so a team can set SLAs from data.

p95 is the nearest-rank percentile: the smallest measured value that at least 95 % of the
measured values do not exceed (``sorted(v)[ceil(0.95 n) - 1]``). It is always a value some run
measured; with fewer than 20 runs it is the maximum. For an SLA the tail is taken on the side
that fails: the p95 for an upper bound (``resume_time_s <= 30``), the p5 (the same rule from
below) for a lower bound (``goodput >= 0.3``).

Pure functions over plain data; ``parse_pass_rate`` turns ``0.95`` or ``95%`` into a
``Fraction`` and says how to fix anything else.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any

from faultlab.judge.slas import SLA_KINDS
from faultlab.judge.verdict import FAIL, INCONCLUSIVE, PASS, row_result

__all__ = ["ALL_PASS", "MetricSpread", "RepeatSummary", "SlaSpread", "format_rate",
           "nearest_rank", "parse_pass_rate", "required_passes", "summarize"]

ALL_PASS = Fraction(1)


def parse_pass_rate(text: str | float | Fraction) -> Fraction:
    """``0.95``, ``"0.95"``, ``"95%"`` or ``"19/20"`` → ``Fraction(19, 20)``.

    Raises ``ValueError`` with the bad value and what to write instead. 0 is refused: a bar
    that every set clears, even one where no run passed, would make the verdict vacuous."""
    raw = text
    try:
        if isinstance(text, Fraction):
            rate = text
        elif isinstance(text, bool):
            raise ValueError
        elif isinstance(text, int | float):
            if not math.isfinite(text):
                raise ValueError
            rate = Fraction(str(text))
        else:
            s = str(text).strip()
            rate = Fraction(s[:-1].strip()) / 100 if s.endswith("%") else Fraction(s)
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"{raw!r} is not a pass rate; write a fraction in (0, 1] such as 0.95, "
                         f"or a percentage such as 95%") from None
    if not 0 < rate <= 1:
        raise ValueError(f"{raw!r} is not a pass rate in (0, 1]"
                         + (" (0 would pass a set in which no run passed)" if rate == 0 else "")
                         + "; write e.g. 0.95 or 95%, or leave it out to require every run to "
                           "pass")
    return rate


def required_passes(num_runs: int, min_pass_rate: Fraction) -> int:
    """The fewest passing runs out of ``num_runs`` that meet ``min_pass_rate``."""
    return math.ceil(min_pass_rate * num_runs)


def nearest_rank(values: Sequence[float], q: float) -> float | None:
    """The ``q``-quantile (0 < q <= 1) by nearest rank: an observed value; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)), 1) - 1]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


@dataclass(frozen=True, slots=True)
class MetricSpread:
    """One metric over the runs that measured it (None: no run measured it)."""

    name: str
    num_measured: int
    median: float | None
    p95: float | None
    min: float | None
    max: float | None

    @classmethod
    def of(cls, name: str, values: Sequence[Any]) -> MetricSpread:
        nums = [v for v in map(_number, values) if v is not None]
        return cls(name, len(nums), statistics.median(nums) if nums else None,
                   nearest_rank(nums, 0.95), min(nums, default=None), max(nums, default=None))


@dataclass(frozen=True, slots=True)
class SlaSpread:
    """One SLA over the runs: how often it held, and how close the measurements came."""

    name: str
    kind: str
    """``max`` (measured <= bound), ``min`` (measured >= bound) or ``bool``."""
    bound: Any
    num_passed: int
    num_runs: int
    num_measured: int
    num_inconclusive: int
    """Runs in which it was inconclusive (not measured for want of a reference; covered ones
    not counted)."""
    median: float | None
    """Median of the measured values (numeric SLAs; None for ``bool``)."""
    tail: float | None
    """The 95th percentile on the failing side: p95 for ``max``, p5 for ``min``."""
    headroom: float | None
    """How far the tail is from the bound, positive when inside it (``bound - p95`` for
    ``max``, ``p5 - bound`` for ``min``; for a relative bound, which each run made seconds
    with its own units, the p5 of each run's ``limit - measured``); None for ``bool`` SLAs
    or when nothing was measured."""

    @property
    def headroom_fraction(self) -> float | None:
        """``headroom`` as a fraction of the bound (None where the bound is 0)."""
        bound = _number(self.bound)
        if self.headroom is None or not bound:
            return None
        return self.headroom / abs(bound)


@dataclass(slots=True)
class RepeatSummary:
    """N runs of one experiment judged together (see the module docstring)."""

    num_runs: int
    num_passed: int
    min_pass_rate: Fraction
    interrupted: bool
    verdicts: list[str]
    metrics: list[MetricSpread] = field(default_factory=list)
    slas: list[SlaSpread] = field(default_factory=list)

    @property
    def num_inconclusive(self) -> int:
        return sum(v == INCONCLUSIVE for v in self.verdicts)

    @property
    def required(self) -> int:
        return required_passes(self.num_runs, self.min_pass_rate)

    @property
    def verdict(self) -> str:
        if self.num_runs == 0 or self.interrupted:
            return FAIL
        if Fraction(self.num_passed, self.num_runs) >= self.min_pass_rate:
            return PASS
        could = Fraction(self.num_passed + self.num_inconclusive, self.num_runs)
        return INCONCLUSIVE if could >= self.min_pass_rate else FAIL

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def stability(self) -> str:
        """``19/20 passed (95%; required 19, min pass rate 95%)``."""
        pct = f"{100 * self.num_passed / self.num_runs:.0f}%" if self.num_runs else "—"
        bar = ("every run" if self.min_pass_rate == ALL_PASS
               else f"min pass rate {format_rate(self.min_pass_rate)}")
        return (f"{self.num_passed}/{self.num_runs} passed"
                + (f", {self.num_inconclusive} inconclusive" if self.num_inconclusive else "")
                + f" ({pct}; required {self.required}, {bar})"
                + (", interrupted" if self.interrupted else ""))

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "num_runs": self.num_runs,
                "num_passed": self.num_passed, "num_inconclusive": self.num_inconclusive,
                "required": self.required,
                "min_pass_rate": float(self.min_pass_rate),
                "min_pass_rate_exact": str(self.min_pass_rate),
                "interrupted": self.interrupted, "verdicts": list(self.verdicts),
                "stability": self.stability(),
                "metrics": [asdict(m) for m in self.metrics],
                "slas": [{**asdict(s), "headroom_fraction": s.headroom_fraction}
                         for s in self.slas]}


def format_rate(rate: Fraction) -> str:
    """``Fraction(19, 20)`` → ``95%`` (up to two decimals, no trailing zeros)."""
    return f"{float(rate * 100):.2f}".rstrip("0").rstrip(".") + "%"


def summarize(journals: Sequence[Mapping[str, Any]], *,
              min_pass_rate: Fraction = ALL_PASS, interrupted: bool = False) -> RepeatSummary:
    """Judge the runs of one experiment together (``journals`` in run order)."""
    verdicts = [str(j.get("verdict")) for j in journals]
    summary = RepeatSummary(num_runs=len(journals),
                            num_passed=sum(v == "pass" for v in verdicts),
                            min_pass_rate=min_pass_rate, interrupted=interrupted,
                            verdicts=verdicts)
    names: dict[str, None] = {}
    for j in journals:
        for name, value in (j.get("metrics") or {}).items():
            if _number(value) is not None:
                names.setdefault(name)
    summary.metrics = [MetricSpread.of(n, [(j.get("metrics") or {}).get(n) for j in journals])
                       for n in names]
    sla_names: dict[str, Any] = {}
    for j in journals:
        for s in j.get("slas") or []:
            sla_names.setdefault(s["name"], s.get("bound"))
    for name, bound in sla_names.items():
        rows = [s for j in journals for s in (j.get("slas") or []) if s["name"] == name]
        summary.slas.append(_sla_spread(name, bound, rows, len(journals)))
    return summary


def _sla_spread(name: str, bound: Any, rows: list[Mapping[str, Any]], num_runs: int
                ) -> SlaSpread:
    kind = SLA_KINDS.get(name, "bool")
    measured = [v for v in (_number(r.get("measured")) for r in rows) if v is not None]
    median = tail = headroom = None
    if kind != "bool" and measured:
        median = statistics.median(measured)
        b = _number(bound)
        if kind == "max" and isinstance(bound, dict):  # relative: each run had its own limit
            tail = nearest_rank(measured, 0.95)
            slack = [-(lim - m) for r in rows if (lim := _number(r.get("limit"))) is not None
                     and (m := _number(r.get("measured"))) is not None]
            worst = nearest_rank(slack, 0.95)
            headroom = None if worst is None else -worst
        elif kind == "max":
            tail = nearest_rank(measured, 0.95)
            headroom = None if b is None or tail is None else b - tail
        else:  # the low tail: the p95 of the negated values
            low = nearest_rank([-v for v in measured], 0.95)
            tail = None if low is None else -low
            headroom = None if b is None or tail is None else tail - b
    num_measured = sum(r.get("measured") is not None for r in rows)
    return SlaSpread(name=name, kind=kind, bound=bound,
                     num_passed=sum(bool(r.get("passed")) for r in rows), num_runs=num_runs,
                     num_measured=num_measured,
                     num_inconclusive=sum(row_result(r) == INCONCLUSIVE for r in rows),
                     median=median, tail=tail, headroom=headroom)
