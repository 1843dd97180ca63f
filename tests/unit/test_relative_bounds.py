"""Time bounds relative to the job's own fault-free timings (``faultlab.sla.timing``): how they
are written and refused, how a run's units are measured, and how the verdict judges and shows
them. One synthetic run: launched at t=1000, first step at 1004 (a cold start of 4 s), a step a
second, rank 1 killed after step 6, back at step 7 at t=1014 (resume 7.5 s)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from faultlab.errors import InvalidExperimentError
from faultlab.judge.timing import TimingUnits, cold_start_s, step_time_s, timing_units
from faultlab.judge.verdict import judge
from faultlab.observe import FaultRecord, compute_metrics
from faultlab.sla.timing import RelativeSeconds, in_units
from faultlab.spec import experiment_from_dict, load_experiment

LAUNCHED, KILLED = 1000.0, 1010.5


def ev(t: float, kind: str, rank: int = 0, **fields: Any) -> dict[str, Any]:
    pid = 100 + rank + 10 * int(fields.get("restart") or 0)  # a restart is a new process
    return {"t": t, "kind": kind, "rank": rank, "pid": pid, "world_size": 2, **fields}


def run_events() -> list[dict[str, Any]]:
    out = [ev(1001.0, "start", r, resumed_from_step=0, restart=0) for r in (0, 1)]
    out += [ev(1003.0 + s, "step", r, step=s, restart=0) for s in range(1, 7) for r in (0, 1)]
    out += [ev(1005.1, "checkpoint_saved", 0, step=2, path="/c/step_2", seconds=0.1)]
    out += [ev(1012.0, "start", r, resumed_from_step=2, restart=1) for r in (0, 1)]
    out += [ev(1014.0 + s, "step", r, step=s + 3, restart=1) for s in range(0, 6) for r in (0, 1)]
    out += [ev(1020.0, "exit", r, reason="completed", restart=1) for r in (0, 1)]
    return sorted(out, key=lambda e: e["t"])


def kill() -> list[FaultRecord]:
    return [FaultRecord(id="kill", type="rank_kill", injected_t=KILLED, undone_t=None,
                        details={"rank": 1, "pids": [101]})]


def experiment(**expect: Any) -> Any:
    return experiment_from_dict({
        "name": "rel", "target": {"trainer": "reference", "preset": "tiny"},
        "topology": {"nodes": 2}, "run": {"steps": 8, "checkpoint_every": 2},
        "faults": [{"id": "kill", "type": "rank_kill", "target": {"rank": 1},
                    "trigger": {"at_step": 6}}],
        "expect": expect})


# ---------------------------------------------------------------------------- written, refused

@pytest.mark.parametrize(("value", "bound"), [
    (40, 40.0),
    ({"cold_starts": 2.5}, RelativeSeconds(cold_starts=2.5)),
    ({"s": 11, "cold_starts": 1}, RelativeSeconds(s=11, cold_starts=1)),
    ({"step_times": 20}, RelativeSeconds(step_times=20)),
])
def test_a_bound_in_seconds_is_a_number_or_the_jobs_own_units(value: Any, bound: Any) -> None:
    assert experiment(resume_time_s=value).expect.resume_time_s == bound


@pytest.mark.parametrize(("value", "message"), [
    ("{cold_start: 2}", "expect.resume_time_s: unknown key 'cold_start'; a bound in seconds "
                        "is a number, or a mapping of s (fixed seconds), cold_starts"),
    ("{s: 30}", "needs cold_starts or step_times > 0; a bound of fixed seconds is written as a "
                "number (30)"),
    ("{cold_starts: -1}", "cold_starts: input should be greater than or equal to 0, not -1"),
    ("{step_times: .inf}", "step_times: input should be a finite number, not inf"),
    ("-3", "expect.resume_time_s: must be > 0, got -3"),
    ("fast", "expect.resume_time_s: expected a number, got 'fast'"),
])
def test_a_bad_bound_is_refused_once_where_it_is_written(tmp_path: Path, value: str,
                                                         message: str) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("name: x\ntarget: {trainer: reference, preset: tiny}\n"
                    f"expect:\n  completes: true\n  resume_time_s: {value}\n")
    with pytest.raises(InvalidExperimentError) as e:
        load_experiment(path)
    problems = str(e.value).splitlines()
    assert len(problems) == 1, problems  # one message per value, not one per union member
    assert problems[0].startswith(f"{path}:5 ") and message in problems[0]


def test_only_upper_bounds_in_seconds_take_relative_values() -> None:
    with pytest.raises(InvalidExperimentError, match="lost_steps"):
        experiment(lost_steps={"step_times": 2})


# ------------------------------------------------------------------------------- the units

def test_the_units_are_the_runs_own_fault_free_start() -> None:
    events = run_events()
    assert cold_start_s(events, LAUNCHED, before_t=KILLED) == 4.0
    assert step_time_s(events, before_t=KILLED) == 1.0
    units = timing_units(events, LAUNCHED, kill())
    assert (units.cold_start_s, units.step_s, units.cold_start_from) == (4.0, 1.0, "this run")


def test_a_fault_before_the_first_step_takes_the_golden_runs_units() -> None:
    class Golden:
        cold_start_s, step_s = 5.0, 0.5

    early = [FaultRecord(id="k", type="rank_kill", injected_t=1002.0, undone_t=None,
                         details={})]
    units = timing_units(run_events(), LAUNCHED, early, Golden())
    assert (units.cold_start_s, units.step_s) == (5.0, 0.5)
    assert units.cold_start_from == units.step_from == "the golden run"
    none = timing_units(run_events(), None, early)
    assert (none.cold_start_s, none.step_s) == (None, None)
    # a reference from other hardware times other hardware: its units are not this run's
    Golden.site = {"accelerator": "NVIDIA A100-SXM4-80GB", "torch": "2.13.0"}  # type: ignore[attr-defined]
    here = [dict(e, site={"accelerator": "cpu", "torch": "2.13.0"}) if e["kind"] == "start"
            and e["rank"] == 0 else e for e in run_events()]
    other = timing_units(here, LAUNCHED, early, Golden())
    assert (other.cold_start_s, other.step_s) == (None, None)


def test_only_one_incarnations_consecutive_steps_make_a_step_time() -> None:
    # the replay after the restart (steps 3.. again, t 1014..) must not enter the median
    assert step_time_s(run_events()) == 1.0
    assert step_time_s([ev(1.0, "step", step=1)]) is None  # one step: no gap


# ------------------------------------------------------------------------------- judged

def judged(units: TimingUnits | None, **expect: Any) -> dict[str, Any]:
    events = run_events()
    out = judge(experiment(**expect), compute_metrics(events, kill()), None, timed_out=False,
                faults=kill(), events=events, units=units)
    return {s.name: s for s in out}


def test_a_relative_bound_is_judged_in_the_runs_own_seconds_and_shows_both() -> None:
    units = timing_units(run_events(), LAUNCHED, kill())
    got = judged(units, resume_time_s={"cold_starts": 2}, recovery_time_s={"cold_starts": 1})
    resume, recovery = got["resume_time_s"], got["recovery_time_s"]
    assert resume.measured == pytest.approx(3.5) and resume.limit == 8.0 and resume.passed
    assert resume.ratio == "0.88 cold starts"
    assert resume.bound == {"cold_starts": 2.0}  # as written: the journal stays JSON
    assert "required <= 2 cold starts = 8.00 s" in resume.describe()
    assert "measured 3.5 s (0.88 cold starts)" in resume.describe()
    # back at step 6 at t=1017: 6.5 s, more than one cold start of 4 s
    assert recovery.limit == 4.0 and not recovery.passed


def test_an_absolute_bound_shows_the_ratio_too() -> None:
    units = timing_units(run_events(), LAUNCHED, kill())
    resume = judged(units, resume_time_s=30)["resume_time_s"]
    assert resume.passed and resume.limit is None and resume.ratio == "0.88 cold starts"


def test_a_relative_bound_without_its_unit_is_not_measured_never_passed() -> None:
    resume = judged(TimingUnits(None, 1.0), resume_time_s={"cold_starts": 100})["resume_time_s"]
    assert not resume.passed
    assert resume.note.startswith("not measured: the bound is 100 cold starts")
    also = judged(None, resume_time_s={"s": 5, "step_times": 100})["resume_time_s"]
    assert not also.passed and "not measured" in also.note


def test_nan_units_never_make_a_bound() -> None:
    assert RelativeSeconds(cold_starts=2).seconds(TimingUnits(float("nan"), None)) is None
    assert in_units(float("nan"), TimingUnits(4.0, 1.0)) == ""


def test_a_campaigns_recovery_p95_takes_a_relative_bound_too() -> None:
    from types import SimpleNamespace

    from faultlab.engine.campaign import judge_campaign
    from faultlab.spec.campaign import Campaign

    campaign = Campaign.model_validate({
        "name": "c", "target": {"trainer": "reference", "preset": "tiny"},
        "topology": {"nodes": 2}, "run": {"steps": 100, "checkpoint_every": 10},
        "campaign": {"mtbf_steps": 20, "mix": [{"type": "rank_kill", "weight": 1}]},
        "expect": {"recovery_time_p95_s": {"s": 1, "cold_starts": 2}}})
    score = SimpleNamespace(metric=lambda key: 9.0)  # the p95 of the injections' recovery
    [ok] = judge_campaign(campaign, score, TimingUnits(4.0, 0.1))  # type: ignore[arg-type]
    assert ok.passed and ok.limit == 9.0 and ok.bound == {"s": 1.0, "cold_starts": 2.0}
    assert ok.ratio == "2.25 cold starts"
    [tight] = judge_campaign(campaign, score, TimingUnits(3.9, 0.1))  # type: ignore[arg-type]
    assert not tight.passed
    [unknown] = judge_campaign(campaign, score, None)  # type: ignore[arg-type]
    assert not unknown.passed and unknown.note.startswith("not measured: the bound is 1 s + 2")
