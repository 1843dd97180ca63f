"""The report's plots: matplotlib figures rendered to SVG strings to inline in the HTML.

Figures are drawn on an Agg canvas (no pyplot, no GUI backend, no global state) and saved
as SVG with text kept as text (``svg.fonttype: none``) and no metadata, so a plot is a few
kilobytes and refers to nothing outside itself. Every id inside an SVG is prefixed with the
plot's own name: several SVGs inlined in one HTML document share one id namespace.

Each function takes a part of report.json and nothing else; the one exception is
``detection_curve_png``, which takes a sweep record (sweep.json) and writes a PNG file beside
sweep.md, for a Markdown page to link.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.rcsetup import cycler

__all__ = ["MARKER_STYLES", "PHASE_COLORS", "campaign_svg", "detection_curve_png", "loss_svg",
           "recovery_svg", "timeline_svg"]

RC: Any = {"svg.fonttype": "none", "svg.hashsalt": "faultlab", "font.size": 9,
      "axes.spines.top": False, "axes.spines.right": False,
      "axes.prop_cycle": cycler(color=["#1f5fbf", "#d9730d", "#2e8b57", "#8e44ad",
                                       "#c0392b", "#16a085"])}

MARKER_STYLES: dict[str, dict[str, Any]] = {
    "injected": {"color": "#c0392b", "linestyle": "-", "linewidth": 1.6},
    "detected": {"color": "#e67e22", "linestyle": "--", "linewidth": 1.2},
    "resumed": {"color": "#2471a3", "linestyle": "--", "linewidth": 1.2},
    "recovered": {"color": "#229954", "linestyle": "-", "linewidth": 1.4},
    "restart": {"color": "#7d3c98", "linestyle": ":", "linewidth": 1.2},
}
"""Vertical lines of the timeline, by marker kind."""

PHASE_COLORS = {"detection": "#c0392b", "teardown": "#e67e22", "rendezvous": "#f1c40f",
                "process_start": "#8e44ad", "process_group_init": "#5dade2",
                "checkpoint_load": "#1f5fbf", "replay": "#27ae60"}


def _finish(fig: Figure, ax: Any, name: str, xlabel: str, ylabel: str | None, *,
            grid: str = "both") -> str:
    """Labels, grid and the legend (``_labels``), then the SVG."""
    _labels(ax, xlabel, ylabel, grid=grid)
    return _svg(fig, name)


def _labels(ax: Any, xlabel: str, ylabel: str | None, *, grid: str = "both") -> None:
    """Labels, grid and the legend outside on the right (every plot alike)."""
    ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    ax.grid(axis=grid, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def _svg(fig: Figure, name: str) -> str:
    FigureCanvasAgg(fig)
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)
    text = re.sub(r'\bid="([^"]+)"', rf'id="{name}-\1"', text)
    text = re.sub(r"url\(#([^)]+)\)", rf"url(#{name}-\1)", text)
    text = re.sub(r'href="#([^"]+)"', rf'href="#{name}-\1"', text)
    # Scale with the page: drop the fixed size, keep the viewBox (and so the aspect ratio).
    text = re.sub(r'^<svg([^>]*?) width="[^"]*" height="[^"]*"',
                  rf'<svg\1 class="plot" role="img" aria-label="{name}"', text, count=1)
    return text.strip()


def _figure(width: float = 9.0, height: float = 3.4) -> Figure:
    return Figure(figsize=(width, height), layout="constrained")


def timeline_svg(timeline: dict[str, Any], name: str) -> str:
    """Step against wall time, with the faults' injected/detected/resumed/recovered lines,
    restarts, checkpoints and the golden run (dashed) for comparison."""
    import matplotlib

    with matplotlib.rc_context(RC):
        fig = _figure()
        ax = fig.add_subplot()
        if timeline.get("golden"):
            t, s = zip(*timeline["golden"], strict=True)
            ax.plot(t, s, color="#999999", linestyle="--", linewidth=1.2,
                    label="golden run (no faults)")
        for series in timeline["series"]:
            if series["points"]:
                t, s = zip(*series["points"], strict=True)
                ax.plot(t, s, marker=".", markersize=3, linewidth=1.4, label=series["label"])
        seen: set[str] = set()
        for m in timeline["markers"]:
            kind = m["kind"]
            label = None if kind in seen else kind
            seen.add(kind)
            if kind in MARKER_STYLES:
                ax.axvline(m["t"], label=label, **MARKER_STYLES[kind])
            elif kind in ("checkpoint_saved", "checkpoint_loaded") and m.get("step") is not None:
                ax.plot([m["t"]], [m["step"]], linestyle="none", color="#222222",
                        marker="v" if kind == "checkpoint_saved" else "^", markersize=6,
                        label=label.replace("_", " ") if label else None)
            elif kind == "anomaly":
                ax.axvline(m["t"], color="#b03a2e", linestyle="-.", linewidth=1, label=label)
        return _finish(fig, ax, name, "seconds since the job started", "step")


def loss_svg(loss: dict[str, Any], name: str) -> str:
    """Loss against step: every process of the faulted run over the golden run."""
    import matplotlib

    with matplotlib.rc_context(RC):
        fig = _figure(height=3.0)
        ax = fig.add_subplot()
        if loss.get("golden"):
            s, v = zip(*loss["golden"], strict=True)
            ax.plot(s, [float("nan") if x is None else x for x in v], color="#bbbbbb",
                    linewidth=4, label="golden run (no faults)")
        for series in loss["series"]:
            if series["points"]:
                s, v = zip(*series["points"], strict=True)
                ax.plot(s, [float("nan") if x is None else x for x in v], marker=".",
                        markersize=4, linewidth=1.2, label=f"faulted: {series['label']}")
        return _finish(fig, ax, name, "step", "loss")


def recovery_svg(recovery: dict[str, Any], name: str) -> str:
    """One horizontal bar per recovered fault, cut into its phases."""
    import matplotlib

    rows = recovery["rows"]
    with matplotlib.rc_context(RC):
        fig = _figure(height=max(1.6, 0.5 * len(rows) + 1.0))
        ax = fig.add_subplot()
        labels = [f"{r['experiment']} / {r['fault_id']}" for r in rows]
        left = [0.0] * len(rows)
        for phase in recovery["phases"]:
            widths = [r["phases"].get(phase) or 0.0 for r in rows]
            ax.barh(labels, widths, left=left, color=PHASE_COLORS.get(phase, "#888888"),
                    label=phase.replace("_", " "), height=0.6)
            left = [a + b for a, b in zip(left, widths, strict=True)]
        ax.invert_yaxis()
        return _finish(fig, ax, name, "seconds since the fault was injected", None, grid="x")


CAMPAIGN_OUTCOMES: dict[str, dict[str, Any]] = {
    "recovered": {"color": "#229954"},
    "absorbed": {"color": "#2471a3"},
    "not recovered": {"color": "#c0392b"},
    "not detected": {"color": "#7f8c8d"},
    "not injected": {"color": "#bdc3c7"},
}
"""An injection's line colour by outcome; a compound injection's line is dashed."""


def campaign_outcome(inj: dict[str, Any]) -> str:
    if not inj.get("injected"):
        return "not injected"
    if not inj.get("detected"):
        return "not detected"
    if not inj.get("went_down"):
        return "absorbed"
    return "recovered" if inj.get("recovered") else "not recovered"


def campaign_svg(series: dict[str, Any], injections: list[dict[str, Any]], name: str) -> str:
    """Step against time (rank 0's records, every incarnation) with every injection marked:
    colour by outcome, dashed if compound, labelled with its id, ``A`` if attributed."""
    import matplotlib

    with matplotlib.rc_context(RC):
        fig = _figure()
        ax = fig.add_subplot()
        if series.get("steps"):
            t, s = zip(*series["steps"], strict=True)
            ax.plot(t, s, marker=".", markersize=2, linewidth=1.0, color="#1f5fbf",
                    label="step (rank 0)")
        seen: set[str] = set()
        top = max((p[1] for p in series.get("steps") or []), default=1)
        for inj in injections:
            at = inj.get("t")
            if at is None:
                continue
            outcome = campaign_outcome(inj)
            label = None if outcome in seen else outcome
            seen.add(outcome)
            ax.axvline(at, linewidth=1.3, linestyle="--" if inj.get("compound") else "-",
                       label=label, **CAMPAIGN_OUTCOMES[outcome])
            mark = " A" if inj.get("attributed") else ""
            ax.text(at, top, f" {inj['fault_id']}{mark}", rotation=90, va="top", fontsize=7)
        return _finish(fig, ax, name, "seconds since the job's first record", "step")


def _detection_curve(sweep: dict[str, Any]) -> Figure:
    """Steps from the fault's onset to each signal's first detection against the swept value
    (log x where the values were log-spaced), hollow where the detection did not name exactly
    the fault's victims; a point that measured and did not detect is an x on the "not detected"
    line above the curves; a point that measured nothing, or a
    detection whose steps were not measured, is left out (the table has it)."""
    points = sweep["points"]
    numeric = all(isinstance(p["value"], int | float) and not isinstance(p["value"], bool)
                  for p in points)
    xs = [p["value"] if numeric else i for i, p in enumerate(points)]
    steps = [s.get("within_steps") for p in points for s in p["signals"] if s.get("detected")]
    top = max([x for x in steps if x is not None] or [1]) * 1.15 + 1
    fig = _figure(height=3.2)
    ax = fig.add_subplot()
    for i, name in enumerate(sweep["signals"]):
        color = RC["axes.prop_cycle"].by_key()["color"][i % 6]
        hit, miss, unnamed = [], [], []
        for x, p in zip(xs, points, strict=True):
            if not p["measured"]:
                continue
            s: dict[str, Any] = next((s for s in p["signals"] if s["name"] == name), {})
            if s.get("detected") and s.get("within_steps") is not None:
                hit.append((x, s["within_steps"]))
                if s.get("attribution") != "exact":
                    unnamed.append((x, s["within_steps"]))
            elif not s.get("detected"):
                miss.append(x)
        if hit:
            ax.plot(*zip(*hit, strict=True), marker="o", markersize=5, linewidth=1.4,
                    color=color, label=name)
        if unnamed:  # hollow: it fired, but did not name exactly the victims
            ax.plot(*zip(*unnamed, strict=True), linestyle="none", marker="o", markersize=7,
                    markerfacecolor="white", color=color,
                    label=f"{name}: not naming exactly the victims")
        if miss:  # each signal a little apart, so that two misses at one value both show
            ax.plot(miss, [top * (1 + 0.035 * i)] * len(miss), linestyle="none", marker="x",
                    markersize=8, color=color, label=f"{name}: not detected")
    ax.axhline(top, color="#999999", linestyle=":", linewidth=1)
    ax.set_ylim(bottom=0, top=top * (1.1 + 0.035 * len(sweep["signals"])))
    ticks = [t for t in ax.get_yticks() if 0 <= t < top * 0.9 and float(t).is_integer()]
    ax.set_yticks([*ticks, top], [f"{t:g}" for t in ticks] + ["not detected"])
    if sweep["param"].get("scale") == "log" and numeric:
        ax.set_xscale("log")
    if not numeric:
        ax.set_xticks(xs, [repr(p["value"]) for p in points])
    if not ax.get_legend_handles_labels()[0]:
        ax.plot([], [], label="no signal measured")
    _labels(ax, sweep["param"]["path"], "steps from onset to detection")
    return fig


def detection_curve_png(sweep: dict[str, Any], path: Path) -> None:
    """The detection curve of a sweep record (``faultlab.report.sweep``) as a PNG file:
    sweep.png, beside sweep.md, which links it."""
    import matplotlib

    with matplotlib.rc_context(RC):
        fig = _detection_curve(sweep)
        FigureCanvasAgg(fig)
        fig.savefig(path, format="png", dpi=110, bbox_inches="tight",
                    metadata={"Software": None})
