"""report.md of a pre-launch suite: a rendering of report.json (the plots are in report.html)."""

from __future__ import annotations

from typing import Any

from faultlab.report import _format as fmt
from faultlab.report.detection import detection_markdown

__all__ = ["render_suite_markdown"]

PROJECTION_ROWS = (
    ("nodes", "num_nodes", fmt.number),
    ("MTBF of the whole job", "mtbf_job_h", lambda v: fmt.seconds(v * 3600)),
    ("expected failures per day", "failures_per_day", fmt.number),
    ("checkpoint cost C at full scale", "checkpoint_cost_s", fmt.seconds),
    ("optimal checkpoint interval τ (Young)", "interval_s", fmt.seconds),
    ("… in steps", "interval_steps", fmt.number),
    ("lost per failure (R + τ/2)", "lost_per_failure_s", fmt.seconds),
    ("time stalled on checkpoints (C/τ)", "checkpoint_overhead", fmt.percent),
    ("time lost to failures (L/M)", "failure_overhead", fmt.percent),
    ("goodput", "goodput", fmt.percent),
    ("lost GPU-hours per day", "lost_gpu_hours_per_day", fmt.number),
    ("… of which checkpoints", "checkpoint_gpu_hours_per_day", fmt.number),
    ("… of which failures", "failure_gpu_hours_per_day", fmt.number),
    ("GPU-hours of one failure's restart (R)", "restart_gpu_hours_per_failure", fmt.number),
    ("GPU-hours of one failure with redone work (L)", "lost_gpu_hours_per_failure", fmt.number),
    ("USD of one failure's restart", "restart_usd_per_failure", fmt.usd),
    ("USD of one failure with redone work", "lost_usd_per_failure", fmt.usd),
    ("USD lost per day", "lost_usd_per_day", fmt.usd),
    ("expected failures over the run", "run_failures", fmt.number),
    ("GPU-hours lost over the run", "run_lost_gpu_hours", fmt.number),
    ("USD lost over the run", "run_lost_usd", fmt.usd),
)
"""(label, key of projection.results, formatter): shared with the HTML rendering."""


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out + [""]


def sla_summary(slas: list[dict[str, Any]]) -> str:
    """One line per experiment: ``recovery_time_s 4.77 s (≤ 40.00 s) ✓; …``."""
    return "; ".join(f"{s['name']} {fmt.sla_measured(s)} "
                     f"({fmt.sla_bound(s['name'], s['bound'], s.get('limit'))}) "
                     f"{fmt.result_mark(s)}"
                     for s in slas if not s["name"].startswith("fault_injected"))


def scorecard_verdict(entry: dict[str, Any]) -> str:
    """``PASS``, or for a repeated experiment ``PASS (19/20)``."""
    repeats = entry.get("repeats")
    return fmt.verdict(entry["verdict"]) + (
        f" ({repeats['num_passed']}/{repeats['num_runs']})" if repeats else "")


def repeat_sla_summary(repeats: dict[str, Any]) -> str:
    """One line over the runs: ``resume_time_s median 5.10 s, p95 7.02 s (≤ 30.00 s) 20/20;
    …``."""
    from faultlab.report.repeats import spread_rows

    rows = spread_rows(repeats)[0]
    return "; ".join(f"{name} " + (f"median {median}, {tail} " if median != "—" else "")
                     + f"({bound}) {met}" for name, bound, met, median, tail, _h in rows
                     if not name.startswith("fault_injected"))


def render_suite_markdown(report: dict[str, Any]) -> str:
    suite, env = report["suite"], report["environment"]
    lines = [f"# Pre-launch report: {suite['name']}: {fmt.verdict(report['verdict'])}", ""]
    if suite.get("description"):
        lines += [suite["description"].strip(), ""]
    passed = sum(1 for e in report["scorecard"] if e["verdict"] == "pass")
    inconclusive = sum(1 for e in report["scorecard"] if e["verdict"] == "inconclusive")
    lines += [f"- {passed} of {len(report['scorecard'])} experiments passed"
              + (f", {inconclusive} inconclusive (nothing failed, but a correctness SLA "
                 f"could not be measured)" if inconclusive else "")
              + (" (interrupted)" if report.get("interrupted") else ""),
              f"- suite file: `{suite.get('file')}`; run {fmt.timestamp(report.get('started_t'))}"
              f" to {fmt.timestamp(report.get('ended_t'))}",
              f"- git {env.get('git_sha') or 'unknown'}, host {env.get('host', '?')}", ""]

    lines += ["## Scorecard", ""]
    lines += _table(["family", "verdict", "experiments", "fault types"],
                    [[f["family"], fmt.verdict(f["verdict"]), ", ".join(f["experiments"]) or "—",
                      ", ".join(f["fault_types"]) or "—"] for f in report["families"]])
    lines += _table(["family", "experiment", "verdict", "measured vs SLA"],
                    [[e["family"], _linked(e), scorecard_verdict(e),
                      (repeat_sla_summary(e["repeats"]) if e.get("repeats")
                       else sla_summary(e["slas"])) or e.get("error") or "—"]
                     for e in report["scorecard"]])

    lines += _projection(report["projection"])
    lines += _recovery(report["recovery"])
    lines += _checkpoint_cost(report["checkpoint_cost"])
    for exp in report["experiments"]:
        lines += _experiment(exp)

    lines += ["## Environment", ""]
    lines += _table(["", ""], [[k, v] for k, v in env.items() if not isinstance(v, list | dict)]
                    + [["gpus", ", ".join(f"{g['name']} ({g['memory_gib']} GiB)"
                                          for g in env.get("gpus") or []) or "none"]])
    return "\n".join(lines)


def _linked(entry: dict[str, Any]) -> str:
    """The scorecard's name cell: a campaign links its own report.html."""
    if entry.get("report_html"):
        return f"{entry['experiment']} ([report.html]({entry['report_html']}))"
    return str(entry["experiment"])


def _projection(projection: dict[str, Any]) -> list[str]:
    inputs, results = projection["inputs"], projection["results"]
    lines = ["## Projection to the planned run", "",
             f"Measured here: checkpoint stall C_meas = "
             f"{fmt.seconds(inputs.get('measured_checkpoint_stall_s'), 3)} for "
             f"{fmt.number(inputs.get('measured_checkpoint_size_gb'), 3)} GB on disk (median "
             f"over every save); restart overhead R = "
             f"{fmt.seconds(inputs.get('measured_restart_overhead_s'))} (the worst measured, "
             f"{inputs.get('restart_overhead_from') or '—'}).", ""]
    plan_keys = ("num_gpus", "gpus_per_node", "mtbf_per_gpu_h", "mtbf_per_node_h",
                 "step_time_s", "checkpoint_size_gb", "storage_bandwidth_gb_s", "run_days",
                 "gpu_hour_cost_usd")
    lines += _table(["plan", "value"], [[k, fmt.number(inputs.get(k))] for k in plan_keys
                                        if inputs.get(k) is not None])
    lines += _table(["expected", "value"],
                    [[label, f(results[key])] for label, key, f in PROJECTION_ROWS
                     if results.get(key) is not None])
    lines += ["Formulas:", ""] + [f"- {f['quantity']}: `{f['formula']}`"
                                  for f in projection["formulas"]] + [""]
    lines += [f"> {note}" for note in results.get("notes", [])]
    return lines + ([""] if results.get("notes") else [])


def _recovery(recovery: dict[str, Any]) -> list[str]:
    lines = ["## Recovery time, phase by phase", ""]
    if not recovery["rows"]:
        return lines + ["No fault took the job down.", ""]
    phases = recovery["phases"]
    lines += _table(["experiment / fault", *phases, "recovery", "restart overhead"],
                    [[f"{r['experiment']} / {r['fault_id']}",
                      *[fmt.seconds(r["phases"].get(p)) for p in phases],
                      fmt.seconds(r["recovery_time_s"]), fmt.seconds(r["restart_overhead_s"])]
                     for r in recovery["rows"]])
    return lines


def _checkpoint_cost(cost: dict[str, Any]) -> list[str]:
    lines = ["## Checkpoint cost", ""]
    rows = [[c["experiment"], c["num_saves"], fmt.seconds(c["save_s"]["median"], 3),
             fmt.seconds(c["stall_s"]["median"], 3), fmt.seconds(c["stall_s"]["max"], 3),
             fmt.size(c["size_on_disk_bytes"]["median"])] for c in cost["per_experiment"]]
    rows.append(["**all**", cost["num_saves"], fmt.seconds(cost["save_s"]["median"], 3),
                 fmt.seconds(cost["stall_s"]["median"], 3),
                 fmt.seconds(cost["stall_s"]["max"], 3),
                 fmt.size(cost["size_on_disk_bytes"]["median"])])
    return lines + _table(["experiment", "saves", "save (median)", "training stall (median)",
                           "stall (max)", "size on disk (median)"], rows)


def _repeats(repeats: dict[str, Any]) -> list[str]:
    from faultlab.report.repeats import METRIC_HEADER, SLA_HEADER, spread_rows

    sla_rows, metric_rows = spread_rows(repeats)
    return ([f"Over {repeats['num_runs']} runs: {repeats['stability']}. The tail is the p95 of "
             f"an upper bound, the p5 of a lower one; the tables after these are of run "
             f"{repeats['shown_index']} (`{repeats['shown_run']}`), the first that failed, "
             f"else the first.", ""]
            + _table(SLA_HEADER, sla_rows) + _table(METRIC_HEADER, metric_rows))


def _experiment(exp: dict[str, Any]) -> list[str]:
    lines = [f"## {exp['name']}: {fmt.verdict(exp['verdict'])}", ""]
    if exp.get("description"):
        lines += [exp["description"].strip(), ""]
    lines += [f"- file `{exp['file']}`, family {exp['family']}"
              + (f", run folder `{exp['run_folder']}`" if exp.get("run_folder") else ""), ""]
    if exp.get("error"):
        lines += [f"**Error:** {exp['error']}", ""]
    if exp.get("repeats"):
        lines += _repeats(exp["repeats"])
    if exp.get("slas"):
        lines += _table(["SLA", "bound", "measured", "result"],
                        [[s["name"], fmt.sla_bound(s["name"], s["bound"], s.get("limit")),
                          fmt.sla_measured(s)
                          + (f" ({s['note']})" if s.get("note") else ""),
                          fmt.result_word(s, markdown=True)] for s in exp["slas"]])
    if exp.get("detection"):
        lines += detection_markdown(exp["detection"], "###")[1:] + [""]
    if exp.get("campaign"):
        from faultlab.report.campaign import campaign_markdown

        lines += ["A campaign: its injections overlap by design, so they stay out of the "
                  "recovery phases, the checkpoint cost and the projection above; ETTR "
                  "measured against projected for its own rate is its headline. Step against "
                  "time with every injection marked: report.html"
                  + (f", and its own page [{exp['report_html']}]({exp['report_html']})."
                     if exp.get("report_html") else "."), ""]
        return [*lines, *campaign_markdown(exp["campaign"]["score"], level=3)]
    if exp.get("faults"):
        lines += _table(["fault", "type", "target", "injected", "detected by", "detection",
                         "resume", "recovery", "lost steps"],
                        [[f["id"], f["type"], f["target"], f"+{f['injected_s']:.2f} s",
                          f.get("detected_by") or "—", fmt.seconds(f["detection_latency_s"]),
                          fmt.seconds(f["resume_time_s"]),
                          fmt.seconds(f["breakdown"]["recovery_time_s"]),
                          fmt.number(f["lost_steps"])] for f in exp["faults"]])
    timeline = exp.get("timeline")
    if timeline and timeline["markers"]:
        lines += ["Timeline (seconds since the job started):", ""]
        lines += [f"- +{m['t']:.2f} s {m['label']}" for m in timeline["markers"]
                  if m["kind"] != "checkpoint_saved"] + [""]
    return lines
