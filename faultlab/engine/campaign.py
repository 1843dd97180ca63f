"""Runs a campaign: golden run → rate check → the compiled experiment → scoring → verdict.

The campaign's experiment (``faultlab.spec.compile_campaign``: one fault per seeded arrival,
``at_step`` on the step clock, ``at_time_s`` on the wall clock) runs through ``run_experiment``
unchanged, so undo, guard and journal are an experiment's. The golden run (the same job without
faults, cached like every golden run) is needed twice: its median step time decides whether a
wall-clock ``mtbf_s`` leaves a step room to finish between faults (and turns a step-clock
``mtbf_steps`` into seconds for the goodput projection), and its records are scored for false
positives. The scoring (``faultlab.observe.campaign``) and the campaign SLAs go into the journal
under ``campaign``, and the verdict is rewritten to include them. The experiment's implicit
per-fault check that each fault was injected is left out of a campaign's verdict: an arrival whose
victim was restarting, or that came after the job finished, is reported as not injected instead.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faultlab.engine.golden import GoldenRun, golden_cache_for, golden_key, golden_run
from faultlab.engine.runner import RunResult, run_experiment
from faultlab.engine.view import NullView, View
from faultlab.errors import InvalidExperimentError, Problem
from faultlab.judge import SLAResult
from faultlab.judge.slas import CAMPAIGN_SLAS
from faultlab.judge.timing import RelativeSeconds, TimingUnits, in_units
from faultlab.judge.verdict import FAIL, verdict_of
from faultlab.observe.campaign import CampaignScore, golden_step_time_s, score_campaign
from faultlab.observe.records import FaultRecord
from faultlab.report.html import render_campaign_html
from faultlab.report.journal import strict_json, write_journal
from faultlab.runtime.events import read_events
from faultlab.spec.campaign import Campaign, campaign_schedule, compile_campaign

__all__ = ["CampaignResult", "check_rate", "check_rate_cached", "judge_campaign", "run_campaign"]


@dataclass
class CampaignResult:
    result: RunResult
    score: CampaignScore
    slas: list[SLAResult]
    """The experiment's SLAs, then the campaign's."""
    verdict: str

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"


def check_rate(campaign: Campaign, step_time_s: float | None, source: Path | None,
               line: int | None) -> None:
    """Refuse a wall-clock ``mtbf_s`` so short that, on average, no step finishes between two
    faults. (On the step clock, ``mtbf_steps < 1`` is refused when the document is read.)"""
    mtbf_s = campaign.campaign.mtbf_s
    if mtbf_s is None or step_time_s is None or mtbf_s > step_time_s:
        return
    raise InvalidExperimentError([Problem(
        source, line, "campaign.mtbf_s",
        f"{mtbf_s:g} s between faults is not longer than one training step "
        f"({step_time_s:.3f} s, estimated as the median step time of the golden run, the same "
        f"job without faults): no step could finish between two faults; make mtbf_s several "
        f"times the step time (e.g. {max(1.0, 20 * step_time_s):.0f})")])


def check_rate_cached(campaign: Campaign, cache_dir: Path | None, source: Path | None,
                      line: int | None) -> str:
    """``faultlab validate``'s rate check, which runs nothing: against the golden run in
    ``cache_dir`` (None: where ``faultlab run`` would look, ``golden_cache_for``) when one is
    cached for this job (raises ``InvalidExperimentError`` like ``check_rate``); returns what
    was checked, for the user."""
    spec = campaign.campaign
    if spec.mtbf_s is None:
        return f"mtbf_steps {spec.mtbf_steps:g}: at least one step between faults"
    exp = compile_campaign(campaign)
    cache_dir = golden_cache_for(exp, cache_dir, Path("reports"))
    entry = cache_dir / f"{golden_key(exp)}.json"
    try:
        run_dir = Path(json.loads(entry.read_text())["run_dir"])
    except (OSError, ValueError, KeyError):
        return (f"mtbf_s {spec.mtbf_s:g} s not checked against a step time yet: no golden run "
                f"of this job is cached in {cache_dir}; faultlab run checks it first")
    step_s = golden_step_time_s(read_events(run_dir / "events")) \
        if (run_dir / "events").is_dir() else None
    if step_s is None:
        return f"mtbf_s {spec.mtbf_s:g} s not checked: the cached golden run has no step time"
    check_rate(campaign, step_s, source, line)
    return (f"mtbf_s {spec.mtbf_s:g} s against the cached golden run's step time "
            f"{step_s:.3f} s")


def judge_campaign(campaign: Campaign, score: CampaignScore,
                   units: TimingUnits | None = None) -> list[SLAResult]:
    """The campaign's own SLAs against its score; a relative bound in seconds is made seconds
    with the run's own units (``units``), and is not measured without them."""
    out = []
    for key, written in campaign.expect.campaign_items():
        sla = CAMPAIGN_SLAS[key]
        measured = sla.measure_score(score)
        note = ""
        bound: float | None = None
        limit: float | None = None
        shown: float | dict[str, float]  # the journal keeps the bound as written
        if isinstance(written, RelativeSeconds):
            bound = limit = written.seconds(units)
            shown = written.terms()
        else:
            bound = shown = written
        if bound is None:
            passed, note = False, (f"not measured: the bound is {written}, "
                                   f"and this run measured no such unit")
        elif measured is None:
            passed, note = False, sla.unmeasured
        elif isinstance(measured, float) and math.isinf(measured):
            passed, note = False, "an injection that took the job down never recovered"
        else:
            passed = sla.holds(measured, bound)
        ratio = in_units(measured, units) if sla.relative and isinstance(
            measured, int | float) else ""
        out.append(SLAResult(key, shown, measured, passed, note, limit, ratio))
    return out


def run_campaign(campaign: Campaign, *, source: Path | None = None, line: int | None = None,
                 report_dir: Path = Path("reports"), golden_cache: Path | None = None,
                 view: View | None = None) -> CampaignResult:
    """Run ``campaign`` and score it; raises ``InvalidExperimentError`` (nothing injected)
    when its rate is too high for the golden run's step time."""
    view = view or NullView()
    exp = compile_campaign(campaign)
    golden_cache = golden_cache_for(exp, golden_cache, report_dir)  # where run_experiment looks
    view.note("golden run (same job, no faults; cached per code version)")
    golden: GoldenRun = golden_run(exp, golden_cache, timeout_s=exp.run.timeout_s)
    golden_events = read_events(Path(golden.run_dir) / "events")
    check_rate(campaign, golden_step_time_s(golden_events), source, line)
    view.note(f"campaign: {len(exp.faults)} arrival(s) scheduled from seed "
              f"{campaign.schedule_seed}")
    result = run_experiment(exp, source=source, report_dir=report_dir,
                            golden_cache=golden_cache, view=view)
    journal_path = result.journal_path
    journal: dict[str, Any] = json.loads(journal_path.read_text())
    events = read_events(Path(journal["run"]["job_dir"]) / "events")
    schedule = campaign_schedule(campaign)
    score = score_campaign(events, result.faults, procs_per_node=exp.topology.procs_per_node,
                           world_size=exp.topology.world_size,
                           mtbf_s=campaign.campaign.mtbf_s,
                           mtbf_steps=campaign.campaign.mtbf_steps,
                           checkpoint_every=exp.run.checkpoint_every,
                           golden_events=golden_events, scheduled=len(exp.faults),
                           planned={p.fault_id: p for p in schedule})
    # An arrival that found no victim (its rank was restarting) or came after the job finished
    # is a fact of the campaign, shown as "not injected" in its table, not a failed check.
    kept = [s for s in result.slas if not s.name.startswith("fault_injected[")]
    units = journal["run"].get("timing_units")
    slas = [*kept, *judge_campaign(campaign, score,
                                   TimingUnits(**units) if units else None)]
    verdict = verdict_of(slas) if result.error is None else FAIL
    journal["verdict"] = verdict
    journal["slas"] = strict_json([s.to_dict() for s in slas])
    journal["campaign"] = {
        "document": campaign.model_dump(mode="json"),
        "clock": campaign.campaign.clock,
        "schedule": [{"fault_id": p.fault_id, "at_step": p.at_step, "at_s": p.at_s,
                      "type": p.type, "victim": str(p.victim), "entry": p.entry}
                     for p in schedule],
        "golden_key": golden.key, "golden_run_dir": golden.run_dir,
        "golden_cached": golden.cached,
        "score": strict_json(score.to_dict()),
        **_plot_data(events, result.faults, score),
    }
    write_journal(result.run_folder, journal)
    (result.run_folder / "report.html").write_text(render_campaign_html(journal))
    result.verdict, result.slas = verdict, slas
    return CampaignResult(result, score, slas, verdict)


def _plot_data(events: list[dict[str, Any]], faults: list[FaultRecord],
               score: CampaignScore) -> dict[str, Any]:
    """Rank 0's steps and the injections on one clock: seconds since the first record."""
    ts = [e["t"] for e in events if isinstance(e.get("t"), int | float)]
    if not ts:
        return {"series": {"steps": []}, "marked": []}
    t0 = min(ts)
    steps = [[round(e["t"] - t0, 3), e["step"]] for e in sorted(events, key=lambda e: e["t"])
             if e.get("kind") == "step" and e.get("rank") == 0
             and isinstance(e.get("step"), int)]
    when = {f.id: round(f.injected_t - t0, 3) for f in faults}
    marked = [{**strict_json(dataclasses.asdict(i)), "t": when.get(i.fault_id)}
              for i in score.injections]
    return {"series": {"t0": t0, "steps": steps}, "marked": marked}
