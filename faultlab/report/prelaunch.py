"""The pre-launch report: one folder per suite run, and the report JSON built from its journals.

A suite run's folder::

    REPORT_DIR/<suite>-<timestamp>/
        suite.json      the suite run: the suite and its plan, the environment, and for every
                        experiment its file, verdict and run folder (written as runs finish)
        runs/           each experiment's own run folder (journal.json, report.md, job/)
        report.json     the report, built from suite.json, the journals and the job events
        report.md       renderings of report.json, and of nothing else
        report.html

The suite's verdict, and each fault family's, combine its members' (``faultlab.judge.verdict``):
``fail`` if one failed or did not run, else ``inconclusive`` if one is (nothing failed, but a
correctness SLA could not be measured), else ``pass``.

A member may be a campaign (``faultlab.spec.campaign``, run by ``run_campaign``): its verdict
counts like an experiment's, its SLAs are the campaign's, and its entry (``kind:
"campaign"``) carries the journal's ``campaign`` object whole (score, schedule, the step series
and the marked injections), rendered as a campaign section with the same rows and plot as the
campaign's own page, which the scorecard links (``report_html``). Its injections overlap by
design, so they stay out of what the projection is built from (the recovery phases, the
checkpoint cost) and out of the fault-family verdicts: the campaign measures its own ETTR
against the projection for its rate.

Run with ``--repeat N``, an experiment's run folder is a repeat set's folder
(``faultlab.report.repeats``): its verdict is the set's, ``repeats`` holds the set's summary
(stability, per-SLA and per-metric median and p95), and the run shown in the plots and tables
is the first that failed, else the first (``repeats.shown_run``).

``build_report`` reads only that folder (and the golden runs a journal points to), so
``faultlab report FOLDER`` rebuilds all three files at any time. Top level of report.json::

    schema_version, kind ("faultlab_prelaunch_report"), verdict, generated_t, started_t,
    ended_t, interrupted, suite {name, description, file, plan},
    families [{family, verdict, experiments}], scorecard [{experiment, family, verdict, slas}],
    experiments [{name, kind, verdict, slas, faults (each with its recovery breakdown),
                  timeline, loss, checkpoints, repeats, campaign, report_html}],
    recovery {phases, rows}, checkpoint_cost, projection {inputs, results, formulas, notes},
    environment
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from faultlab.judge.verdict import FAIL, combine
from faultlab.observe import FaultRecord, compute_metrics
from faultlab.observe.phases import PHASES, recovery_breakdown
from faultlab.observe.stream import EventStream
from faultlab.report.journal import read_journal, strict_json
from faultlab.report.projection import FORMULAS, project
from faultlab.report.repeats import is_repeat_folder, read_record

__all__ = ["REPORT_FILES", "SCHEMA_VERSION", "SUITE_RECORD", "SuiteRun", "build_report",
           "is_suite_folder", "render_folder", "write_report"]

SCHEMA_VERSION = 1
SUITE_RECORD = "suite.json"
REPORT_FILES = ("report.json", "report.md", "report.html")
GB = 1e9

Record = dict[str, Any]


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(strict_json(data), indent=1, allow_nan=False, default=str) + "\n")
    os.replace(tmp, path)


# ------------------------------------------------------------------------- the suite folder


class SuiteRun:
    """The folder of one suite run; ``suite.json`` is rewritten after every experiment, so an
    interrupted suite still has a record of what ran."""

    def __init__(self, folder: Path, *, suite_file: Path, suite: dict[str, Any],
                 experiments: list[tuple[Path, str, list[str]]],
                 environment: dict[str, Any], campaigns: Collection[Path] = ()) -> None:
        """``suite``: the ``suite`` mapping of a validated ``PlannedSuite``, as JSON data;
        ``experiments``: ``(file, name, fault types)`` in run order; ``campaigns``: the files
        among them that are campaigns (known before they run, so one that never ran is still
        reported as a campaign)."""
        self.folder = folder
        self.runs_dir = folder / "runs"
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        self.record: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION, "kind": "faultlab_suite_run",
            "suite": {**suite, "file": str(suite_file)},
            "started_t": time.time(), "ended_t": None, "interrupted": False,
            "environment": environment,
            "experiments": [{"name": name, "file": str(path), "fault_types": list(types),
                             "kind": "campaign" if path in campaigns else "experiment",
                             "verdict": "not run", "run_folder": None}
                            for path, name, types in experiments],
        }
        self._save()

    def _save(self) -> None:
        _write_json(self.folder / SUITE_RECORD, self.record)

    def ran(self, index: int, run_folder: Path | None, verdict: str,
            error: str | None = None) -> None:
        """Experiment ``index`` ran into ``run_folder`` with ``verdict``; a member refused
        before it launched (a campaign's rate, once its golden run measured the step time)
        has no folder and says why in ``error``."""
        entry = self.record["experiments"][index]
        if run_folder is None:
            entry["run_folder"] = None
        else:
            try:
                entry["run_folder"] = str(run_folder.resolve().relative_to(
                    self.folder.resolve()))
            except ValueError:  # elsewhere: keep it as it is
                entry["run_folder"] = str(run_folder)
        entry["verdict"] = verdict
        if error is not None:
            entry["error"] = error
        self._save()

    def finish(self, *, interrupted: bool = False) -> dict[str, Any]:
        """Close the record and write report.json, report.md and report.html."""
        self.record["ended_t"] = time.time()
        self.record["interrupted"] = interrupted
        self._save()
        return render_folder(self.folder)


def is_suite_folder(folder: Path) -> bool:
    return (folder / SUITE_RECORD).is_file()


def render_folder(folder: Path) -> dict[str, Any]:
    """Build the report of a suite folder and write its three files; returns the report."""
    report = build_report(folder)
    write_report(folder, report)
    return report


def write_report(folder: Path, report: dict[str, Any]) -> list[Path]:
    from faultlab.report.html import render_html
    from faultlab.report.markdown import render_suite_markdown

    report = strict_json(report)
    paths = [folder / name for name in REPORT_FILES]
    _write_json(paths[0], report)
    paths[1].write_text(render_suite_markdown(report))
    paths[2].write_text(render_html(report))
    return paths


# ----------------------------------------------------------------------- building the report


def _read_record(folder: Path) -> dict[str, Any]:
    path = folder / SUITE_RECORD
    record: dict[str, Any] = json.loads(path.read_text())
    if record.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {record.get('schema_version')!r} is not "
                         f"supported (this faultlab reads {SCHEMA_VERSION})")
    return record


def _events(job_dir: Path) -> list[Record]:
    stream = EventStream(job_dir)
    stream.poll()
    return list(stream.events)


def _fault_families() -> dict[str, str]:
    from faultlab.faults import fault_types

    return {name: cls.family for name, cls in fault_types().items()}


def build_report(folder: Path) -> dict[str, Any]:
    """The report of the suite run in ``folder`` (see the module docstring)."""
    record = _read_record(folder)
    families_of = _fault_families()
    experiments = [_experiment(folder, entry, families_of) for entry in record["experiments"]]

    rows = [{"experiment": e["name"], "fault_id": f["id"], "type": f["type"],
             "phases": {p["name"]: p["seconds"] for p in f["breakdown"]["phases"]},
             "recovery_time_s": f["breakdown"]["recovery_time_s"],
             "restart_overhead_s": f["breakdown"]["restart_overhead_s"]}
            for e in experiments if e["kind"] != "campaign" for f in e.get("faults", [])
            if f.get("breakdown") and f["breakdown"]["went_down"]]
    checkpoint_cost = _checkpoint_cost([e for e in experiments if e["kind"] != "campaign"])
    overheads = [(r["restart_overhead_s"], r) for r in rows if r["restart_overhead_s"] is not None]
    worst = max(overheads, key=lambda x: x[0], default=None)
    plan = record["suite"]["plan"]
    size = checkpoint_cost["size_on_disk_bytes"]["median"]
    projection = project(plan, measured_stall_s=checkpoint_cost["stall_s"]["median"],
                         measured_size_gb=None if size is None else size / GB,
                         restart_overhead_s=worst[0] if worst else None)
    inputs = {"measured_checkpoint_stall_s": checkpoint_cost["stall_s"]["median"],
              "measured_checkpoint_size_gb": None if size is None else size / GB,
              "measured_restart_overhead_s": worst[0] if worst else None,
              "restart_overhead_from": (f"{worst[1]['experiment']} / {worst[1]['fault_id']}"
                                        if worst else None)}

    verdict = FAIL if record.get("interrupted") else combine([e["verdict"] for e in experiments])
    return {
        "schema_version": SCHEMA_VERSION, "kind": "faultlab_prelaunch_report",
        "verdict": verdict, "generated_t": time.time(),
        "started_t": record.get("started_t"), "ended_t": record.get("ended_t"),
        "interrupted": bool(record.get("interrupted")),
        "suite": {k: record["suite"].get(k) for k in ("name", "description", "file", "plan")},
        "families": _families(experiments, families_of),
        "scorecard": [{"experiment": e["name"], "kind": e["kind"], "family": e["family"],
                       "families": e["families"], "verdict": e["verdict"],
                       "file": e["file"], "slas": e.get("slas", []), "error": e.get("error"),
                       "repeats": e.get("repeats"), "report_html": e["report_html"]}
                      for e in experiments],
        "experiments": experiments,
        "recovery": {"phases": list(PHASES), "rows": rows},
        "checkpoint_cost": checkpoint_cost,
        "projection": {"inputs": {**plan, **inputs}, "results": projection.to_dict(),
                       "formulas": [{"quantity": q, "formula": f} for q, f in FORMULAS]},
        "environment": record.get("environment") or {},
    }


def _families(experiments: list[dict[str, Any]], families_of: dict[str, str]
              ) -> list[dict[str, Any]]:
    names = sorted(set(families_of.values()) | {f for e in experiments for f in e["families"]})
    out = []
    for family in names:
        members = [e for e in experiments if family in e["families"]]
        verdict = "not covered" if not members else combine([e["verdict"] for e in members])
        out.append({"family": family, "verdict": verdict,
                    "experiments": [e["name"] for e in members],
                    "fault_types": sorted(t for t, f in families_of.items() if f == family)})
    return out


def _experiment(folder: Path, entry: dict[str, Any], families_of: dict[str, str]
                ) -> dict[str, Any]:
    families = list(dict.fromkeys(families_of.get(t, "unknown")
                                  for t in entry.get("fault_types") or []))
    if entry.get("kind") == "campaign":  # its own section; no family verdict of its own
        families = []
    out: dict[str, Any] = {"name": entry["name"], "kind": entry.get("kind", "experiment"),
                           "file": entry["file"],
                           "description": None,
                           "verdict": entry["verdict"], "run_folder": entry.get("run_folder"),
                           "family": families[0] if families else
                           "campaign" if entry.get("kind") == "campaign" else "none",
                           "families": families, "wall_s": None, "error": None,
                           "slas": [], "metrics": {}, "faults": [], "timeline": None,
                           "loss": None, "checkpoints": None, "golden": None,
                           "repeats": None, "campaign": None, "report_html": None}
    if not entry.get("run_folder"):
        out["error"] = entry.get("error") or ("not run (the suite was interrupted or stopped "
                                              "before it)")
        return out
    run_folder = folder / entry["run_folder"]
    repeats = None
    if is_repeat_folder(run_folder):  # faultlab run SUITE --repeat N
        try:
            record = read_record(run_folder)
        except (OSError, ValueError) as e:
            out["error"] = f"cannot read its repeats record: {e}"
            return out
        runs = [r for r in record["runs"] if r.get("run_folder")]
        if not runs:
            out["error"] = "no run of the set finished (interrupted)"
            return out
        # One run stands for the set in the plots and tables: the first that failed, if any.
        shown = next((r for r in runs if r["verdict"] != "pass"), runs[0])
        repeats = {**record["summary"], "shown_index": shown["index"],
                   "shown_run": f"{entry['run_folder']}/{shown['run_folder']}"}
        run_folder = run_folder / shown["run_folder"]
    try:
        journal = read_journal(run_folder)
    except (OSError, ValueError) as e:
        out["error"] = f"cannot read its journal: {e}"
        return out
    doc = journal["experiment"].get("document") or {}
    types = [f.get("type") for f in doc.get("faults", [])]
    families = list(dict.fromkeys(families_of.get(t, "unknown") for t in types))
    job_dir = run_folder / "job"
    if not job_dir.is_dir():
        job_dir = Path(journal["run"]["job_dir"])
    events = _events(job_dir)
    faults = [FaultRecord(id=f["id"], type=f["type"], injected_t=f["injected_t"],
                          undone_t=f.get("undone_t"), target=f.get("target", ""),
                          details=f.get("details") or {},
                          capabilities=tuple(f.get("capabilities") or ()))
              for f in journal["faults"] if not f.get("error")]
    per_fault = {m.fault_id: m for m in compute_metrics(events, faults).faults}
    t0 = events[0]["t"] if events else journal["run"]["started_t"]
    fault_rows = []
    for f in faults:
        m = per_fault.get(f.id)
        b = recovery_breakdown(events, f).to_dict()
        fault_rows.append({
            "id": f.id, "type": f.type, "family": families_of.get(f.type, "unknown"),
            "target": f.target, "injected_s": f.injected_t - t0,
            "undone_s": None if f.undone_t is None else f.undone_t - t0,
            "detected_by": m.detected_by if m else None,
            "detection_latency_s": m.detection_latency_s if m else None,
            "resume_time_s": m.resume_time_s if m else None,
            "lost_steps": m.lost_steps if m else None,
            "high_water_step": m.high_water_step if m else None,
            "resumed_from_step": m.resumed_from_step if m else None,
            "breakdown": b})
    golden = journal.get("golden") or None
    golden_events = []
    if golden and golden.get("run_dir") and Path(golden["run_dir"]).is_dir():
        golden_events = _events(Path(golden["run_dir"]))
    out.update({
        "description": journal["experiment"].get("description"),
        "family": families[0] if families else "none", "families": families,
        "verdict": journal["verdict"], "wall_s": journal["run"].get("wall_s"),
        "error": journal["run"].get("error"), "slas": journal["slas"],
        "detection": journal.get("detection"),
        "metrics": {k: v for k, v in journal["metrics"].items() if k != "faults"},
        "faults": fault_rows,
        "timeline": _timeline(events, t0, fault_rows, golden_events),
        "loss": _loss(events, golden),
        "checkpoints": _checkpoints(events, t0, job_dir),
        "golden": None if not golden else {"digest": golden.get("digest"),
                                           "cached": golden.get("cached")},
    })
    if repeats is not None:
        out.update(verdict=repeats["verdict"], repeats=repeats)
    if journal.get("campaign"):  # scored by run_campaign: its verdict and SLAs are already its
        page = run_folder / "report.html"
        out.update(kind="campaign", family="campaign", families=[], timeline=None,
                   campaign=journal["campaign"],
                   report_html=f"{entry['run_folder']}/report.html" if page.is_file() else None)
    return out


# --------------------------------------------------------------------- series for the plots


def _lead_rank(events: list[Record], kind: str = "step") -> Any:
    ranks = {r.get("rank") for r in events if r.get("kind") == kind}
    ints = sorted(r for r in ranks if isinstance(r, int))
    return ints[0] if ints else None


def _incarnations(events: list[Record]) -> list[list[Record]]:
    """The lead rank's step records, one list per process (a restart is a new process)."""
    lead = _lead_rank(events)
    by_pid: dict[Any, list[Record]] = {}
    for r in events:
        if r.get("kind") == "step" and r.get("rank") == lead and isinstance(r.get("step"), int):
            by_pid.setdefault(r.get("pid"), []).append(r)
    return list(by_pid.values())


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _timeline(events: list[Record], t0: float, faults: list[dict[str, Any]],
              golden_events: list[Record]) -> dict[str, Any]:
    series = [{"label": f"process {i + 1} (restart {steps[0].get('restart', '?')}, world size "
                        f"{steps[0].get('world_size', '?')})",
               "points": [[r["t"] - t0, r["step"]] for r in steps]}
              for i, steps in enumerate(_incarnations(events))]
    golden = None
    if golden_events:
        g0 = golden_events[0]["t"]
        golden = [[r["t"] - g0, r["step"]] for steps in _incarnations(golden_events)
                  for r in steps]
    markers: list[dict[str, Any]] = []
    for f in faults:
        b = f["breakdown"]["boundaries"]
        markers.append({"kind": "injected", "t": f["injected_s"], "label": f"{f['id']} injected"})
        resumed = (None if f["resume_time_s"] is None
                   else f["injected_s"] + f["resume_time_s"] + t0)
        for what, t in (("detected", b.get("detected_t")), ("resumed", resumed),
                        ("recovered", b.get("recovered_t"))):
            if t is not None:
                markers.append({"kind": what, "t": t - t0, "label": f"{f['id']} {what}"})
    lead = _lead_rank(events, "start")
    starts = [r for r in events if r.get("kind") == "start" and r.get("rank") == lead]
    for r in starts[1:]:
        markers.append({"kind": "restart", "t": r["t"] - t0, "step": r.get("resumed_from_step"),
                        "label": f"restart {r.get('restart')} (world size {r.get('world_size')}, "
                                 f"from step {r.get('resumed_from_step')})"})
    saver, loader = _lead_rank(events, "checkpoint_saved"), _lead_rank(events, "checkpoint_loaded")
    for r in events:
        kind = r.get("kind")
        if kind == "checkpoint_saved" and r.get("rank") == saver:
            markers.append({"kind": "checkpoint_saved", "t": r["t"] - t0, "step": r.get("step"),
                            "label": f"checkpoint {r.get('step')} saved"})
        elif kind == "checkpoint_loaded" and r.get("rank") == loader:
            fell_back = r.get("fell_back_from") or []
            markers.append({"kind": "checkpoint_loaded", "t": r["t"] - t0, "step": r.get("step"),
                            "label": f"checkpoint {r.get('step')} loaded"
                                     + (f" (fell back past {len(fell_back)})" if fell_back
                                        else "")})
        elif kind == "anomaly":
            markers.append({"kind": "anomaly", "t": r["t"] - t0, "step": r.get("step"),
                            "label": f"anomaly {r.get('what')} (rank {r.get('rank')})"})
    markers.sort(key=lambda m: m["t"])
    return {"t0": t0, "series": series, "golden": golden, "markers": markers}


def _loss(events: list[Record], golden: dict[str, Any] | None) -> dict[str, Any]:
    series = [{"label": f"process {i + 1} (restart {steps[0].get('restart', '?')})",
               "points": [[r["step"], _num(r.get("loss"))] for r in steps]}
              for i, steps in enumerate(_incarnations(events))]
    golden_points = None
    if golden and golden.get("losses"):
        golden_points = sorted([int(k), _num(v)] for k, v in golden["losses"].items())
    return {"series": series, "golden": golden_points}


# ----------------------------------------------------------------------------- checkpoints


def _dir_bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass  # pruned while we looked
    return total


def _checkpoints(events: list[Record], t0: float, job_dir: Path) -> dict[str, Any]:
    lead = _lead_rank(events, "checkpoint_saved")
    saves = []
    for r in events:
        if r.get("kind") != "checkpoint_saved" or r.get("rank") != lead:
            continue
        seconds, is_async = _num(r.get("seconds")), bool(r.get("async"))
        stall = _num(r.get("stall_s"))
        if stall is None and not is_async:
            stall = seconds  # a synchronous save stalls training for all of it
        saves.append({"step": r.get("step"), "t": r["t"] - t0, "seconds": seconds,
                      "stall_s": stall, "async": is_async, "bytes": _num(r.get("bytes"))})
    ckpt_root = job_dir / "checkpoints"
    on_disk = {}
    if ckpt_root.is_dir():
        for path in sorted(ckpt_root.iterdir()):
            if path.is_dir() and path.name.startswith("step_"):
                on_disk[path.name] = _dir_bytes(path)
    return {"saves": saves, "on_disk_bytes": on_disk, **_summary(saves, list(on_disk.values()))}


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "max": None}
    return {"median": statistics.median(values), "max": max(values)}


def _summary(saves: list[dict[str, Any]], sizes: list[int]) -> dict[str, Any]:
    return {"num_saves": len(saves),
            "save_s": _stats([s["seconds"] for s in saves if s["seconds"] is not None]),
            "stall_s": _stats([s["stall_s"] for s in saves if s["stall_s"] is not None]),
            "size_on_disk_bytes": _stats([float(b) for b in sizes])}


def _checkpoint_cost(experiments: list[dict[str, Any]]) -> dict[str, Any]:
    saves = [s for e in experiments if e.get("checkpoints") for s in e["checkpoints"]["saves"]]
    sizes = [b for e in experiments if e.get("checkpoints")
             for b in e["checkpoints"]["on_disk_bytes"].values()]
    return {**_summary(saves, sizes),
            "per_experiment": [{"experiment": e["name"],
                                **{k: e["checkpoints"][k] for k in
                                   ("num_saves", "save_s", "stall_s", "size_on_disk_bytes")}}
                               for e in experiments if e.get("checkpoints")]}
