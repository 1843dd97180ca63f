"""How numbers read in the Markdown and HTML renderings (one place, so the two agree)."""

from __future__ import annotations

import time
from typing import Any

__all__: list[str] = []

NOT_MEASURED = "not measured"


def seconds(value: Any, digits: int = 2) -> str:
    if value is None:
        return NOT_MEASURED
    value = float(value)
    if abs(value) >= 3600:
        return f"{value / 3600:.{digits}f} h"
    if abs(value) >= 120:
        return f"{value / 60:.1f} min"
    return f"{value:.{digits}f} s"


def number(value: Any, digits: int = 2) -> str:
    if value is None:
        return NOT_MEASURED
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != 0 and abs(value) < 10 ** -digits:
            return f"{value:.{digits}g}"
        return f"{value:,.{digits}f}"
    return str(value)


def percent(value: Any) -> str:
    return NOT_MEASURED if value is None else f"{100 * float(value):.2f} %"


def usd(value: Any) -> str:
    return "—" if value is None else f"${float(value):,.0f}" if abs(value) >= 100 \
        else f"${float(value):,.2f}"


def size(num_bytes: Any) -> str:
    if num_bytes is None:
        return NOT_MEASURED
    value = float(num_bytes)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"  # pragma: no cover - the loop always returns


def timestamp(t: Any) -> str:
    if t is None:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(t)))


def sla_bound(name: str, bound: Any, limit: float | None = None) -> str:
    """``≤ 40 s``, ``≥ 0.3``, ``= yes``, ``≤ 2.5 cold starts = 6.08 s``: the SLA's comparison
    and bound (``limit``: a relative bound in seconds on the run)."""
    from faultlab.judge import SLA_KINDS
    from faultlab.judge.slas import CAMPAIGN_SLAS
    from faultlab.judge.timing import bound_text

    campaign = CAMPAIGN_SLAS.get(name)  # a campaign in a suite: ettr ≥ 0.3, not "= 0.3"
    kind = campaign.kind if campaign else SLA_KINDS.get(name, "bool")
    op = {"max": "≤", "min": "≥", "bool": "="}[kind]
    if isinstance(bound, dict):
        return f"{op} {bound_text(bound, limit)}"
    return f"{op} {measured(name, bound)}"


def sla_measured(entry: dict[str, Any]) -> str:
    """What an SLA row of a journal measured, with its ratio to the run's own units."""
    text = measured(entry["name"], entry.get("measured"))
    return f"{text} ({entry['ratio']})" if entry.get("ratio") and \
        entry.get("measured") is not None else text


def measured(name: str, value: Any) -> str:
    if value is None:
        return NOT_MEASURED
    if isinstance(value, bool):
        return "yes" if value else "no"
    if name.endswith("_s") and isinstance(value, int | float):
        return f"{float(value):.2f} s"
    return number(value, 3)


def verdict(value: str) -> str:
    return {"pass": "PASS", "fail": "FAIL"}.get(value, value.upper())


RESULT_WORDS = {"pass": "pass", "fail": "FAIL", "inconclusive": "INCONCLUSIVE",
                "covered": "covered"}
"""An SLA's ``result`` (``faultlab.judge.verdict``) as the reports write it."""

RESULT_MARKS = {"pass": "✓", "fail": "✗", "inconclusive": "?", "covered": "~"}
"""An SLA's ``result`` in a one-line summary."""


def sla_result(row: Any) -> str:
    """The ``result`` of a journal's SLA row (one written before ``inconclusive`` existed
    too)."""
    from faultlab.judge.verdict import row_result

    return row_result(row)


def result_word(row: Any, *, markdown: bool = False) -> str:
    """``pass``, ``FAIL``, ``INCONCLUSIVE`` or ``covered``; in Markdown the two that need
    attention bold."""
    result = sla_result(row)
    word = RESULT_WORDS.get(result, result)
    return f"**{word}**" if markdown and result in ("fail", "inconclusive") else word


def result_mark(row: Any) -> str:
    return RESULT_MARKS.get(sla_result(row), "?")

