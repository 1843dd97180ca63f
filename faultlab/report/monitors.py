"""Monitors side by side: what each monitor did about the same fault, read from the journals.

One row per monitor: detected or not, the steps from the fault's onset to its first detection
after it (``within_steps``), its attribution (``exact``, ``extra``, ``wrong``, ``none``), and
its false alarms in the fault-free golden run(s). ``faultlab run --bar`` sets a team's
declared monitors (``observe.detections``) beside the bar's, the reference trainer's own
(``BAR_MONITORS``, its ``anomaly:<what>`` records), on the same faults;
``benchmarks/monitors_compared.py`` builds docs/results/monitors-compared.md from the same
cells. A cell never reads as a miss where nothing was measured: a run that did not happen, a
fault that never struck, a golden run that was not scanned each say so.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["BAR_MONITORS", "MONITORS_HEADER", "Outcome", "false_alarms_text", "monitor_rows",
           "monitors_markdown", "never_struck", "outcome"]

BAR_MONITORS = (("anomaly:sdc_suspected", "cross-replica fingerprint"),
                ("anomaly:loss_spike", "loss spike check"),
                ("anomaly:grad_norm_spike", "grad-norm spike check"),
                ("anomaly:straggler", "straggler score"))
"""The reference trainer's bar monitors: (the signal its ``anomaly`` records are, the name)."""

MONITORS_HEADER = ["side", "monitor", "detected", "steps from onset", "attribution",
                   "false alarms"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one monitor did in one run; ``why``: why nothing could be measured (then the
    other fields are None), and ``detail`` what the run recorded of it."""

    detected: bool | None = None
    steps: int | None = None
    attribution: str | None = None
    why: str | None = None
    detail: str | None = None


def outcome(journal: dict[str, Any] | None, signal: str) -> Outcome:
    """``signal``'s first detection after the onset in the run of ``journal``."""
    if journal is None:
        return Outcome(why="not run")
    det = journal.get("detection")
    if not isinstance(det, dict):
        return Outcome(why="not measured (no detection record)")
    if det.get("onset") is None:
        return Outcome(why="fault never struck", detail=never_struck(journal) or None)
    s = next((x for x in det.get("signals") or [] if x["name"] == signal), None)
    if s is None or not s.get("detected"):
        return Outcome(detected=False)
    return Outcome(True, s.get("within_steps"), s.get("attribution") or "none")


def never_struck(journal: dict[str, Any]) -> str:
    """Why a run has no onset, as it recorded it: each fault's error and each failed
    ``fault_injected`` SLA's note ('' where it recorded none)."""
    why = [f"{f['id']}: {f['error']}" for f in journal.get("faults") or [] if f.get("error")]
    why += [f"{s['name']}: {s['note']}" for s in journal.get("slas") or []
            if str(s.get("name", "")).startswith("fault_injected") and s.get("passed") is False
            and s.get("note")]
    return "; ".join(why)


def false_alarms_text(journals: Iterable[dict[str, Any] | None], signal: str) -> str:
    """``signal``'s false alarms in the golden run(s) of these runs (one golden serves them
    all); a trainer's ``anomaly:`` signal that never fired counts 0 where the golden run's
    alarms were counted (its ``false_alarms`` SLA measured), else "not measured"."""
    runs = [j for j in journals if j]
    seen = {s.get("false_alarms") for j in runs if isinstance(j.get("detection"), dict)
            for s in j["detection"].get("signals") or [] if s["name"] == signal}
    if not seen:
        counted = any(sla.get("name") == "false_alarms" and sla.get("measured") is not None
                      for j in runs for sla in j.get("slas") or [])
        return "0" if counted and signal.startswith("anomaly:") else "not measured"
    return " / ".join("not measured" if a is None else str(a) for a in sorted(
        seen, key=lambda a: -1 if a is None else a))


def _cells(o: Outcome) -> list[str]:
    if o.why is not None:
        return [o.why + (" (why: below)" if o.detail else ""), "—", "—"]
    if not o.detected:
        return ["not detected", "—", "—"]
    return ["yes", "?" if o.steps is None else str(o.steps), o.attribution or "none"]


def monitor_rows(team: dict[str, Any], team_signals: Sequence[str],
                 bar: dict[str, Any] | None, bar_why: str | None = None
                 ) -> tuple[list[list[str]], list[str]]:
    """The table of ``--bar``'s monitor comparison and its notes: each of the team's declared
    signals, then each bar monitor and any other ``anomaly:`` signal of the bar's run.
    ``bar``: the bar's journal; ``bar_why``: why the bar could not run the same faults. What
    made a side's cells unmeasured is said once, as a note, and each such cell points at it."""
    rows, notes = [], []
    for name in team_signals:
        o = outcome(team, name)
        rows.append(["team", name, *_cells(o), false_alarms_text([team], name)])
        notes += [f"team: {o.why}: {o.detail}"] if o.detail else []
    known = dict(BAR_MONITORS)
    seen = [s["name"] for s in ((bar or {}).get("detection") or {}).get("signals") or []
            if s["name"].startswith("anomaly:") and s["name"] not in known]
    for signal in [*known, *dict.fromkeys(seen)]:
        label = f"{known.get(signal, signal)} ({signal})"
        o = outcome(bar, signal) if bar_why is None else Outcome(why="not run", detail=bar_why)
        alarms = "—" if bar_why is not None else false_alarms_text([bar], signal)
        rows.append(["bar", label, *_cells(o), alarms])
        notes += [f"bar: {o.why}: {o.detail}"] if o.detail else []
    return rows, list(dict.fromkeys(notes))


def monitors_markdown(rows: Sequence[Sequence[str]]) -> list[str]:
    """``monitor_rows`` as a Markdown table."""
    def esc(cell: str) -> str:
        return cell.replace("|", "\\|")
    return ["| " + " | ".join(MONITORS_HEADER) + " |", "|" + " --- |" * len(MONITORS_HEADER),
            *("| " + " | ".join(map(esc, r)) + " |" for r in rows)]
