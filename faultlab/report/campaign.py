"""A scored campaign as tables: the same rows for ``faultlab run``, report.md and the HTML report.

Input is the journal's ``campaign.score`` (``faultlab.observe.campaign.CampaignScore.to_dict``),
so any past run re-renders.
"""

from __future__ import annotations

from typing import Any

__all__ = ["INJECTION_COLUMNS", "SHORT_INJECTION_COLUMNS", "SUMMARY_TITLE", "TYPE_COLUMNS",
           "campaign_markdown", "injection_rows", "short_injection_rows", "summary_rows",
           "type_rows"]

SUMMARY_TITLE = "Campaign"
TYPE_COLUMNS = ("type", "n", "detected", "attributed", "recovered", "p50 s", "p95 s",
                "lost", "compound")
INJECTION_COLUMNS = ("id", "at", "target", "detected by", "latency s", "named", "attributed",
                     "recovered", "recovery s", "lost", "compound")
SHORT_INJECTION_COLUMNS = ("id", "at", "target", "detected", "attr.", "recovery s", "lost",
                           "compound")


def _num(value: Any, digits: int = 2) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _at(s: dict[str, Any]) -> str:
    """Where an injection landed: its planned step (step clock, with the measured second), or
    its planned second after the launch (wall clock)."""
    if s.get("at_step") is not None:
        return f"step {s['at_step']} ({_num(s.get('at_s'), 1)} s)"
    return f"{_num(s.get('at_s'), 1)} s"


def _frac(num: int, den: int, rate: float | None) -> str:
    return f"{num}/{den}" + (f" ({rate:.0%})" if rate is not None else "")


def summary_rows(score: dict[str, Any]) -> list[tuple[str, str]]:
    """The headline: injections, rates, false positives, ETTR measured beside projected."""
    inputs = score.get("projection_inputs") or {}
    projected = score.get("projected_ettr")
    ratio = (f"{_num(inputs.get('p_down'))} × {_num(inputs.get('lost_per_failure_s'), 1)} s / "
             f"{_num(inputs.get('mtbf_s'), 1)} s")
    how = ((f" (golden {_num(inputs.get('golden_ettr'), 3)} / (1 + {ratio}); "
            f"{_num(inputs.get('mtbf_steps'), 1)} steps between failures = "
            f"{_num(inputs.get('mtbf_s'), 1)} s of training)")
           if inputs.get("clock") == "steps"
           else f" (golden {_num(inputs.get('golden_ettr'), 3)} × (1 − {ratio}))"
           ) if projected is not None else " (not computable: no isolated injection)"
    p95 = score.get("recovery_time_p95_s")
    down = sum(1 for s in score["injections"] if s.get("went_down"))
    never = sum(1 for s in score["injections"] if s.get("went_down") and not s.get("recovered"))
    return [
        ("injections", f"{score['injected']} injected of {score['scheduled']} scheduled "
                       f"({score['compound']} compound)"),
        ("detection rate", _num(score.get("detection_rate"), 3)),
        ("attribution accuracy", _num(score.get("attribution_accuracy"), 3)),
        ("recovery p50 / p95", f"{_num(score.get('recovery_time_p50_s'), 1)} s / "
                               + (f"{_num(p95, 1)} s" if p95 is not None or not never
                                  else f"never ({never} of {down} not recovered)")),
        ("steps lost", str(score.get("lost_steps"))),
        ("false positives", f"{score['false_positives']} in the golden run "
                            f"({_num(score.get('golden_wall_s'), 1)} s): "
                            f"{_num(score.get('false_positives_per_hour'), 1)} per hour"),
        ("ETTR measured", _num(score.get("ettr"), 3)),
        ("ETTR projected", _num(projected, 3) + how),
        ("gap (projected − measured)", _num(score.get("ettr_gap"), 3)),
    ]


def type_rows(score: dict[str, Any]) -> list[tuple[str, ...]]:
    return [(t["type"], str(t["injections"]),
             _frac(t["detected"], t["injections"], t.get("detection_rate")),
             _frac(t["attributed"], t["attributable"], t.get("attribution_accuracy")),
             f"{t['recovered']}/{t['injections']}",
             _num(t.get("recovery_time_p50_s"), 1), _num(t.get("recovery_time_p95_s"), 1),
             str(t["lost_steps"]), str(t["compound"])) for t in score["per_type"]]


def injection_rows(score: dict[str, Any]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for s in score["injections"]:
        if not s.get("injected"):
            out.append((s["fault_id"], _at(s), s["target"],
                        f"not injected: {s.get('error')}", "", "", "", "", "", "", ""))
            continue
        attributed = "n/a" if s.get("attributed") is None and s.get("detected") else \
            _num(s.get("attributed"))
        out.append((s["fault_id"], _at(s), s["target"],
                    s.get("detected_by") or "not detected",
                    _num(s.get("detection_latency_s")),
                    ",".join(map(str, s.get("named_ranks") or [])) or "—", attributed,
                    "—" if not s.get("detected") else "absorbed" if not s.get("went_down")
                    else _num(s.get("recovered")),
                    _num(s.get("recovery_time_s"), 1), _num(s.get("lost_steps")),
                    "; ".join(s.get("compound_reasons") or []) or "no"))
    return out


def short_injection_rows(score: dict[str, Any]) -> list[tuple[str, ...]]:
    """What fits a terminal: one short line per injection (the journal has the rest)."""
    out: list[tuple[str, ...]] = []
    for s in score["injections"]:
        if not s.get("injected"):
            out.append((s["fault_id"], _at(s), s["target"], "not injected",
                        "", "", "", ""))
            continue
        out.append((s["fault_id"], _at(s), s["target"],
                    f"{_num(s.get('detection_latency_s'))} s" if s.get("detected") else "no",
                    "n/a" if s.get("attributed") is None else _num(s.get("attributed")),
                    "—" if not s.get("detected") else "absorbed" if not s.get("went_down")
                    else _num(s.get("recovery_time_s"), 1) if s.get("recovered") else "never",
                    _num(s.get("lost_steps")), "yes" if s.get("compound") else "no"))
    return out


def campaign_markdown(score: dict[str, Any], *, level: int = 2) -> list[str]:
    """The campaign's section at heading ``level`` (a run's report.md: 2; inside an
    experiment's section of a pre-launch report.md: 3), its tables one level below."""
    head = "#" * level
    lines = [f"{head} Campaign", "", "| | |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in summary_rows(score)]
    for title, cols, rows in (("Per fault type", TYPE_COLUMNS, type_rows(score)),
                              ("Injections", INJECTION_COLUMNS, injection_rows(score))):
        lines += ["", f"{head}# {title}", "", "| " + " | ".join(cols) + " |",
                  "| " + " | ".join("---" for _ in cols) + " |"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    if score.get("false_positive_signals"):
        lines += ["", "False positives in the golden run: "
                  + "; ".join(score["false_positive_signals"])]
    return [*lines, ""]
