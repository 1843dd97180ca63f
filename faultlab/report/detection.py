"""The journal's ``detection`` section as people read it: one row per signal (detected or not,
within how many seconds and steps, whom it named, false alarms), and the ground truth of a
fault no signal detected. The Markdown report and the terminal verdict show the same rows."""

from __future__ import annotations

from typing import Any

__all__ = ["DETECTION_HEADER", "detection_lines", "detection_markdown", "detection_rows",
           "onset_text"]

DETECTION_HEADER = ["signal", "detected", "within", "named", "attribution", "false alarms"]


def onset_text(onset: dict[str, Any] | None) -> str:
    if onset is None:
        return "no fault that slows the job or corrupts silently struck: nothing to detect"
    who = ", ".join([*(f"rank {r}" for r in onset.get("ranks") or []),
                     *(onset.get("nodes") or [])]) or "unknown victims"
    return f"onset: {onset['fault_id']} at step {onset.get('step')} on {who}"


def _named(s: dict[str, Any]) -> str:
    if s.get("ranks") is not None:
        return "ranks " + ", ".join(map(str, s["ranks"]))
    if s.get("nodes") is not None:
        return ", ".join(s["nodes"])
    return "nobody" if s.get("detected") else "—"


def detection_rows(section: dict[str, Any]) -> list[list[str]]:
    rows = []
    for s in section.get("signals") or []:
        within = "—"
        if s.get("detected"):
            steps = s.get("within_steps")
            within = f"{s['within_s']:.2f} s" + (f", {steps} steps" if steps is not None
                                                  else "")
        alarms = s.get("false_alarms")
        rows.append([s["name"], "yes" if s.get("detected") else "NOT DETECTED", within,
                     _named(s), s.get("attribution") or "—",
                     "not measured" if alarms is None else str(alarms)])
    return rows


def detection_lines(section: dict[str, Any]) -> list[str]:
    """What the verdict adds under the table: the onset, and the ground truth of a fault no
    signal detected."""
    signals = section.get("signals") or []
    lines = [onset_text(section.get("onset"))]
    if section.get("onset") is not None and not any(s.get("detected") for s in signals):
        by = ", ".join(s["name"] for s in signals) or \
            "any signal (none declared, and the trainer wrote no anomaly)"
        lines.append(f"not detected by {by}: {section['onset'].get('ground_truth')}")
    return lines


def detection_markdown(section: dict[str, Any] | None, heading: str = "##") -> list[str]:
    """The block of report.md (a run's; ``heading`` "###" in a suite's, under its
    experiment)."""
    if not section:
        return []
    out = ["", f"{heading} Detection", "", *(f"- {line}" for line in detection_lines(section))]
    rows = detection_rows(section)
    if rows:
        out += ["", "| " + " | ".join(DETECTION_HEADER) + " |",
                "|" + " --- |" * len(DETECTION_HEADER),
                *("| " + " | ".join(r) + " |" for r in rows)]
    return out
