"""The folder of a repeated experiment (``faultlab run X --repeat N``) and its renderings.

    REPORT_DIR/<name>-x<N>-<timestamp>/
        repeats.json    the record: the experiment, each run's folder and verdict (rewritten
                        after every run, so an interrupted set still says what ran), and the
                        summary (verdict stability, per-metric median/p95, per-SLA headroom)
        report.md       its rendering
        runs/           each run's own folder (journal.json, report.md, job/), as a single
                        ``faultlab run`` writes it

The summary is computed from the runs' journals by ``faultlab.judge.repeats.summarize``;
``faultlab report FOLDER`` recomputes it from them and writes both files again. Top level of
repeats.json::

    schema_version 1, kind "faultlab_repeats", verdict, experiment {name, file, seed,
    description}, started_t, ended_t, wall_s, golden {key, digest} or null,
    runs [{index, run_folder, verdict, wall_s, error}], summary (RepeatSummary.to_dict())
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from faultlab.judge.repeats import parse_pass_rate, summarize
from faultlab.report import _format as fmt
from faultlab.report.journal import read_journal, strict_json

__all__ = ["REPEAT_RECORD", "is_repeat_folder", "render_repeat_markdown", "rerender_folder",
           "spread_rows", "write_record"]

SCHEMA_VERSION = 1
REPEAT_RECORD = "repeats.json"
KIND = "faultlab_repeats"


def is_repeat_folder(folder: Path) -> bool:
    return (folder / REPEAT_RECORD).is_file()


def write_record(folder: Path, record: dict[str, Any]) -> Path:
    """Write repeats.json (atomically) and report.md; returns the record's path."""
    record = strict_json({"schema_version": SCHEMA_VERSION, "kind": KIND, **record})
    path = folder / REPEAT_RECORD
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1, allow_nan=False, default=str) + "\n")
    os.replace(tmp, path)
    (folder / "report.md").write_text(render_repeat_markdown(record))
    return path


def read_record(folder: Path) -> dict[str, Any]:
    path = folder / REPEAT_RECORD
    record: dict[str, Any] = json.loads(path.read_text())
    if record.get("schema_version") != SCHEMA_VERSION or record.get("kind") != KIND:
        raise ValueError(f"{path}: not a repeats record this faultlab reads (schema_version "
                         f"{record.get('schema_version')!r}, kind {record.get('kind')!r}; "
                         f"expected {SCHEMA_VERSION} and {KIND!r})")
    return record


def rerender_folder(folder: Path) -> dict[str, Any]:
    """Recompute the summary from the runs' journals and write repeats.json and report.md."""
    record = read_record(folder)
    ran = [r for r in record["runs"] if r.get("run_folder")]
    journals = [read_journal(folder / r["run_folder"]) for r in ran]
    for run, journal in zip(ran, journals, strict=True):  # each run's own, as judged now
        run["verdict"] = journal["verdict"]
    old = record.get("summary") or {}
    rate = parse_pass_rate(old.get("min_pass_rate_exact", "1"))
    summary = summarize(journals, min_pass_rate=rate, interrupted=bool(old.get("interrupted")))
    record.update(verdict=summary.verdict, summary=summary.to_dict())
    write_record(folder, record)
    return record


def _value(name: str, value: Any) -> str:
    """As the reports show a measurement, but a whole count stays whole (``5``, not
    ``5.000``): a median of step counts is a count unless it falls between two."""
    if isinstance(value, float) and value.is_integer() and not name.endswith("_s"):
        value = int(value)
    return fmt.measured(name, value)


def _tail_label(kind: str) -> str:
    return {"max": "p95", "min": "p5"}.get(kind, "—")


def spread_rows(summary: dict[str, Any]) -> tuple[list[list[str]], list[list[str]]]:
    """``(SLA rows, metric rows)`` as text, shared by the Markdown and the terminal.

    SLA rows: SLA, bound, runs that met it, median, tail (p95, or p5 for a lower bound),
    headroom; metric rows: metric, runs that measured it, median, p95, min, max."""
    slas = []
    for s in summary["slas"]:
        name = s["name"]
        met = f"{s['num_passed']}/{s['num_runs']}" + (
            f", {s['num_inconclusive']} inconclusive" if s.get("num_inconclusive") else "")
        if s["kind"] == "bool":
            slas.append([name, fmt.sla_bound(name, s["bound"]), met, "—", "—", "—"])
            continue
        frac = s.get("headroom_fraction")
        headroom = ("—" if s["headroom"] is None else
                    _value(name, s["headroom"])
                    # a percentage of a near-zero bound says nothing (-2289687%)
                    + ("" if frac is None or abs(frac) > 10 else f" ({100 * frac:.0f}%)"))
        slas.append([name, fmt.sla_bound(name, s["bound"]), met, _value(name, s["median"]),
                     f"{_tail_label(s['kind'])} {_value(name, s['tail'])}", headroom])
    metrics = [[m["name"], f"{m['num_measured']}/{summary['num_runs']}",
                *(_value(m["name"], m[k]) for k in ("median", "p95", "min", "max"))]
               for m in summary["metrics"]]
    return slas, metrics


SLA_HEADER = ["SLA", "bound", "met", "median", "tail", "headroom"]
METRIC_HEADER = ["metric", "measured", "median", "p95", "min", "max"]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    cell = lambda c: str(c).replace("|", "\\|")  # noqa: E731
    return (["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
            + ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows] + [""])


def render_repeat_markdown(record: dict[str, Any]) -> str:
    exp, summary = record["experiment"], record["summary"]
    lines = [f"# {exp['name']} × {summary['num_runs']}: {fmt.verdict(summary['verdict'])}", ""]
    if exp.get("description"):
        lines += [str(exp["description"]).strip(), ""]
    lines += [f"- verdict stability: {summary['stability']}",
              f"- experiment file: `{exp.get('file')}`, seed {exp.get('seed')}",
              f"- wall time: {fmt.seconds(record.get('wall_s'))} for "
              f"{summary['num_runs']} run(s)"]
    golden = record.get("golden")
    if golden:
        lines.append(f"- golden run: key {golden.get('key')}, digest "
                     f"`{str(golden.get('digest'))[:16]}…`, computed once and shared by every "
                     f"run")
    lines += ["", "## SLAs over the runs", "",
              "The tail is the p95 of an upper bound and the p5 of a lower bound (nearest "
              "rank: a value some run measured; the maximum below 20 runs); the headroom is "
              "how far it stays inside the bound.", ""]
    sla_rows, metric_rows = spread_rows(summary)
    lines += _table(SLA_HEADER, sla_rows)
    lines += ["## Metrics over the runs", ""] + _table(METRIC_HEADER, metric_rows)
    lines += ["## Runs", ""]
    lines += _table(["#", "verdict", "wall time", "run folder", "error"],
                    [[str(r["index"]), fmt.verdict(r["verdict"]), fmt.seconds(r.get("wall_s")),
                      f"`{r.get('run_folder')}`", r.get("error") or ""]
                     for r in record["runs"]])
    return "\n".join(lines)
