"""What the terminal shows of a result: the rich tables of ``faultlab run`` and ``report``.

One table per kind of result: a run's SLAs (:func:`sla_table`) and its detection block
(:func:`detection_table`), a campaign's score (:func:`campaign_tables`), repeated runs' spread
(:func:`repeat_tables`), a sweep's points and thresholds (:func:`print_sweep`). All but the SLA
table take their rows from ``faultlab.report``, which writes the same rows as Markdown, so the
terminal and the report pages do not disagree; this module only lays them out for rich.
``faultlab.cli`` prints them. It may import ``faultlab.engine`` (the result's type),
``faultlab.judge`` and ``faultlab.report`` (``ALLOWED`` in ``tests/unit/test_import_rules.py``),
and rich; never ``faultlab.cli``, which imports it. It imports faultlab inside its functions, as
``faultlab.cli`` does, so that ``faultlab --help`` loads neither the engine nor torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from faultlab.engine import RunResult


RESULT_STYLE = {"pass": "[green]pass[/]", "fail": "[bold red]FAIL[/]",
                "inconclusive": "[bold yellow]INCONCLUSIVE[/]", "covered": "[dim]covered[/]"}
"""An SLA's ``result`` in the terminal's tables."""

VERDICT_STYLE = {"pass": "[green]PASS[/]", "fail": "[bold red]FAIL[/]",
                 "inconclusive": "[bold yellow]INCONCLUSIVE[/]"}
"""A verdict in the terminal's lines."""


def rows_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]]) -> Table:
    """A titled table of plain-text rows (escaped: a row's text is never rich markup)."""
    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*map(escape, row))
    return table


def sla_table(result: RunResult) -> Table:
    """The run's SLAs: bound, what was measured (its note), result; the verdict as the title."""
    from faultlab.judge.timing import bound_text

    table = Table(title=f"{result.name}: {result.verdict.upper()}  ({result.run_folder})")
    for col in ("SLA", "bound", "measured", "result"):
        table.add_column(col)
    for s in result.slas:
        measured = "not measured" if s.measured is None else (
            f"{s.measured:.3f}" if isinstance(s.measured, float) else str(s.measured))
        if s.ratio and s.measured is not None:
            measured += f" s ({s.ratio})"
        bound = bound_text(s.bound, s.limit) if isinstance(s.bound, dict) else str(s.bound)
        table.add_row(escape(s.name), escape(bound),
                      escape(measured + (f" ({s.note})" if s.note else "")),
                      RESULT_STYLE[s.result])
    return table


def detection_table(section: dict[str, Any]) -> Table:
    """The detection block of the verdict: one row per signal, the onset as the caption."""
    from faultlab.report.detection import DETECTION_HEADER, detection_lines, detection_rows

    table = Table(title="detection", caption=escape("; ".join(detection_lines(section))))
    for col in DETECTION_HEADER:
        table.add_column(col)
    for row in detection_rows(section):
        table.add_row(*(escape(c) for c in row))
    return table


def campaign_tables(score: dict[str, Any]) -> list[Table]:
    """The campaign's headline, its per-fault-type table and every injection."""
    from faultlab.report.campaign import (
        SHORT_INJECTION_COLUMNS,
        TYPE_COLUMNS,
        short_injection_rows,
        summary_rows,
        type_rows,
    )

    head = Table(title="campaign", show_header=False)
    head.add_column("what")
    head.add_column("value")
    for k, v in summary_rows(score):
        head.add_row(escape(k), escape(v))
    out = [head]
    for title, cols, rows in (("per fault type", TYPE_COLUMNS, type_rows(score)),
                              ("injections", SHORT_INJECTION_COLUMNS,
                               short_injection_rows(score))):
        out.append(rows_table(title, cols, rows))
    return out


def secs(value: float | None) -> str:
    """A duration in the terminal's lines, ``—`` when not measured."""
    return "—" if value is None else f"{value:.2f} s"


def repeat_tables(name: str, summary: dict[str, Any], folder: Path) -> list[Table]:
    """The SLA table over the runs (bound beside median, tail and headroom) and the metric
    table (median, p95, min, max), as the terminal shows them."""
    from faultlab.report.repeats import METRIC_HEADER, SLA_HEADER, spread_rows

    sla_rows, metric_rows = spread_rows(summary)
    slas = Table(title=f"{name} x {summary['num_runs']}: {summary['verdict'].upper()}  "
                       f"({summary['stability']})")
    for col in SLA_HEADER:
        slas.add_column(col, no_wrap=col in ("SLA", "tail"))
    for row in sla_rows:
        met, runs = (int(x) for x in row[2].split(",")[0].split("/"))
        slas.add_row(*map(escape, row[:2]),
                     f"[green]{row[2]}[/]" if met == runs else f"[bold red]{row[2]}[/]",
                     *map(escape, row[3:]))
    metrics = Table(title=f"{name}: metrics over {summary['num_runs']} runs ({folder})")
    for col in METRIC_HEADER:
        metrics.add_column(col, no_wrap=col == "metric")
    for row in metric_rows:
        metrics.add_row(*map(escape, row))
    return [slas, metrics]


def print_sweep(record: dict[str, Any], console: Console) -> None:
    """The sweep's table, then where each signal starts to notice."""
    from faultlab.report.sweep import sweep_rows, threshold_text

    header, rows = sweep_rows(record)
    table = Table(title=escape(f"{record['experiment']['name']}: {record['param']['path']} "
                               f"swept ({record['param']['scale']})"))
    for col in header:
        table.add_column(escape(col))
    for row in rows:
        table.add_row(*map(escape, row))
    console.print(table)
    for t in record["thresholds"]:
        console.print(f"[bold]{escape(t['signal'])}[/]: {escape(threshold_text(t))}")
    if not record["thresholds"]:
        console.print("no signal was measured: no point's journal names a detection (declare "
                      "the team's signals under observe.detections)")
