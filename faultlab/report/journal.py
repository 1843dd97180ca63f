"""The journal (journal.json, schema-versioned) and the Markdown report rendered from it.

The journal is the single record of a run; report.md (and later report.html) are renderings of
it, so ``faultlab report RUN_DIR`` can re-render any past run. Top level::

    schema_version  1
    verdict         "pass" | "fail" | "inconclusive" (faultlab.judge.verdict)
    slas            [{name, bound, measured, passed, note, inconclusive, covered_by, result}]
    metrics         run-level and per-fault metrics (faultlab.observe)
    faults          [{id, type, target, injected_t, undone_t, details, error}]
    experiment      name, description, file, seed, the validated document
    golden          {key, digest, cached, run_dir, checkpoints_outside} or null
    run             started_t, ended_t, wall_s, timed_out, interrupted, exit_codes, job_dir,
                    checkpoints_outside (saved outside the run folder: the next run finds them)
    environment     faultlab, torch, python, platform, host, cpu_count, git_sha
"""

from __future__ import annotations

import json
import math
import os
import platform
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from faultlab.judge.timing import bound_text
from faultlab.report import _format as fmt
from faultlab.report.detection import detection_markdown

__all__ = ["SCHEMA_VERSION", "environment", "read_journal", "render_markdown", "strict_json",
           "write_journal"]

SCHEMA_VERSION = 1


def environment() -> dict[str, Any]:
    import torch

    import faultlab

    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, cwd=Path(faultlab.__file__).parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return {
        "faultlab": faultlab.__version__, "torch": torch.__version__,
        "python": platform.python_version(), "platform": platform.platform(),
        "host": socket.gethostname(), "cpu_count": os.cpu_count(), "git_sha": sha or None,
        "cuda": torch.cuda.is_available(),
    }


def strict_json(value: Any) -> Any:
    """``value`` with every NaN and infinity replaced by None (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    return value


def write_journal(run_folder: Path, journal: dict[str, Any]) -> Path:
    journal = {"schema_version": SCHEMA_VERSION, **journal}
    path = run_folder / "journal.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(journal, indent=1, sort_keys=False, default=str))
    os.replace(tmp, path)
    (run_folder / "report.md").write_text(render_markdown(journal))
    return path


def read_journal(run_folder: Path) -> dict[str, Any]:
    path = run_folder / "journal.json"
    journal: dict[str, Any] = json.loads(path.read_text())
    version = journal.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {version!r} is not supported (this faultlab "
                         f"reads {SCHEMA_VERSION})")
    return journal


def _landed(fault: dict[str, Any]) -> str:
    """Where a step-triggered fault met the job: after the step its trigger named, or later."""
    after = fault.get("landed_after_step")
    if after is None:
        return "—"
    at = fault.get("at_step")
    return f"after step {after}" + ("" if after == at else f" (at_step {at})")


def _fmt(value: Any) -> str:
    if value is None:
        return "not measured"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _ts(t: float | None) -> str:
    return "—" if t is None else time.strftime("%H:%M:%S", time.localtime(t)) + \
        f".{int((t % 1) * 1000):03d}"


def findings_markdown(findings: list[dict[str, Any]]) -> list[str]:
    """The run's launch findings, each with its fix as the YAML to paste (or why none)."""
    if not findings:
        return []
    lines = ["", "## Findings and their fixes", ""]
    for f in findings:
        lines += [f"- **{f['cause']}**: {f['text']}.", f"  To change it: {f['change']}."]
        if f.get("fix"):
            lines += ["  The fix, to paste (`faultlab run --with-fix` runs the experiment again "
                      "with it and sets both side by side):", "", "  ```yaml",
                      *(f"  {x}" for x in f["fix"].splitlines()), "  ```"]
        elif f.get("no_fix"):
            lines.append(f"  No fix to apply: {f['no_fix']}.")
    return lines


def inconclusive_markdown(journal: dict[str, Any]) -> list[str]:
    """An inconclusive run's line above its SLA table: which checks could not be measured
    (each note says what to add); nothing for any other verdict."""
    if journal.get("verdict") != "inconclusive":
        return []
    names = [s["name"] for s in journal.get("slas") or []
             if fmt.sla_result(s) == "inconclusive"]
    return [f"**Inconclusive:** nothing failed, but {', '.join(names)} could not be measured: "
            f"not a pass. The note of each says why, and what to add.", ""]


def render_markdown(journal: dict[str, Any]) -> str:
    exp, run = journal["experiment"], journal["run"]
    lines = [f"# {exp['name']}: {journal['verdict'].upper()}", ""]
    if exp.get("description"):
        lines += [exp["description"], ""]
    lines += [f"- experiment file: `{exp.get('file')}`, seed {exp['seed']}",
              f"- wall time: {run['wall_s']:.1f} s"
              + (" (timed out)" if run.get("timed_out") else "")
              + (" (interrupted)" if run.get("interrupted") else ""),
              f"- job directory: `{run['job_dir']}`", ""]
    if run.get("error"):
        lines += [f"**Error:** {run['error']}", ""]
    lines += inconclusive_markdown(journal)
    lines += ["## SLAs", "", "| SLA | bound | measured | result |", "| --- | --- | --- | --- |"]
    for s in journal["slas"]:
        note = f" ({s['note']})" if s.get("note") else ""
        bound = bound_text(s["bound"], s.get("limit")) if isinstance(s["bound"], dict) \
            else _fmt(s["bound"])
        ratio = f" ({s['ratio']})" if s.get("ratio") and s["measured"] is not None else ""
        lines.append(f"| {s['name']} | {bound} | {_fmt(s['measured'])}{ratio}{note} | "
                     f"{fmt.result_word(s, markdown=True)} |")
    lines += findings_markdown(run.get("launch_findings") or [])
    lines += detection_markdown(journal.get("detection"))
    lines += ["", "## Faults", "",
              "| id | type | target | injected | landed | undone | details |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for f in journal["faults"]:
        details = f["error"] if f.get("error") else json.dumps(f.get("details", {}))
        lines.append(f"| {f['id']} | {f['type']} | {f['target']} | {_ts(f['injected_t'])} | "
                     f"{_landed(f)} | {_ts(f.get('undone_t'))} | {details} |")
    m = journal["metrics"]
    lines += ["", "## Metrics", "", "| metric | value |", "| --- | --- |"]
    for name, value in m.items():
        if name != "faults" and not isinstance(value, dict | list):
            lines.append(f"| {name} | {_fmt(value)} |")
    if journal.get("campaign"):
        from faultlab.report.campaign import campaign_markdown

        lines += ["", *campaign_markdown(journal["campaign"]["score"])]
    if journal.get("golden"):
        g = journal["golden"]
        lines += ["", f"Golden run: digest `{g['digest']}` "
                      f"({'cached' if g['cached'] else 'run now'}, key {g['key']})."]
    env = journal["environment"]
    lines += ["", "## Environment", "",
              f"faultlab {env['faultlab']}, torch {env['torch']}, Python {env['python']}, "
              f"{env['platform']}, host {env['host']} ({env['cpu_count']} CPUs), "
              f"git {env.get('git_sha') or 'unknown'}", ""]
    return "\n".join(lines)
