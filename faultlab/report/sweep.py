"""The folder of a sweep (``faultlab sweep``): the detection curve, and its renderings.

    OUT/                (default REPORT_DIR/<name>-sweep-<timestamp>/)
        sweep.json      the record: the swept path and values, each point's run folder,
                        verdict, error, the fault's onset and every signal's detection as the
                        run's journal says (its ``detection`` section), and each signal's
                        threshold (rewritten after every point)
        sweep.md        the table and the thresholds, with the plot
        sweep.png       steps to detect against the swept value (``plots.detection_curve_png``)
        runs/           each point's own run folder, as ``faultlab run`` writes it

A point reads its journal's ``detection`` section (``onset``, ``signals``: one entry per
declared signal, and one per kind of the trainer's own ``anomaly`` records that fired). A
signal missing from a point whose journal has the section did not fire there: not detected.
A point without the section (it could not run, or its fault never struck) measured nothing,
which is never "not detected". A signal's thresholds: the smallest value it noticed at, and the
smallest at which its first detection named exactly the victims (``attribution: exact``).
Top level of sweep.json::

    schema_version 1, kind "faultlab_sweep", experiment {name, file, seed, description},
    param {path, scale, values}, started_t, ended_t, wall_s, interrupted, num_points,
    golden {key, digest} or null, points [...], signals [names], thresholds [...]
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from faultlab.report import _format as fmt
from faultlab.report.journal import read_journal, strict_json

__all__ = ["SWEEP_RECORD", "cell", "is_sweep_folder", "point_record", "render_sweep_markdown",
           "rerender_folder", "sweep_rows", "threshold_text", "thresholds",
           "write_sweep"]

SCHEMA_VERSION = 1
SWEEP_RECORD = "sweep.json"
KIND = "faultlab_sweep"
ATTRIBUTION = {"exact": "attributed", "extra": "named the victims and others",
               "wrong": "named others only", "none": "named nobody"}
"""How each ``attribution`` of the detection contract reads in a cell."""


def is_sweep_folder(folder: Path) -> bool:
    return (folder / SWEEP_RECORD).is_file()


def point_record(index: int, value: Any, journal: dict[str, Any], *, run_folder: str,
                 error: str | None) -> dict[str, Any]:
    """One point of sweep.json from its run's journal (``{}``: it has none)."""
    detection = journal.get("detection")
    run = journal.get("run") or {}
    noise = next((s for s in journal.get("slas") or []
                  if s.get("name") == "matches_golden_within_noise"), None)
    return {"index": index, "value": value, "run_folder": run_folder,
            "verdict": journal.get("verdict"), "error": error,
            # how far the corruption carried: the run's distance from the golden run in units
            # of the fault-free runs' noise, where the experiment asks for it
            "noise_units": None if noise is None else noise.get("measured"),
            "noise_bound": None if noise is None else noise.get("bound"),
            "timed_out": bool(run.get("timed_out")),
            "measured": error is None and isinstance(detection, dict)
            and detection.get("onset") is not None,
            "onset": detection.get("onset") if isinstance(detection, dict) else None,
            "has_detection": isinstance(detection, dict),
            "signals": list(detection.get("signals") or []) if isinstance(detection, dict)
            else []}


def signal_names(points: list[dict[str, Any]]) -> list[str]:
    """Every signal some point reports, in the order they first appear."""
    return list(dict.fromkeys(s["name"] for p in points for s in p["signals"]))


def _signal(point: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The point's entry for ``name``: its own, ``{"detected": False}`` when the point measured
    and the signal did not fire, None when the point measured nothing."""
    if not point["measured"]:
        return None
    found = next((s for s in point["signals"] if s["name"] == name), None)
    return found or {"name": name, "detected": False}


def cell(point: dict[str, Any], name: str) -> str:
    """``5 steps / 1.70 s, attributed``, ``not detected``, or why nothing was measured."""
    if point["error"]:
        return "could not run"
    if not point["has_detection"]:
        return "not measured (no detection record)"
    if not point["measured"]:
        return "fault never struck"
    s = _signal(point, name)
    assert s is not None
    if not s.get("detected"):
        text = "not detected"
    else:
        steps = s.get("within_steps")
        took = [f"{steps} step{'s' if steps != 1 else ''}" if steps is not None else None,
                fmt.seconds(s["within_s"]) if s.get("within_s") is not None else None]
        text = " / ".join(t for t in took if t) or "detected (latency not measured)"
        text += f", {ATTRIBUTION.get(str(s.get('attribution')), 'attribution not measured')}"
    if s.get("false_alarms"):
        text += f", {s['false_alarms']} false alarm(s)"
    return text


def _numeric(points: list[dict[str, Any]]) -> bool:
    return all(isinstance(p["value"], int | float) and not isinstance(p["value"], bool)
               for p in points)


def _ordered(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """By value when every value is a number (the curve's x), else as they ran."""
    return sorted(points, key=lambda p: p["value"]) if _numeric(points) else list(points)


def thresholds(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per signal: the smallest value that it noticed, whether every larger measured value
    was noticed too (else which were missed: a non-monotone curve), the values that measured
    nothing, and its false alarms in the golden run(s) (the most any point reports)."""
    out = []
    ordered = _ordered(points)
    numeric = _numeric(points)
    for name in signal_names(points):
        seen = [(p["value"], _signal(p, name)) for p in ordered]
        measured = [(v, bool(s.get("detected"))) for v, s in seen if s is not None]
        first, missed = _first(measured)
        exact, unnamed = _first([(v, bool(s.get("detected")) and s.get("attribution") == "exact")
                                 for v, s in seen if s is not None])
        alarms = [s.get("false_alarms") for _v, s in seen if s is not None]
        known = [a for a in alarms if a is not None]
        out.append({"signal": name, "ordered": numeric,
                    "noticed_at": [v for v, hit in measured if hit],
                    "missed_at": [v for v, hit in measured if not hit],
                    "attributed_at": [v for v, s in seen if s is not None and s.get("detected")
                                      and s.get("attribution") == "exact"],
                    "first_noticed": None if first is None else measured[first][0],
                    "monotone": first is not None and not missed,
                    "everywhere": first == 0 and not missed,
                    "missed_above": missed,
                    "first_attributed": None if exact is None else measured[exact][0],
                    "unattributed_above": unnamed,
                    "not_measured": [v for v, s in seen if s is None],
                    "false_alarms": max(known) if known else None})
    return out


def _first(measured: list[tuple[Any, bool]]) -> tuple[int | None, list[Any]]:
    """The index of the first hit, and the values after it that were not hits."""
    first = next((i for i, (_v, hit) in enumerate(measured) if hit), None)
    return first, [v for v, hit in measured[first:] if not hit] if first is not None else []


def threshold_text(t: dict[str, Any]) -> str:
    """One line: where the signal starts to notice, said plainly when it is not monotone;
    over values that are not numbers (surfaces, persistences), where it noticed and not."""
    if t["first_noticed"] is None:
        text = "never noticed"
    elif not t.get("ordered", True):
        return _unordered_text(t)
    elif t["missed_above"]:
        text = (f"first noticed at {t['first_noticed']!r}, but missed at "
                f"{', '.join(map(repr, t['missed_above']))} above it: not monotone")
    elif t["everywhere"]:
        text = f"noticed at every value measured, from {t['first_noticed']!r}"
    else:
        text = f"noticed from {t['first_noticed']!r} on, and at every larger value"
    text += _attributed_text(t)
    if t["not_measured"]:
        text += f"; not measured at {', '.join(map(repr, t['not_measured']))}"
    return text + _alarms_text(t["false_alarms"])


def _unordered_text(t: dict[str, Any]) -> str:
    """Values with no order (a surface, a persistence): no threshold, only where."""
    def said(values: list[Any]) -> str:
        return ", ".join(map(repr, values)) or "none"

    text = f"noticed at {said(t['noticed_at'])}"
    text += f"; not at {said(t['missed_at'])}" if t["missed_at"] else " (every value measured)"
    if t["attributed_at"] != t["noticed_at"]:
        text += f"; named exactly the victims only at {said(t['attributed_at'])}"
    if t["not_measured"]:
        text += f"; not measured at {said(t['not_measured'])}"
    return text + _alarms_text(t["false_alarms"])


def _alarms_text(fa: int | None) -> str:
    return ("; false alarms in the golden run(s): not measured" if fa is None else
            f"; {fa} false alarm(s) in the golden run(s): it fires without a fault" if fa
            else "; 0 false alarms in the golden run(s)")


def _attributed_text(t: dict[str, Any]) -> str:
    """Whether it named the victims exactly where it noticed: a detection that names another
    rank noticed something, not the fault's victim."""
    exact = t.get("first_attributed")
    if t["first_noticed"] is None:
        return ""
    if exact is None:
        return "; never named exactly the victims"
    if exact == t["first_noticed"] and not t["unattributed_above"]:
        return "; named exactly the victims wherever it noticed"
    text = f"; named exactly the victims from {exact!r}"
    if t["unattributed_above"]:
        return text + (f", but not at {', '.join(map(repr, t['unattributed_above']))} above "
                       f"it")
    return text + " on"


def sweep_rows(record: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The table: one row per point (in the order they ran), a column per signal."""
    names = record["signals"]
    noise = any(p.get("noise_bound") is not None for p in record["points"])
    header = [record["param"]["path"], "verdict", "onset", *names,
              *(["from golden (noise units)"] if noise else [])]
    rows = []
    for p in record["points"]:
        onset = p["onset"]
        where = "—" if onset is None else (
            f"step {onset.get('step')}" + (f", ranks {onset['ranks']}" if onset.get("ranks")
                                           else ""))
        verdict = f"error: {p['error']}" if p["error"] else (p["verdict"] or "—")
        far = p.get("noise_units")
        rows.append([repr(p["value"]), verdict + (" (timed out)" if p["timed_out"] else ""),
                     where, *(cell(p, n) for n in names),
                     *([_noise_units(far, p.get("noise_bound"))] if noise else [])])
    return header, rows


def _noise_units(far: float | None, bound: float | None) -> str:
    if far is None:
        return fmt.NOT_MEASURED
    shown = f"{far:,.0f}" if far >= 100 else f"{far:.3g}"
    return shown + (f" (bound {bound:g})" if bound is not None else "")


def render_sweep_markdown(record: dict[str, Any]) -> str:
    exp, param = record["experiment"], record["param"]
    header, rows = sweep_rows(record)
    ran = len(record["points"])
    lines = [f"# Sweep of {exp['name']}: {param['path']}", "",
             f"- experiment: `{exp.get('file') or exp['name']}` (seed {exp.get('seed')})",
             f"- swept: `{param['path']}` over {', '.join(map(repr, param['values']))} "
             f"({param['scale']})",
             f"- points run: {ran} of {record['num_points']}"
             + (" (interrupted)" if record.get("interrupted") else ""),
             f"- wall time: {fmt.seconds(record.get('wall_s'))}", "",
             "A sweep is a measurement, not a verdict: each point's own verdict is in its run "
             "folder.", ""]
    if not record["signals"]:
        lines += ["No signal was measured: no run's journal names a detection (declare the "
                  "team's signals under `observe.detections`).", ""]
    lines += ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    lines += ["", "## Where each signal starts to notice", ""]
    lines += [f"- **{t['signal']}**: {threshold_text(t)}"
              for t in record["thresholds"]] or ["- no signal measured"]
    lines += ["", "![detection curve](sweep.png)", "", "## Runs", ""]
    lines += [f"- {p['index']}: `{param['path']}={p['value']!r}`: `{p['run_folder']}`"
              for p in record["points"]]
    return "\n".join(lines) + "\n"


def write_sweep(folder: Path, record: dict[str, Any]) -> dict[str, Any]:
    """Complete ``record`` (signals, thresholds), write sweep.json (atomically), sweep.md and
    sweep.png; returns the record as written."""
    from faultlab.report.plots import detection_curve_png

    points = record["points"]
    record = strict_json({"schema_version": SCHEMA_VERSION, "kind": KIND, **record,
                          "signals": signal_names(points), "thresholds": thresholds(points)})
    path = folder / SWEEP_RECORD
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1, allow_nan=False, default=str) + "\n")
    os.replace(tmp, path)
    (folder / "sweep.md").write_text(render_sweep_markdown(record))
    detection_curve_png(record, folder / "sweep.png")
    return record


def rerender_folder(folder: Path) -> dict[str, Any]:
    """Read every point's journal again and rewrite the sweep's files (``faultlab report``)."""
    record = json.loads((folder / SWEEP_RECORD).read_text())
    if record.get("schema_version") != SCHEMA_VERSION or record.get("kind") != KIND:
        raise ValueError(f"{folder / SWEEP_RECORD}: not a sweep record this faultlab reads "
                         f"(schema_version {record.get('schema_version')!r}, kind "
                         f"{record.get('kind')!r})")
    points = []
    for p in record["points"]:
        try:
            journal = read_journal(folder / p["run_folder"])
        except (OSError, ValueError):
            journal = {}
        points.append(point_record(p["index"], p["value"], journal,
                                   run_folder=p["run_folder"], error=p["error"]))
    record.pop("signals", None)
    record.pop("thresholds", None)
    return write_sweep(folder, {**record, "points": points})
