"""The team's detection signals (``observe.detections``): read, scored and judged, on synthetic
records and real files (no job runs here)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from faultlab.engine.detect_watch import DetectionWatcher, finished_run_counts
from faultlab.judge.verdict import judge
from faultlab.observe import FaultRecord, compute_metrics
from faultlab.observe.detection_score import (
    DetectionReport,
    SignalScore,
    attribution,
    onset_of,
    report_of,
)
from faultlab.observe.detections import (
    DETECTIONS_FILE,
    Detection,
    anomaly_detections,
    exclusion_detections,
    line_detections,
    read_detections,
)
from faultlab.spec import experiment_from_dict
from faultlab.spec.observation import DetectionSignal

T = 1010.0
FINGERPRINT = DetectionSignal(
    name="fingerprint",
    log_pattern=r"SDC: fingerprint of rank (?P<rank>\d+) disagrees at step (?P<step>\d+)")
SPIKE = DetectionSignal(name="spike", log_pattern=r"loss spike")
ABORT = DetectionSignal(name="abort", exit_code=93)
DRAINED = DetectionSignal(name="drained", node_excluded=True)
FLAG = DetectionSignal(name="flag", file="sdc-suspect-*.txt")
SDC = FaultRecord(id="sdc-1", type="sdc", injected_t=T, target="rank 1",
                  capabilities=("corrupts_silently",))


def ev(t: float, kind: str, rank: int = 0, **fields: Any) -> dict[str, Any]:
    return {"t": t, "kind": kind, "rank": rank, "pid": 100 + rank, "node": f"node{rank}",
            **fields}


def steps(last: int = 20, t0: float = 1000.0) -> list[dict[str, Any]]:
    return [ev(t0 + s, "step", r, step=s) for s in range(1, last + 1) for r in (0, 1)]


def struck(step: int, rank: int = 1, **kw: Any) -> dict[str, Any]:
    return ev(1000.0 + step + 0.5, "fault_struck", rank, fault_id="sdc-1", type="sdc",
              step=step, surface="update", op="bitflip", **kw)


# ------------------------------------------------------------------------------ reading


def test_a_log_line_names_whom_its_groups_name_and_takes_the_step_it_says() -> None:
    (d,) = line_detections([FINGERPRINT, SPIKE],
                           "[rank0] SDC: fingerprint of rank 1 disagrees at step 15", 5.0)
    assert (d.name, d.t, d.step, d.ranks, d.nodes) == ("fingerprint", 5.0, 15, (1,), None)
    (spike,) = line_detections([FINGERPRINT, SPIKE], "loss spike!", 6.0)
    assert (spike.ranks, spike.nodes, spike.step) == (None, None, None)  # named nobody


def test_a_line_without_a_step_group_gets_the_jobs_highest_step_then(tmp_path: Path) -> None:
    (tmp_path / DETECTIONS_FILE).write_text(
        json.dumps(Detection("spike", 1012.5, None, None, None, "loss spike").to_dict()) +
        "\n{torn")
    (d,) = read_detections([SPIKE], tmp_path, steps())
    assert d.step == 12  # steps 1..12 were recorded by t=1012.5


def test_the_trainers_anomalies_are_detections_named_by_their_rank_fields() -> None:
    found = anomaly_detections([
        ev(1011.0, "anomaly", 0, what="straggler", straggler_rank=1, step=11),
        ev(1012.0, "anomaly", 0, what="sdc_suspected", suspect_rank=1, step=12),
        ev(1013.0, "anomaly", 0, what="sdc_suspected", ranks=[0, 1], step=13),
        ev(1014.0, "anomaly", 1, what="loss_spike", step=14)])
    assert [(d.name, d.ranks) for d in found] == [
        ("anomaly:straggler", (1,)), ("anomaly:sdc_suspected", (1,)),
        ("anomaly:sdc_suspected", (0, 1)), ("anomaly:loss_spike", None)]


def test_an_incarnation_without_a_node_is_that_node_excluded() -> None:
    events = [ev(1000.0, "start", 0), *steps(5),
              ev(1006.0, "start", 0), ev(1007.0, "step", 0, step=6)]  # node1 left out
    (d,) = exclusion_detections([DRAINED], events)
    assert (d.name, d.t, d.step, d.nodes) == ("drained", 1007.0, 6, ("node1",))


# ------------------------------------------------------------------------------ the onset


def test_the_onset_is_the_first_strike_and_its_victims_those_struck() -> None:
    events = [*steps(), struck(10), struck(11), struck(12)]
    onset = onset_of([SDC], events)
    assert onset is not None
    assert (onset.t, onset.step, onset.ranks, onset.nodes) == (1010.5, 10, (1,), ("node1",))
    assert onset.describe() == "sdc-1 (sdc) on rank 1's update from step 10, 3 strikes"


def test_without_strike_records_the_onset_is_the_injection() -> None:
    slow = FaultRecord(id="slow", type="gpu_slow", injected_t=1005.2, target="rank 1",
                       capabilities=("slows_job",))
    onset = onset_of([slow], steps())
    assert onset is not None and (onset.t, onset.step, onset.ranks) == (1005.2, 5, (1,))
    injected = ev(1006.0, "fault_injected", 1, fault_id="slow", type="gpu_slow", step=6)
    onset = onset_of([slow], [*steps(), injected])
    assert onset is not None and (onset.t, onset.step, onset.nodes) == (1006.0, 6, ("node1",))


def test_a_fault_that_failed_or_does_not_go_unnoticed_has_no_onset() -> None:
    failed = FaultRecord(id="sdc-1", type="sdc", injected_t=T, target="rank 1",
                         capabilities=("corrupts_silently",), details={"error": "boom"})
    kill = FaultRecord(id="k", type="rank_kill", injected_t=T, target="rank 1")
    assert onset_of([failed, kill], steps()) is None


@pytest.mark.parametrize(("ranks", "nodes", "expected"), [
    ((1,), None, "exact"), ((0, 1), None, "extra"), ((0,), None, "wrong"),
    (None, None, "none"), (None, ("node1",), "exact"), (None, ("node0",), "wrong")])
def test_attribution(ranks: Any, nodes: Any, expected: str) -> None:
    onset = onset_of([SDC], [*steps(), struck(10)])
    assert onset is not None
    assert attribution(Detection("x", 1020.0, 20, ranks, nodes, ""), onset) == expected


def test_victims_struck_on_two_ranks_named_one_is_wrong() -> None:
    onset = onset_of([SDC], [*steps(), struck(10, 0), struck(10, 1)])
    assert onset is not None and onset.ranks == (0, 1)
    assert attribution(Detection("x", 1020.0, 20, (1,), None, ""), onset) == "wrong"


# ------------------------------------------------------------------------------ scoring


def _report(detections: list[Detection], alarms: dict[str, int | None] | None = None,
            events: list[dict[str, Any]] | None = None) -> DetectionReport:
    from faultlab.observe.detection_score import score_detections
    events = events if events is not None else [*steps(), struck(10)]
    return score_detections(["fingerprint", "spike"], detections, onset_of([SDC], events),
                            alarms)


def test_a_check_after_the_strike_that_prints_the_previous_step_is_within_0_steps() -> None:
    # the strike at step 10's start (t 1010.5); the trainer's check right after step 9's
    # optimizer step prints "step 9" at t 1010.6: after the strike, by the clock
    (fp, _) = _report([Detection("fingerprint", 1010.6, 9, (1,), None, "line")]).signals
    assert fp.detected and fp.within_steps == 0 and fp.within_s == pytest.approx(0.1)


def test_a_signal_is_scored_from_the_onset_and_an_alarm_before_it_is_no_detection() -> None:
    report = _report([Detection("fingerprint", 1005.0, 5, (0,), None, "early"),
                      Detection("fingerprint", 1015.7, 15, (1,), None, "line")],
                     {"fingerprint": 0, "spike": 2})
    fp, spike = report.signals
    assert fp.detected and fp.step == 15 and fp.within_steps == 5
    assert fp.within_s == pytest.approx(5.2) and fp.attribution == "exact"
    assert not spike.detected and spike.attribution is None and spike.false_alarms == 2
    section = report.to_dict()
    assert section["onset"] == {"fault_id": "sdc-1", "t": 1010.5, "step": 10, "ranks": [1],
                                "nodes": ["node1"], "ground_truth": "sdc-1 (sdc) on rank 1's "
                                "update from step 10, 1 strike"}
    assert set(section["signals"][0]) == {
        "name", "detected", "t", "step", "within_s", "within_steps", "ranks", "nodes",
        "attribution", "false_alarms", "evidence"}


def test_no_golden_run_is_no_false_alarm_count() -> None:
    assert [s.false_alarms for s in _report([]).signals] == [None, None]


# ------------------------------------------------------------------------------ verdicts


def _exp(expect: dict[str, Any], detections: tuple[DetectionSignal, ...] = (
        FINGERPRINT, SPIKE)) -> Any:
    return experiment_from_dict({
        "name": "det", "run": {"steps": 20}, "topology": {"nodes": 2},
        "observe": {"detections": [s.model_dump(exclude_none=True) for s in detections]},
        "faults": [{"type": "collective_delay", "target": {"rank": 1},
                    "trigger": {"at_step": 10}, "duration_s": 5}],
        "expect": expect})


def _judge(expect: dict[str, Any], events: list[dict[str, Any]],
           report: DetectionReport | None = None, faults: list[FaultRecord] | None = None
           ) -> dict[str, Any]:
    faults = faults if faults is not None else [SDC]
    events = [ev(999.0, "start", 0, world_size=2), ev(999.0, "start", 1, world_size=2),
              *events, ev(1020.5, "final_digest", 0, digest="d" * 64),
              ev(1020.6, "exit", 0, reason="completed"),
              ev(1020.6, "exit", 1, reason="completed")]
    results = judge(_exp(expect), compute_metrics(events, faults), None, timed_out=False,
                    faults=faults, events=events, detection=report)
    return {r.name: r for r in results}


def test_detected_and_attributed_within_the_bound_passes() -> None:
    events = [*steps(), struck(10),
              ev(1013.2, "anomaly", 0, what="sdc_suspected", suspect_rank=1, step=13)]
    r = _judge({"detected_within_steps": 3, "detected_within_s": 5,
                "detection_attributed": True}, events)
    assert r["detected_within_steps"].passed and r["detected_within_steps"].measured == 3
    assert r["detected_within_s"].measured == pytest.approx(2.7)
    assert r["detection_attributed"].passed, r["detection_attributed"].note


def test_a_struck_fault_never_detected_fails_with_its_ground_truth() -> None:
    events = [*steps(), *(struck(s) for s in range(10, 21))]
    r = _judge({"detected_within_steps": 3, "detection_attributed": True}, events)
    for key in ("detected_within_steps", "detection_attributed"):
        assert r[key].result == "fail"
        assert r[key].note == ("not detected by fingerprint, spike: sdc-1 (sdc) on rank 1's "
                               "update from step 10, 11 strikes"), r[key].note


def test_a_fault_that_never_struck_is_inconclusive_never_a_pass() -> None:
    failed = FaultRecord(id="sdc-1", type="sdc", injected_t=T, target="rank 1",
                         capabilities=("corrupts_silently",), details={"error": "x"})
    r = _judge({"detected_within_steps": 3}, steps(), faults=[failed])
    assert r["detected_within_steps"].result == "inconclusive"


def test_a_detection_naming_others_too_is_not_attributed() -> None:
    events = [*steps(), struck(10),
              ev(1012.0, "anomaly", 0, what="sdc_suspected", ranks=[0, 1], step=12)]
    r = _judge({"detection_attributed": True}, events)["detection_attributed"]
    assert r.result == "fail" and "anomaly:sdc_suspected: extra (ranks [0, 1])" in r.note


def test_a_detection_naming_nobody_is_detected_not_attributed() -> None:
    report = _report([Detection("spike", 1012.0, 12, None, None, "loss spike")])
    r = _judge({"detection_attributed": True, "detected_within_steps": 5}, steps(), report)
    assert r["detected_within_steps"].passed
    assert r["detection_attributed"].result == "fail"
    assert "spike: detected, not attributed" in r["detection_attributed"].note


def test_detected_by_counts_only_the_signals_it_names() -> None:
    report = _report([Detection("spike", 1012.0, 12, None, None, "loss spike"),
                      Detection("fingerprint", 1019.0, 19, (1,), None, "fp")])
    exp = {"detected_within_steps": 3, "detected_by": ["fingerprint"]}
    r = _judge(exp, steps(), report)["detected_within_steps"]
    assert r.measured == 9 and r.result == "fail"


def test_nan_never_passes() -> None:
    onset = onset_of([SDC], [*steps(), struck(10)])
    report = DetectionReport(onset, [SignalScore("fingerprint", True, math.nan, None,
                                                 math.nan, None, [1], None, "exact", 0, "")])
    r = _judge({"detected_within_s": 5.0, "detected_within_steps": 5}, steps(), report)
    assert r["detected_within_s"].result == "fail"
    assert r["detected_within_steps"].result == "fail"  # no step: not measured


def test_false_alarms_come_from_the_golden_run() -> None:
    ok = _report([], {"fingerprint": 0, "spike": 0})
    bad = _report([], {"fingerprint": 0, "spike": 3})
    unknown = _report([], {"fingerprint": None, "spike": 0})
    assert _judge({"false_alarms": 0}, steps(), ok)["false_alarms"].passed
    r = _judge({"false_alarms": 0}, steps(), bad)["false_alarms"]
    assert r.measured == 3 and r.note == "spike: 3" and not r.passed
    r = _judge({"false_alarms": 0}, steps(), unknown)["false_alarms"]
    assert r.measured is None and not r.passed
    assert not _judge({"false_alarms": 0}, steps())["false_alarms"].passed  # no golden


def test_checkpoints_after_the_onset_and_the_resume() -> None:
    events = [*steps(), struck(10),
              ev(1005.2, "checkpoint_saved", 0, step=5), ev(1015.2, "checkpoint_saved", 0,
                                                            step=15),
              ev(1016.0, "checkpoint_loaded", 0, step=5, pid=300)]
    r = _judge({"contaminated_checkpoints": 0, "resumed_from_clean_state": True}, events)
    assert r["contaminated_checkpoints"].measured == 1
    assert r["resumed_from_clean_state"].passed
    dirty = [*events, ev(1017.0, "checkpoint_loaded", 1, step=15, pid=301)]
    r = _judge({"resumed_from_clean_state": True}, dirty)["resumed_from_clean_state"]
    assert r.measured is False and "5, 15" in r.note


def test_a_declared_signal_naming_the_slowed_rank_detects_a_straggler(tmp_path: Path) -> None:
    delay = FaultRecord(id="slow", type="collective_delay", injected_t=1010.0,
                        undone_t=1015.0, target="rank 1", capabilities=("slows_job",))
    slow = DetectionSignal(name="slow", log_pattern=r"rank (?P<rank>\d+) is slow")
    (tmp_path / DETECTIONS_FILE).write_text(
        json.dumps(Detection("slow", 1012.0, None, (1,), None, "rank 1 is slow").to_dict()))
    events = steps()
    report = report_of([slow], tmp_path, events, [delay], None)
    exp = experiment_from_dict({
        "name": "s", "observe": {"detections": [{"name": "slow",
                                                 "log_pattern": slow.log_pattern}]},
        "expect": {"straggler_detected_within_s": 5}})
    (r,) = [x for x in judge(exp, compute_metrics(events, [delay]), None, timed_out=False,
                             faults=[delay], events=events, detection=report)
            if x.name == "straggler_detected_within_s"]
    assert r.passed and r.measured == pytest.approx(2.0)
    # the same without the declared signal: the anomaly alone, and there is none
    (r,) = [x for x in judge(exp, compute_metrics(events, [delay]), None, timed_out=False,
                             faults=[delay], events=events) if x.name ==
            "straggler_detected_within_s"]
    assert r.measured is None and not r.passed


# ------------------------------------------------------------------------------ live and golden


def test_the_watcher_stamps_new_lines_exits_and_files_once(tmp_path: Path,
                                                          monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    job, folder = tmp_path / "run" / "job", tmp_path / "run"
    (job / "logs").mkdir(parents=True)
    log = job / "logs" / "node0.log"
    log.write_text("step 1\nSDC: fingerprint of rank 1 disagrees at step 1")  # no newline yet
    codes: dict[str, int | None] = {"node0": None, "node1": None}
    target = SimpleNamespace(result=lambda: SimpleNamespace(returncodes=dict(codes)))
    w = DetectionWatcher([FINGERPRINT, ABORT, FLAG], job, folder, target, 0.0)
    w.poll(1.0)
    assert (folder / DETECTIONS_FILE).read_text() == ""  # a half-written line waits
    with open(log, "a") as f:
        f.write("5\nloss 1.0\n")
    (job / "sdc-suspect-1.txt").write_text("rank 1")
    codes["node1"] = 93
    w.poll(1.1)  # within POLL_S: not looked at
    assert (folder / DETECTIONS_FILE).read_text() == ""
    w.poll(2.0)
    w.poll(3.0)  # nothing new: nothing twice
    w.close()
    found = read_detections([FINGERPRINT, ABORT, FLAG], folder, [])
    assert sorted((d.name, d.step, d.ranks, d.nodes) for d in found) == [
        ("abort", None, None, ("node1",)), ("fingerprint", 15, (1,), None),
        ("flag", None, None, None)]


def test_a_golden_run_is_counted_from_what_it_left(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "node0.log").write_text("loss spike\nok\nloss spike\n")
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "rank0.jsonl").write_text(json.dumps(
        ev(1001.0, "anomaly", 0, what="loss_spike", step=1)) + "\n")
    counts = finished_run_counts([SPIKE, ABORT, FINGERPRINT], tmp_path, {"node0": 0})
    assert counts == {"spike": 2, "abort": 0, "fingerprint": 0, "anomaly:loss_spike": 1}
    assert finished_run_counts([ABORT], tmp_path, None) == {"abort": None,
                                                            "anomaly:loss_spike": 1}



# ------------------------------------------------------------------------------ validation

FAULT = """faults:
  - {type: collective_delay, target: {rank: 1}, trigger: {at_step: 5}, duration_s: 5}
"""


def _problems(text: str) -> list[str]:
    from faultlab.errors import InvalidExperimentError
    from faultlab.spec import parse_experiment
    with pytest.raises(InvalidExperimentError) as info:
        parse_experiment(text, "e.yaml")
    return [str(p) for p in info.value.problems]


@pytest.mark.parametrize(("signal", "expected"), [
    ("{name: a, log_pattern: '(?P<rank>\\d+'}",
     "e.yaml:4 observe.detections[0].log_pattern: '(?P<rank>\\\\d+' is not a regular "
     "expression: missing ), unterminated subpattern at position 0"),
    ("{name: a, log_pattern: 'loss (?P<loss>\\S+)'}",
     "e.yaml:4 observe.detections[0].log_pattern: 'loss (?P<loss>\\\\S+)' has the named "
     "group(s) loss; a detection pattern may name only (?P<step>...), (?P<rank>...) and "
     "(?P<node>...): rename them, or make them unnamed (...)"),
    ("{name: a, exit_code: 93, file: x.txt}",
     "e.yaml:4 observe.detections[0]: signal 'a' needs exactly one of log_pattern, "
     "exit_code, node_excluded, file; it has exit_code, file: split it into one signal per "
     "source"),
    ("{name: 'anomaly:x', exit_code: 93}",
     "e.yaml:4 observe.detections[0].name: 'anomaly:x': names starting with 'anomaly:' are "
     "the trainer's own anomaly records; choose another name"),
])
def test_a_bad_signal_is_refused_where_it_is(signal: str, expected: str) -> None:
    text = f"name: x\nobserve:\n  detections:\n    - {signal}\n"
    assert _problems(text) == [expected]


def test_two_signals_of_one_name_are_refused() -> None:
    text = ("name: x\nobserve:\n  detections:\n    - {name: a, exit_code: 93}\n"
            "    - {name: a, exit_code: 94}\n")
    assert _problems(text) == ["e.yaml:5 observe.detections[1].name: duplicate signal name "
                               "'a' (also detections[0]); give each signal its own name"]


def test_attribution_needs_a_signal_that_can_name_someone() -> None:
    text = ("name: x\nobserve:\n  detections:\n    - {name: spike, log_pattern: 'spike'}\n"
            "    - {name: flag, file: 'f*'}\n" + FAULT +
            "expect:\n  detected_by: [spike, flag]\n  detection_attributed: true\n")
    (problem,) = _problems(text)
    assert problem.startswith("e.yaml:10 expect.detection_attributed: detection_attributed "
                              "needs a signal that can name a rank or a node; 'spike' "
                              "(observe.detections[0].log_pattern) names nobody: its pattern "
                              "has no (?P<rank>...) or (?P<node>...) group; 'flag'")
    named = text.replace("'spike'}", "'spike on (?P<node>\\S+)'}")
    from faultlab.spec import parse_experiment
    assert parse_experiment(named).expect.detection_attributed is True


def test_a_command_that_writes_no_records_needs_a_declared_signal() -> None:
    text = ("name: x\ntarget: {command: [python, -c, 'pass']}\n" + FAULT +
            "expect:\n  detected_within_s: 10\n")
    (problem,) = _problems(text)
    assert problem.startswith("e.yaml:6 expect.detected_within_s: detected_within_s asks "
                              "whether the team's monitors notice, but your trainer "
                              "(target.command) writes no records"), problem


def test_detection_of_a_fault_that_neither_slows_nor_corrupts_is_refused() -> None:
    text = ("name: x\nfaults:\n  - {type: rank_kill, target: {rank: 1}, "
            "trigger: {at_step: 5}}\nexpect:\n  detected_within_steps: 5\n  false_alarms: 0\n")
    (problem,) = _problems(text)  # false_alarms needs no fault
    assert problem.startswith("e.yaml:5 expect.detected_within_steps: detected_within_steps "
                              "asks for the detection of a fault, but no fault of this "
                              "experiment slows the job or corrupts silently (faults: "
                              "rank_kill)"), problem


def test_detected_by_names_declared_signals() -> None:
    text = ("name: x\nobserve:\n  detections:\n    - {name: fingerprint, exit_code: 93}\n"
            + FAULT + "expect:\n  detected_by: [fingerprnt, 'anomaly:straggler']\n"
            "  detected_within_steps: 5\n")
    assert _problems(text) == [
        "e.yaml:8 expect.detected_by[0]: 'fingerprnt' is no declared signal; declared: "
        "fingerprint, or anomaly:<what> for the trainer's own anomaly records; did you mean "
        "'fingerprint'?"]


def test_false_alarms_runs_the_golden_run() -> None:
    from faultlab.spec import parse_experiment
    exp = parse_experiment("name: x\nobserve:\n  detections:\n    - {name: a, exit_code: 93}\n"
                           "expect:\n  false_alarms: 0\n")
    assert exp.golden_runs == 1


def test_the_report_shows_each_signal_and_the_ground_truth_of_a_miss() -> None:
    from faultlab.report.detection import detection_markdown
    missed = _report([], {"fingerprint": 0, "spike": None})
    text = "\n".join(detection_markdown(missed.to_dict()))
    assert "- onset: sdc-1 at step 10 on rank 1, node1" in text
    assert ("- not detected by fingerprint, spike: sdc-1 (sdc) on rank 1's update from step "
            "10, 1 strike") in text
    assert "| fingerprint | NOT DETECTED | — | — | — | 0 |" in text
    assert "| spike | NOT DETECTED | — | — | — | not measured |" in text
    seen = _report([Detection("fingerprint", 1015.7, 15, (1,), None, "line")], {})
    assert "| fingerprint | yes | 5.20 s, 5 steps | ranks 1 | exact | not measured |" in \
        "\n".join(detection_markdown(seen.to_dict()))
    assert detection_markdown(None) == []


def test_a_golden_run_counts_only_files_of_its_own_time(tmp_path: Path,
                                                        monkeypatch: Any) -> None:
    import os
    monkeypatch.chdir(tmp_path)
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "rank0.jsonl").write_text(
        json.dumps(ev(1000.0, "start", 0)) + "\n" + json.dumps(ev(1100.0, "exit", 0)) + "\n")
    for name, mtime in (("sdc-suspect-0.txt", 1050.0), ("sdc-suspect-1.txt", 5000.0)):
        (tmp_path / name).write_text("x")
        os.utime(tmp_path / name, (mtime, mtime))  # the second: a later run's, same folder
    assert finished_run_counts([FLAG], tmp_path, None) == {"flag": 1}
