"""Failure campaigns: the document and its located errors, the seeded schedule, the scoring of
recorded event timelines (pure functions of records), the campaign SLAs and the starter."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from faultlab.cli import main
from faultlab.engine.campaign import check_rate, judge_campaign
from faultlab.errors import InvalidExperimentError
from faultlab.observe import FaultRecord
from faultlab.observe.campaign import false_positives, golden_step_time_s, score_campaign
from faultlab.spec import (
    Campaign,
    campaign_schedule,
    compile_campaign,
    load_campaign,
    load_experiments,
    parse_document,
)
from faultlab.spec.campaign_starter import LLAMA3_MIX, starter_campaign

DOC = """\
name: camp
seed: {seed}
topology: {{nodes: 2, procs_per_node: 2}}
run: {{steps: 200, checkpoint_every: 10, timeout_s: 300}}
campaign:
  mtbf_s: {mtbf_s}
  duration_s: 200
  start_after_s: 5
  mix:
    - {{type: rank_kill, weight: 3}}
    - {{type: grad_nan, weight: 1, target: {{rank: 2}}}}
    - {{type: node_kill, weight: 1}}
expect:
  completes: true
  ettr: 0.5
  detection_rate: 0.9
"""


def campaign(seed: int = 3, mtbf_s: float = 4) -> Campaign:
    doc = parse_document(DOC.format(seed=seed, mtbf_s=mtbf_s), "camp.yaml")
    assert isinstance(doc, Campaign)
    return doc


def problems(text: str) -> list[str]:
    with pytest.raises(InvalidExperimentError) as e:
        parse_document(text, "camp.yaml")
    return [str(p) for p in e.value.problems]


# --- the schedule ---------------------------------------------------------------------------

def test_same_seed_same_schedule_other_seed_another() -> None:
    first, again = campaign_schedule(campaign(3)), campaign_schedule(campaign(3))
    assert first == again and len(first) > 20
    assert campaign_schedule(campaign(4)) != first
    times = [p.at_s for p in first]
    assert times == sorted(times) and 5 < times[0] and times[-1] < 200


def test_schedule_follows_rate_weights_and_topology() -> None:
    plan = campaign_schedule(campaign(11, mtbf_s=0.5))  # ~390 arrivals
    gaps = [b.at_s - a.at_s for a, b in zip(plan, plan[1:], strict=False)]
    assert 0.4 < sum(gaps) / len(gaps) < 0.6  # exponential gaps, mean mtbf_s
    share = sum(p.type == "rank_kill" for p in plan) / len(plan)
    assert 0.5 < share < 0.7  # weight 3 of 5
    for p in plan:
        if p.type == "grad_nan":
            assert (p.victim.kind, p.victim.value) == ("rank", 2)  # a fixed victim stays
        elif p.type == "rank_kill":
            assert p.victim.kind == "rank" and 0 <= p.victim.value < 4
        else:
            assert p.victim.kind == "node" and 0 <= p.victim.value < 2
    assert {p.victim.value for p in plan if p.type == "rank_kill"} == {0, 1, 2, 3}


def test_compiles_to_an_experiment_of_time_triggered_faults(tmp_path: Path) -> None:
    path = tmp_path / "camp.yaml"
    path.write_text(DOC.format(seed=3, mtbf_s=20))
    [(_, exp)] = load_experiments([path])
    plan = campaign_schedule(campaign(3, mtbf_s=20))
    assert [f.id for f in exp.faults] == [p.fault_id for p in plan]
    assert [f.trigger.at_time_s for f in exp.faults] == [p.at_s for p in plan]
    assert dict(exp.expect.items()) == {"completes": True}  # the campaign SLAs judged apart
    assert exp == compile_campaign(campaign(3, mtbf_s=20))
    loaded = load_campaign(path, seed=9)
    assert loaded is not None and loaded[0].seed == 9 and loaded[1] == 6  # campaign.mtbf_s
    [(_, other)] = load_experiments([path], seed=9)
    assert [f.trigger.at_time_s for f in other.faults] != [p.at_s for p in plan]


def test_a_schedule_seed_of_its_own_leaves_the_job_and_its_golden_run_alone(
        tmp_path: Path) -> None:
    """``campaign.seed`` draws the arrivals; the job keeps the document's seed, so its golden
    run is that of any experiment of the same job. ``--seed`` replaces both."""
    from faultlab.engine.golden import golden_key

    path = tmp_path / "camp.yaml"
    path.write_text(DOC.format(seed=0, mtbf_s=20).replace("  mix:", "  seed: 3\n  mix:"))
    loaded = load_campaign(path)
    assert loaded is not None and loaded[0].schedule_seed == 3
    [(_, exp)] = load_experiments([path])
    assert exp.seed == 0
    assert [f.trigger.at_time_s for f in exp.faults] == \
        [p.at_s for p in campaign_schedule(campaign(3, mtbf_s=20))]
    assert golden_key(exp) == golden_key(compile_campaign(campaign(0, mtbf_s=20)))
    assert exp.counts_golden_alarms  # its false positives are the golden run's alarms
    assert golden_key(exp) != golden_key(compile_campaign(campaign(3, mtbf_s=20)))
    [(_, other)] = load_experiments([path], seed=9)
    assert other.seed == 9 and [f.trigger.at_time_s for f in other.faults] == \
        [p.at_s for p in campaign_schedule(campaign(9, mtbf_s=20))]
    assert problems(DOC.format(seed=0, mtbf_s=20).replace("  mix:", "  seed: -1\n  mix:")) \
        == ["camp.yaml:9 campaign.seed: must be >= 0, got -1"]


STEP_DOC = DOC.replace("  mtbf_s: {mtbf_s}\n  duration_s: 200\n  start_after_s: 5\n",
                       "  mtbf_steps: {mtbf}\n  start_after_step: 5\n")


def step_campaign(seed: int = 3, mtbf: float = 12) -> Campaign:
    doc = parse_document(STEP_DOC.format(seed=seed, mtbf=mtbf), "camp.yaml")
    assert isinstance(doc, Campaign)
    return doc


def test_the_step_clock_schedules_steps_from_the_seed(tmp_path: Path) -> None:
    """Arrivals by training progress: the steps are a pure function of the document, and the
    compiled faults fire at those steps (so where they land does not depend on the load)."""
    plan = campaign_schedule(step_campaign(3))
    assert plan == campaign_schedule(step_campaign(3)) and len(plan) > 8
    assert campaign_schedule(step_campaign(4)) != plan
    at = [p.at_step for p in plan]
    assert all(isinstance(n, int) for n in at) and at == sorted(at)
    assert 5 < at[0] and at[-1] <= 199  # after start_after_step, before the last step
    assert all(p.at_s is None for p in plan) and plan[0].when == f"step {at[0]}"
    exp = compile_campaign(step_campaign(3))
    assert [f.trigger.at_step for f in exp.faults] == at
    assert all(f.trigger.at_time_s is None for f in exp.faults)
    many = campaign_schedule(step_campaign(11, mtbf=1.5))  # ~130 arrivals over 194 steps
    gaps = [b.at_step - a.at_step for a, b in zip(many, many[1:], strict=False)]
    assert 1.2 < sum(gaps) / len(gaps) < 1.8  # mean mtbf_steps
    assert 0 in gaps  # two arrivals drawn onto one step strike together


def test_the_step_clock_refuses_a_mixed_or_empty_window() -> None:
    text = STEP_DOC.format(seed=0, mtbf=12)
    assert problems(text.replace("  mtbf_steps: 12\n", "  mtbf_steps: 12\n  mtbf_s: 4\n")
                    )[0].startswith("camp.yaml:6 campaign.mtbf_steps: set exactly one of "
                                    "mtbf_steps (arrivals by training step")
    assert problems(text.replace("  mtbf_steps: 12\n", "  mtbf_steps: 0.5\n")) == [
        "camp.yaml:6 campaign.mtbf_steps: 0.5 steps between faults is less than one: no step "
        "could finish between two faults; make it several checkpoint intervals (e.g. 20)"]
    assert problems(text.replace("  start_after_step: 5\n", "  duration_s: 50\n")) == [
        "camp.yaml:7 campaign.duration_s: duration_s is a window in seconds, for the wall clock "
        "(mtbf_s); with mtbf_steps use start_after_step and until_step"]
    assert problems(text.replace("  start_after_step: 5\n", "  until_step: 200\n")) == [
        "camp.yaml:7 campaign.until_step: step 200 is not before the job's last step "
        "(run.steps = 200); a fault after the last step has nothing left to break"]
    assert problems(DOC.format(seed=0, mtbf_s=4).replace("  duration_s: 200\n", "")) == [
        "camp.yaml:5 campaign: the wall clock (mtbf_s) needs duration_s: faults "
        "arrive before this many seconds after the launch"]


# --- bad input: one located line each --------------------------------------------------------

def test_weights_must_be_positive() -> None:
    text = DOC.format(seed=0, mtbf_s=4).replace("weight: 3", "weight: 0")
    assert problems(text) == ["camp.yaml:10 campaign.mix[0].weight: a weight must be positive "
                              "(the entry's share of the arrivals), got 0.0; remove the entry "
                              "to leave this fault out"]


def test_a_fault_the_target_refuses_is_located_at_its_mix_entry() -> None:
    text = DOC.format(seed=0, mtbf_s=4).replace(
        "topology:", "target: {command: [bash, train.sh]}\ntopology:").replace(
        "- {type: grad_nan, weight: 1, target: {rank: 2}}",
        "- {type: gpu_oom, weight: 1, target: {rank: 2}, duration_s: 5}")
    [problem] = problems(text)
    assert problem.startswith("camp.yaml:12 campaign.mix[1].type: gpu_oom: ")
    assert "not a Python interpreter" in problem


def test_a_victim_outside_the_topology_is_located_at_its_mix_entry() -> None:
    text = DOC.format(seed=0, mtbf_s=4).replace("target: {rank: 2}", "target: {rank: 7}")
    [problem] = problems(text)
    assert problem.startswith("camp.yaml:11 campaign.mix[1].target.rank: rank 7 does not exist")


def test_rate_too_high_for_the_golden_step_time() -> None:
    doc = campaign(mtbf_s=0.2)
    check_rate(doc, 0.1, Path("camp.yaml"), 6)  # two steps fit on average: allowed
    with pytest.raises(InvalidExperimentError) as e:
        check_rate(doc, 0.25, Path("camp.yaml"), 6)
    [problem] = e.value.problems
    assert str(problem).startswith("camp.yaml:6 campaign.mtbf_s: 0.2 s between faults is not "
                                   "longer than one training step (0.250 s, estimated as the "
                                   "median step time of the golden run")


def test_validate_checks_a_wall_clock_rate_against_a_cached_golden_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``faultlab validate`` runs nothing: it checks ``mtbf_s`` against the step time of the
    golden run ``faultlab run`` cached for this job, and says when there is none."""
    import json

    from faultlab.engine.golden import golden_key

    path = tmp_path / "camp.yaml"
    path.write_text(DOC.format(seed=3, mtbf_s=0.3))
    cache = tmp_path / "golden"
    assert main(["validate", str(path), "--golden-cache", str(cache)]) == 0
    assert "mtbf_s 0.3 s not checked against a step time yet" in capsys.readouterr().out
    run_dir = cache / "run"
    (run_dir / "events").mkdir(parents=True)
    (run_dir / "events" / "rank0.jsonl").write_text("".join(
        json.dumps({"t": 1.0 + s, "kind": "step", "rank": 0, "step": s, "step_time_s": 0.5})
        + "\n" for s in range(1, 6)))
    (cache / f"{golden_key(compile_campaign(campaign(3, mtbf_s=0.3)))}.json").write_text(
        json.dumps({"run_dir": str(run_dir)}))
    assert main(["validate", str(path), "--golden-cache", str(cache)]) != 0
    err = capsys.readouterr().err
    assert f"{path}:6 campaign.mtbf_s: 0.3 s between faults is not longer than one training " \
           f"step (0.500 s" in " ".join(err.split())
    path.write_text(DOC.format(seed=3, mtbf_s=20))  # the same job: the same golden run
    assert main(["validate", str(path), "--golden-cache", str(cache)]) == 0
    assert "against the cached golden run's step time 0.500 s" in " ".join(
        capsys.readouterr().out.split())


# --- scoring recorded timelines --------------------------------------------------------------

def ev(t: float, kind: str, rank: int, pid: int, **fields: object) -> dict[str, object]:
    return {"t": t, "kind": kind, "rank": rank, "pid": pid, "world_size": 2, **fields}


def steps(first: int, last: int, t0: float, pids: tuple[int, int], dt: float = 0.5
          ) -> list[dict[str, object]]:
    out = []
    for i, s in enumerate(range(first, last + 1)):
        out += [ev(t0 + i * dt, "step", r, pids[r], step=s, step_time_s=0.4) for r in (0, 1)]
    return out


def kill_timeline() -> list[dict[str, object]]:
    """rank 1 SIGKILLed at t=20 after step 10 (checkpoint at 10 is not there: last at 5):
    rank 0 exits on the closed connection, the group restarts from step 5 at t=24."""
    events = [ev(0.0, "start", r, 100 + r, resumed_from_step=0) for r in (0, 1)]
    events += steps(1, 10, 1.0, (100, 101))  # steps 1..10 at t = 1.0 .. 5.5
    events += [ev(3.3, "checkpoint_saved", 0, 100, step=5, seconds=0.2)]
    events += [ev(20.05, "exit", 0, 100, reason="error",
                  error="DistBackendError: Connection closed by peer [127.0.0.1]:2900")]
    events += [ev(24.0, "checkpoint_loaded", r, 200 + r, step=5) for r in (0, 1)]
    events += [ev(24.1, "start", r, 200 + r, resumed_from_step=5) for r in (0, 1)]
    events += steps(6, 12, 24.5, (200, 201))  # back at step 10 at t = 26.5
    events += [ev(28.9, "final_digest", 0, 200, digest="d" * 64)]
    events += [ev(29.0, "exit", r, 200 + r, reason="completed", step=12) for r in (0, 1)]
    return events


def score(events, faults, golden=None):  # type: ignore[no-untyped-def]
    return score_campaign(events, faults, procs_per_node=1, world_size=2, mtbf_s=60,
                          checkpoint_every=5, golden_events=golden or kill_golden())


def kill_golden() -> list[dict[str, object]]:
    events = [ev(0.0, "start", r, 10 + r, resumed_from_step=0) for r in (0, 1)]
    events += steps(1, 12, 1.0, (10, 11)) + [ev(6.9, "final_digest", 0, 10, digest="d" * 64)]
    return events + [ev(7.0, "exit", r, 10 + r, reason="completed", step=12) for r in (0, 1)]


def test_a_killed_rank_is_detected_attributed_and_recovered() -> None:
    kill = FaultRecord(id="c000-rank_kill", type="rank_kill", injected_t=20.0, target="rank 1")
    s = score(kill_timeline(), [kill])
    [inj] = s.injections
    assert inj.detected and inj.detected_by == "exit:error (rank 0)"
    assert inj.detection_latency_s == pytest.approx(0.05)
    # rank 1 went silent while rank 0 exited on the closed connection: rank 1 failed first
    assert inj.named_ranks == [1, 0] and inj.attributed is True
    assert inj.went_down and inj.recovered and inj.lost_steps == 5
    assert inj.recovery_time_s == pytest.approx(26.5 - 20.0)
    assert not inj.compound
    assert (s.detection_rate, s.attribution_accuracy, s.injected) == (1.0, 1.0, 1)
    assert s.recovery_time_p95_s == pytest.approx(6.5)
    # projected: golden goodput x (1 - p_down * (R + interval / 2) / mtbf_s)
    restart_s, interval_s = 24.5 - 20.0, 5 * 0.4
    golden_ettr = 12 * 0.4 / 7.0
    assert s.golden_ettr == pytest.approx(golden_ettr)
    assert s.projected_ettr == pytest.approx(
        round(golden_ettr * (1 - (restart_s + interval_s / 2) / 60), 4))
    assert s.ettr is not None and s.ettr_gap == pytest.approx(s.projected_ettr - s.ettr,
                                                              abs=1e-3)


def test_a_killed_ranks_restarted_process_does_not_make_it_speak() -> None:
    """The reference trainer checks the GPU's health at every start, before its start record:
    the restarted rank 1's record lies in the window, but it is another process."""
    events = [*kill_timeline(), *[ev(22.0, "gpu_health", r, 200 + r) for r in (0, 1)]]
    kill = FaultRecord(id="c000-rank_kill", type="rank_kill", injected_t=20.0, target="rank 1")
    [inj] = score(events, [kill]).injections
    assert inj.named_ranks == [1, 0] and inj.attributed is True
    # and an earlier incarnation's steps within the look-back are a dead process's: its ranks
    # are not "silent" now (a campaign restarts often)
    earlier = steps(1, 4, -8.0, (90, 91))
    [inj] = score(earlier + events, [kill]).injections
    assert inj.named_ranks == [1, 0] and inj.attributed is True
    # nor is a rank a moment behind, whose record of the step the fault fired on (once rank 0
    # reported it) is written just after the fault: work done before it, not a word about it
    late = [{**e, "t": {0: 19.99, 1: 20.004}[e["rank"]]}
            if e["kind"] == "step" and e["step"] == 10 and e["pid"] in (100, 101) else e
            for e in events]
    [inj] = score(sorted(late, key=lambda e: e["t"]), [kill]).injections
    assert inj.named_ranks == [1, 0] and inj.attributed is True


def test_the_wrong_rank_named_is_not_attributed() -> None:
    kill = FaultRecord(id="c000-rank_kill", type="rank_kill", injected_t=20.0, target="rank 0")
    [inj] = score(kill_timeline(), [kill]).injections
    assert inj.detected and inj.named_ranks == [1, 0] and inj.attributed is False


def test_a_fault_every_rank_sees_alike_is_not_attributed() -> None:
    """A NaN gradient under FSDP2: every rank sees the same global norm and rolls back; no
    record names rank 1."""
    events = [ev(0.0, "start", r, 100 + r, resumed_from_step=0) for r in (0, 1)]
    events += steps(1, 8, 1.0, (100, 101))  # t 1.0 .. 4.5
    events += [ev(5.0, "anomaly", r, 100 + r, what="nonfinite_grad_norm", step=9,
                  action="rollback") for r in (0, 1)]
    events += [ev(5.1, "checkpoint_loaded", r, 100 + r, step=5) for r in (0, 1)]
    events += steps(6, 9, 5.5, (100, 101))
    nan = FaultRecord(id="c000-grad_nan", type="grad_nan", injected_t=4.8, target="rank 1",
                      details={"ranks": [1]})
    s = score(events, [nan])
    [inj] = s.injections
    assert inj.detected and inj.attributed is False and inj.named_ranks == []
    assert inj.lost_steps == 3 and s.attribution_accuracy == 0.0
    # a second fault before the job reacted: the reaction is the second's, which struck
    # every rank (nothing to attribute), and the first counts as undetected
    every = FaultRecord(id="c001-grad_nan", type="grad_nan", injected_t=4.9, target="all")
    first, second = score(events, [nan, every]).injections
    assert not first.detected and first.attributed is None
    assert not first.went_down and not first.recovered and first.lost_steps is None
    assert second.detected and second.attributed is None


def test_level_0_names_the_first_rank_to_fail() -> None:
    """A collective error on rank 0: both ranks exit, rank 0 first (its error blames a peer,
    as gloo's does); a rank whose reason is peer_* is not named."""
    events = [ev(0.0, "start", r, 100 + r, resumed_from_step=0) for r in (0, 1)]
    events += steps(1, 8, 1.0, (100, 101))
    events += [ev(5.01, "exit", 0, 100, reason="error", error="DistBackendError: faultlab "
                  "collective_error: Connection reset by peer"),
               ev(5.02, "exit", 1, 101, reason="error", error="RuntimeError: gloo transport")]
    fault = FaultRecord(id="c000-collective_error", type="collective_error", injected_t=5.0,
                        target="rank 0", details={"ranks": [0]})
    [inj] = score(events, [fault]).injections
    assert inj.named_ranks == [0, 1] and inj.attributed is True
    events[-2] = {**events[-2], "reason": "peer_preempted"}
    [inj] = score(events, [fault]).injections
    assert inj.named_ranks == [1] and inj.attributed is False


def test_a_fault_trained_through_is_not_charged_the_next_faults_restart() -> None:
    """An OOM retried in place (anomaly, then steps), then a kill whose restart follows."""
    events = kill_timeline()
    events += [ev(2.05, "anomaly", 1, 101, what="gpu_oom", step=3, action="retry")]
    oom = FaultRecord(id="c000-gpu_oom", type="gpu_oom", injected_t=2.0, target="rank 1")
    kill = FaultRecord(id="c001-rank_kill", type="rank_kill", injected_t=20.0, target="rank 1")
    first, second = score(events, [oom, kill]).injections
    assert first.detected and first.attributed is True and first.named_ranks == [1]
    assert not first.went_down and first.recovered and first.lost_steps == 0
    assert first.recovery_time_s is None
    assert second.went_down and second.lost_steps == 5


def test_compound_during_a_recovery_and_during_a_save() -> None:
    events = kill_timeline()
    kill = FaultRecord(id="c000-rank_kill", type="rank_kill", injected_t=20.0, target="rank 1")
    during = FaultRecord(id="c001-rank_kill", type="rank_kill", injected_t=22.0,
                         target="rank 0", details={"error": "rank 0 is restarting"})
    late = FaultRecord(id="c002-rank_hang", type="rank_hang", injected_t=25.0,
                       target="rank 0")
    save = FaultRecord(id="c003-grad_nan", type="grad_nan", injected_t=3.2, target="rank 1")
    s = score(events, [save, kill, during, late])
    by_id = {i.fault_id: i for i in s.injections}
    assert by_id["c003-grad_nan"].compound_reasons == ["during the save of step 5"]
    assert by_id["c002-rank_hang"].compound_reasons == ["during the recovery from "
                                                        "c000-rank_kill"]
    assert not by_id["c000-rank_kill"].compound
    assert not by_id["c001-rank_kill"].injected and s.injected == 3 and s.scheduled == 4
    assert s.compound == 2


def test_compound_during_a_save_that_failed_or_never_completed() -> None:
    """A save that never wrote ``checkpoint_saved`` is still a save under way: its failure
    anomaly gives its start, and a wall-clock kill right after a checkpoint step's record
    struck rank 0 while it saved. A step-clock fault at that step did not: the step gate held
    it before the save began."""
    events = kill_timeline()
    events += [ev(2.6, "anomaly", 0, 100, what="checkpoint_save_failed", step=4,
                  seconds=0.3)]  # a save of step 4 that began at 2.3 and failed
    failed = FaultRecord(id="c000-io_error", type="io_error",
                         capabilities=("fails_saves", "mounts_storage"), injected_t=2.4,
                         target="all")
    killed = FaultRecord(id="c001-rank_kill", type="rank_kill", injected_t=5.7,
                         target="rank 1")  # 0.2 s after rank 0's step 10, a checkpoint step
    by_id = {i.fault_id: i for i in score(events, [failed, killed]).injections}
    assert by_id["c000-io_error"].compound_reasons == ["during the save of step 4 (it failed)"]
    assert by_id["c001-rank_kill"].compound_reasons == [
        "during the save of step 10 (never completed)"]

    @dataclass
    class Arrival:
        at_step: int | None
        at_s: float | None = None

    gated = score_campaign(events, [failed, killed], procs_per_node=1, world_size=2,
                           mtbf_s=None, mtbf_steps=20, checkpoint_every=5,
                           golden_events=kill_golden(),
                           planned={"c000-io_error": Arrival(4), "c001-rank_kill": Arrival(10)})
    first, second = gated.injections
    assert (first.at_step, second.at_step) == (4, 10) and second.at_s == pytest.approx(5.7)
    assert not second.compound  # held by the gate before step 10's save
    # the step clock's projection: a failure every 20 steps of progress (20 x 0.4 s of
    # useful time) costs p_down x L on top: golden / (1 + p_down x L / M)
    inputs = gated.projection_inputs
    assert inputs["clock"] == "steps" and inputs["mtbf_s"] == pytest.approx(8.0)
    assert inputs["p_down"] == 1.0  # the kill, isolated, took the job down
    assert gated.projected_ettr == pytest.approx(round(inputs["golden_ettr"] / (
        1 + inputs["lost_per_failure_s"] / 8.0), 4))


def test_an_unrecovered_failure_makes_the_p95_infinite() -> None:
    events = [e for e in kill_timeline() if e["t"] < 21]  # the job never came back
    kill = FaultRecord(id="c000-rank_kill", type="rank_kill", injected_t=20.0, target="rank 1")
    s = score(events, [kill])
    [inj] = s.injections
    assert inj.went_down and not inj.recovered
    assert s.recovery_time_p95_s == math.inf
    assert s.to_dict()["recovery_time_p95_s"] is None  # strict JSON
    doc = campaign().model_copy(update={"expect": campaign().expect.model_copy(
        update={"recovery_time_p95_s": 60.0})})
    [*_, p95] = judge_campaign(doc, s)
    assert p95.name == "recovery_time_p95_s" and not p95.passed
    assert "never recovered" in p95.note


def test_false_positives_of_the_golden_run() -> None:
    golden = kill_golden()
    assert false_positives(golden) == []
    golden += [ev(3.0, "anomaly", 0, 10, what="straggler", straggler_rank=1, step=5),
               ev(3.5, "exit", 1, 11, reason="watchdog"),
               ev(4.0, "start", 0, 12, resumed_from_step=5, restart=1)]
    signals = false_positives(golden)
    assert signals == ["anomaly:straggler (rank 0, step 5)", "exit:watchdog (rank 1)",
                       "restart (rank 0 started again, restart 1)"]
    kill = FaultRecord(id="c000-rank_kill", type="rank_kill", injected_t=20.0, target="rank 1")
    s = score(kill_timeline(), [kill], golden)
    assert s.false_positives == 3
    assert s.false_positives_per_hour == pytest.approx(3 / (7.0 / 3600))
    assert golden_step_time_s(golden) == 0.4
    # a level-0 trainer: its starts are the observer's, its steps carry no step_time_s
    level0 = [{**r, "level": 0} for r in golden if r["kind"] == "start"] + [
        {k: v for k, v in r.items() if k != "step_time_s"} for r in golden
        if r["kind"] != "start"]
    assert false_positives(level0)[-1] == "restart (rank 0 started again, restart 1)"
    assert golden_step_time_s(level0) == pytest.approx(0.5)  # the gap between its records


def test_campaign_slas_judged() -> None:
    kill = FaultRecord(id="c000-rank_kill", type="rank_kill", injected_t=20.0, target="rank 1")
    s = score(kill_timeline(), [kill])
    results = {r.name: r for r in judge_campaign(campaign(), s)}
    assert list(results) == ["ettr", "detection_rate"]
    assert results["detection_rate"].passed and results["detection_rate"].measured == 1.0
    assert results["ettr"].measured == s.ettr
    assert results["ettr"].passed == (s.ettr >= 0.5)


# --- the starter ----------------------------------------------------------------------------

def test_starter_mix_is_llama3s_419_interruptions_and_validates(tmp_path: Path) -> None:
    assert sum(weight for _, weight, _, _ in LLAMA3_MIX) == 419
    doc = parse_document(starter_campaign("starter"), "starter.yaml")
    assert isinstance(doc, Campaign)
    assert [e.weight for e in doc.campaign.mix] == [w for _, w, _, _ in LLAMA3_MIX]
    out = tmp_path / "mine.yaml"
    assert main(["campaign", "init", "--name", "mine", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.count("# Source: Llama 3 Herd of Models") == len(LLAMA3_MIX)
    assert "Faulty GPU 148 (30.1 %)" in text
    assert main(["campaign", "init", "--name", "mine", "--out", str(out)]) != 0  # no overwrite
    assert main(["run", "--dry-run", str(out)]) == 0


def test_the_html_page_marks_every_injection_and_loads_nothing() -> None:
    from faultlab.engine.campaign import _plot_data
    from faultlab.report.html import render_campaign_html

    events = kill_timeline()
    kill = FaultRecord(id="c000-rank_kill", type="rank_kill", injected_t=20.0, target="rank 1")
    s = score(events, [kill])
    journal = {"verdict": "pass", "slas": [], "experiment": {"name": "camp", "seed": 3,
                                                             "description": None},
               "campaign": {"score": s.to_dict(), **_plot_data(events, [kill], s)}}
    assert journal["campaign"]["marked"][0]["t"] == 20.0  # on the clock of the first record
    page = render_campaign_html(journal)
    assert "<svg" in page and "c000-rank_kill A" in page  # marked, and attributed
    assert "<script" not in page and "<link" not in page
    assert "rank_kill" in page and "per hour" in page


def test_a_prelaunch_suite_may_include_a_campaign(tmp_path: Path) -> None:
    from faultlab.report._format import sla_bound

    (tmp_path / "camp.yaml").write_text(DOC.format(seed=3, mtbf_s=20))
    (tmp_path / "suite.yaml").write_text(
        "suite:\n  name: s\n  experiments: [camp.yaml]\n  plan: {num_gpus: 8, gpus_per_node: 8,"
        " mtbf_per_node_h: 1000, step_time_s: 1, checkpoint_size_gb: 1,"
        " storage_bandwidth_gb_s: 1}\n")
    [(path, exp)] = load_experiments([tmp_path / "suite.yaml"])
    # the member runs as a campaign (faultlab run's loop asks load_campaign of each path)
    assert load_campaign(path) is not None and exp == compile_campaign(campaign(3, mtbf_s=20))
    assert sla_bound("ettr", 0.5) == "≥ 0.500"  # the suite's report says which way it holds


def test_faultlab_report_rerenders_a_campaign_run(tmp_path: Path) -> None:
    from faultlab.engine.campaign import _plot_data
    from faultlab.report.journal import write_journal

    events = kill_timeline()
    kill = FaultRecord(id="c000-rank_kill", type="rank_kill", injected_t=20.0, target="rank 1")
    s = score(events, [kill])
    write_journal(tmp_path, {
        "verdict": "pass", "slas": [{"name": "ettr", "bound": 0.3, "measured": s.ettr,
                                     "passed": True, "note": ""}],
        "metrics": {}, "faults": [], "golden": None,
        "experiment": {"name": "camp", "seed": 3, "description": None, "file": "camp.yaml"},
        "run": {"wall_s": 30.0, "job_dir": str(tmp_path / "job")},
        "environment": {"faultlab": "x", "torch": "x", "python": "x", "platform": "x",
                        "host": "x", "cpu_count": 2},
        "campaign": {"score": s.to_dict(), **_plot_data(events, [kill], s)}})
    assert "## Campaign" in (tmp_path / "report.md").read_text()
    assert main(["report", str(tmp_path)]) == 0
    assert "c000-rank_kill A" in (tmp_path / "report.html").read_text()
