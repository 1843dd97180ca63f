"""Engine pieces that need no job: triggers, the judge, reaction detection, journal, guard."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from faultlab.cli import main as cli_main
from faultlab.engine.golden import GoldenRun, golden_key
from faultlab.engine.triggers import TriggerState
from faultlab.judge import judge
from faultlab.observe import FaultRecord, compute_metrics
from faultlab.report.journal import SCHEMA_VERSION, read_journal, render_markdown, write_journal
from faultlab.spec import arrival_times_s, parse_experiment

BASE = """\
name: t
seed: 3
target: {trainer: reference, preset: tiny}
topology: {nodes: 2, procs_per_node: 1}
run: {steps: 40, checkpoint_every: 10, timeout_s: 100}
"""


def exp_with(fault_yaml: str = "", expect: str = "") -> Any:
    text = BASE + (f"faults:\n{fault_yaml}" if fault_yaml else "") + \
        (f"expect:\n{expect}" if expect else "")
    return parse_experiment(text)


class FakeStream:
    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events

    def max_step(self) -> int:
        return max((e["step"] for e in self.events if e["kind"] == "step"), default=0)

    def count(self, kind: str, **match: Any) -> int:
        return sum(1 for e in self.events if e["kind"] == kind
                   and all(e.get(k) == v for k, v in match.items()))


def step(n: int, rank: int = 0) -> dict[str, Any]:
    return {"kind": "step", "step": n, "rank": rank, "t": float(n)}


# --- triggers -----------------------------------------------------------------------------


def test_at_step_fires_once_when_the_step_is_reached() -> None:
    st = TriggerState(exp_with(
        "  - {type: rank_kill, target: {rank: 1}, trigger: {at_step: 5}}\n"), 0)
    stream = FakeStream([step(i) for i in range(1, 5)])
    assert not st.due(stream, 1.0)
    stream.events.append(step(5))
    assert st.due(stream, 1.0)
    st.mark_fired()
    stream.events.append(step(6))
    assert not st.due(stream, 2.0)


def test_at_time_fires_on_elapsed_seconds() -> None:
    st = TriggerState(exp_with(
        "  - {type: rank_kill, target: {rank: 1}, trigger: {at_time_s: 2.5}}\n"), 0)
    assert not st.due(FakeStream([]), 2.4)
    assert st.due(FakeStream([]), 2.5)


def test_after_event_counts_matching_records() -> None:
    st = TriggerState(exp_with(
        "  - type: rank_kill\n    target: {rank: 1}\n"
        "    trigger: {after_event: {kind: checkpoint_saved, count: 2, match: {rank: 0}}}\n"), 0)
    events = [{"kind": "checkpoint_saved", "rank": 1, "t": 1.0},
              {"kind": "checkpoint_saved", "rank": 0, "t": 2.0}]
    assert not st.due(FakeStream(events), 5)
    events.append({"kind": "checkpoint_saved", "rank": 0, "t": 3.0})
    assert st.due(FakeStream(events), 5)


def test_every_fires_at_the_seeded_arrivals_up_to_max_count() -> None:
    exp = exp_with("  - type: rank_kill\n    target: random\n"
                   "    trigger: {every: {mtbf_s: 10, max_count: 3}}\n")
    arrivals = arrival_times_s(exp, 0)
    assert len(arrivals) == 3 and arrivals == sorted(arrivals)
    assert arrivals == arrival_times_s(exp, 0)  # same seed, same schedule
    st = TriggerState(exp, 0)
    fired_at = []
    for tenth in range(0, 1000):
        t = tenth / 10
        if st.due(FakeStream([]), t):
            st.mark_fired()
            fired_at.append(t)
    assert len(fired_at) == 3
    assert all(0 <= f - a < 0.1 + 1e-9 for f, a in zip(fired_at, arrivals, strict=True))


# --- reaction, judge ------------------------------------------------------------------------


def _reacted(records: list[dict[str, object]], since_t: float, pids: set[int]) -> bool:
    import json
    import tempfile

    from faultlab.observe.stream import EventStream

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "events").mkdir()
        (Path(tmp) / "events" / "rank0.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in records))
        stream = EventStream(tmp)
        stream.poll()
        return stream.reacted_since(since_t, pids)


def test_reacted_sees_the_signs_of_detection_only_after_injection() -> None:
    before = [{"kind": "start", "pid": 10, "t": 1.0}, {"kind": "step", "t": 2.0}]
    assert not _reacted(before, 2.5, {10})
    assert not _reacted(before + [{"kind": "step", "t": 3.0}], 2.5, {10})
    assert not _reacted(before + [{"kind": "exit", "reason": "completed", "t": 3.0}], 2.5, {10})
    assert _reacted(before + [{"kind": "exit", "reason": "watchdog", "t": 3.0}], 2.5, {10})
    assert _reacted(before + [{"kind": "anomaly", "t": 3.0}], 2.5, {10})
    assert _reacted(before + [{"kind": "start", "pid": 11, "t": 3.0}], 2.5, {10})
    assert not _reacted(before + [{"kind": "start", "pid": 10, "t": 3.0}], 2.5, {10})
    # an anomaly from before the injection does not count
    assert not _reacted([{"kind": "anomaly", "t": 1.0}], 2.5, set())
    # a sign that arrives after younger records of its kind still counts
    assert _reacted([{"kind": "exit", "reason": "completed", "t": 4.0},
                     {"kind": "exit", "reason": "watchdog", "t": 3.0}], 2.5, set())


def _run_events(digest: str = "abc") -> list[dict[str, Any]]:
    ev: list[dict[str, Any]] = [
        {"kind": "start", "rank": 0, "world_size": 1, "pid": 1, "restart": 0, "node": "n",
         "resumed_from_step": 0, "t": 0.0}]
    for s in range(1, 5):
        ev.append({"kind": "step", "rank": 0, "world_size": 1, "pid": 1, "restart": 0,
                   "node": "n", "step": s, "loss": 1.0, "samples": [(s - 1) * 2, s * 2],
                   "local_samples": [(s - 1) * 2, s * 2], "step_time_s": 0.5, "t": float(s)})
    ev.append({"kind": "final_digest", "rank": 0, "digest": digest, "t": 5.0,
               "world_size": 1, "pid": 1, "restart": 0, "node": "n"})
    ev.append({"kind": "exit", "rank": 0, "reason": "completed", "code": 0, "t": 5.1,
               "world_size": 1, "pid": 1, "restart": 0, "node": "n"})
    return ev


GOLDEN = GoldenRun(key="k", digest="abc", losses={}, wall_s=1.0, run_dir="", cached=True)
KILL = "  - {id: k, type: rank_kill, target: {rank: 1}, trigger: {at_step: 2}}\n"
INJECTED = [FaultRecord(id="k", type="rank_kill", injected_t=2.5)]


def test_judge_compares_each_sla_and_reports_unmeasured_as_failed() -> None:
    exp = exp_with(KILL, "  completes: true\n  goodput: 0.1\n  max_restarts: 0\n"
                         "  bitwise_equal_to_golden: true\n  resume_time_s: 5\n")
    # the records of the topology's world (2 ranks), which completes asks of them
    events = [{**e, "world_size": 2} for e in _run_events()]
    slas = {s.name: s for s in judge(exp, compute_metrics(events, INJECTED), GOLDEN,
                                      timed_out=False, faults=INJECTED, events=events)}
    assert slas["fault_injected[k]"].passed
    assert slas["completes"].passed and slas["completes"].measured is True
    assert slas["max_restarts"].passed and slas["max_restarts"].measured == 0
    assert slas["goodput"].passed and slas["goodput"].measured == pytest.approx(2.0 / 5.1)
    assert slas["bitwise_equal_to_golden"].passed
    # nothing went down: resume time was never measured, and that is a failure, not a pass
    assert slas["resume_time_s"].measured is None and not slas["resume_time_s"].passed
    assert "not measured" in slas["resume_time_s"].note
    assert "not measured" in slas["resume_time_s"].describe()


def test_judge_fails_a_different_digest_a_timeout_and_a_fault_that_never_fired() -> None:
    exp = exp_with(KILL, "  completes: true\n  bitwise_equal_to_golden: true\n")
    slas = {s.name: s for s in judge(exp, compute_metrics(_run_events("xyz"), []), GOLDEN,
                                      timed_out=True, faults=[])}
    assert not slas["fault_injected[k]"].passed
    assert slas["bitwise_equal_to_golden"].measured is False
    assert not slas["completes"].passed and "timed out after 100 s" in slas["completes"].note
    assert slas["completes"].describe() == \
        "completes: measured False, required == True (timed out after 100 s)"


def test_judge_notes_name_the_first_differing_tensor_and_the_loaded_damage() -> None:
    """A job judged by its final checkpoint (level 0): the note says which tensor differs
    first, and which damaged checkpoint was loaded at which step."""
    from faultlab.observe.final_state import FinalState

    exp = exp_with("  - {id: rot, type: ckpt_bitflip, target: all, trigger: {at_step: 2}}\n",
                   "  bitwise_equal_to_golden: true\n  corrupt_checkpoint_never_loaded: true\n")
    ckpt = "/ckpt/step_2"
    rot = FaultRecord(id="rot", type="ckpt_bitflip", injected_t=2.5, details={
        "checkpoints": [ckpt], "flips": [{"file": "/ckpt/step_2/__0_0.distcp", "offset": 77,
                                          "bit": 3}]})
    events = [*_run_events("xyz"), {"kind": "checkpoint_loaded", "rank": 0, "path": ckpt,
                                    "step": 2, "t": 3.0, "pid": 2}]
    golden = GoldenRun(key="k", digest="abc", losses={}, wall_s=1.0, run_dir="", cached=True,
                       tensors={"model.a": "1", "model.b": "2"})
    ours = FinalState(digest="xyz", tensors={"model.a": "1", "model.b": "3"})
    slas = {s.name: s for s in judge(exp, compute_metrics(events, [rot]), golden,
                                      timed_out=False, faults=[rot], events=events,
                                      final_state=ours)}
    assert slas["bitwise_equal_to_golden"].note == "first differing tensor: model.b"
    loaded = slas["corrupt_checkpoint_never_loaded"]
    assert not loaded.passed and loaded.note == (
        "rank 0 loaded /ckpt/step_2 (step 2) after rot (ckpt_bitflip) damaged "
        "/ckpt/step_2/__0_0.distcp at offset 77, and trained on")


def test_judge_says_why_the_bitwise_verdict_was_not_measured() -> None:
    from faultlab.observe.final_state import NO_FINAL_CHECKPOINT, FinalState

    exp = exp_with(KILL, "  bitwise_equal_to_golden: true\n  completes: true\n")
    events = [e for e in _run_events() if e["kind"] != "final_digest"]
    slas = {s.name: s for s in judge(exp, compute_metrics(events, INJECTED), GOLDEN,
                                      timed_out=False, faults=INJECTED, events=events,
                                      final_state=FinalState(not_measured=NO_FINAL_CHECKPOINT))}
    bitwise = slas["bitwise_equal_to_golden"]
    assert bitwise.measured is None and not bitwise.passed
    assert bitwise.note == f"not measured: {NO_FINAL_CHECKPOINT} (this run)"
    stuck = {s.name: s for s in judge(exp, compute_metrics(events[:1], []), GOLDEN,
                                       timed_out=True, faults=[])}
    assert stuck["completes"].note == \
        "timed out after 100 s without reaching a single step (see the nodes' logs)"


def test_golden_key_ignores_operational_overrides_only() -> None:
    def exp(overrides: str) -> Any:
        return parse_experiment(BASE.replace("preset: tiny}", f"preset: tiny, overrides: "
                                                              f"{{{overrides}}}}}"))
    assert golden_key(exp("watchdog_s: 5, async_checkpoint: true")) == golden_key(exp(""))
    assert golden_key(exp("lr: 0.001")) != golden_key(exp(""))
    assert golden_key(exp_with()) != golden_key(parse_experiment(BASE.replace("seed: 3",
                                                                              "seed: 4")))


def test_golden_key_leaves_out_how_the_job_recovers() -> None:
    """An elastic job's fault-free run is its full world: min_nodes and max_restarts decide
    only what happens after a fault. The world itself does decide the bits."""
    base = golden_key(exp_with())
    elastic = parse_experiment(BASE.replace("nodes: 2,",
                                            "nodes: 2, min_nodes: 1, max_restarts: 0,"))
    assert golden_key(elastic) == base
    assert golden_key(parse_experiment(BASE.replace("nodes: 2,", "nodes: 3,"))) != base


def test_a_golden_run_whose_alarms_are_counted_is_keyed_by_the_monitors_too() -> None:
    """A watchdog's timeout or a spike factor changes no bit, so experiments that read only
    the bits share a golden run across them; but what its monitors report depends on them,
    and an experiment that counts those reports (false_alarms, a slowing fault scored for
    detection, a campaign's false positives) must read a golden run made with its own
    settings, never one that another experiment's settings filled the cache with."""
    def exp(overrides: str = "", expect: str = "completes: true", faults: str = "") -> Any:
        text = BASE.replace("preset: tiny}", f"preset: tiny, overrides: {{{overrides}}}}}")
        return parse_experiment(text + (f"faults:\n{faults}" if faults else "")
                                + f"expect:\n  {expect}\n")

    slow = ("  - {type: gpu_slow, target: {rank: 1}, trigger: {at_step: 5}, params: {factor: 3},\n"
            "     duration_s: 10}\n")
    bits = golden_key(exp())
    assert golden_key(exp("watchdog_s: 5, spike_factor: 2")) == bits  # nobody reads alarms
    alarms = golden_key(exp(expect="false_alarms: 0"))
    assert alarms != bits  # never the entry a run with other monitor settings made
    assert golden_key(exp(faults=slow)) == alarms  # scored for detection: the same reads
    assert golden_key(exp("spike_factor: 2", expect="false_alarms: 0")) != alarms
    assert golden_key(exp("watchdog_s: 5", faults=slow)) != alarms
    assert golden_key(exp("async_checkpoint: true", expect="false_alarms: 0")) == alarms
    # A campaign counts every alarm of its golden run: keyed like any reader of alarms.
    assert not exp().counts_golden_alarms and exp().as_campaign().counts_golden_alarms
    assert golden_key(exp().as_campaign()) == alarms


def test_golden_key_carries_the_ranks_openmp_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU kernel may split a reduction among its threads: a reference made with another
    ``OMP_NUM_THREADS`` (the launcher passes it on to every rank) is another key."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    one = golden_key(exp_with())
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert golden_key(exp_with()) != one
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert golden_key(exp_with()) == one


# --- journal and CLI ------------------------------------------------------------------------


def test_journal_round_trips_and_renders(tmp_path: Path) -> None:
    journal = {"verdict": "fail",
               "slas": [{"name": "resume_time_s", "bound": 1.0, "measured": 2.5,
                         "passed": False, "note": ""}],
               "metrics": {"completes": True, "goodput": 0.5},
               "faults": [{"id": "k", "type": "rank_kill", "target": "rank 1",
                           "injected_t": 1.0, "undone_t": None, "details": {"pid": 3},
                           "error": None, "at_step": 12, "landed_after_step": 12},
                          {"id": "late", "type": "node_kill", "target": "node 1",
                           "injected_t": 2.0, "undone_t": None, "details": {},
                           "error": None, "at_step": 12, "landed_after_step": 13}],
               "experiment": {"name": "t", "description": "d", "file": "x.yaml", "seed": 0},
               "golden": None,
               "run": {"wall_s": 12.0, "job_dir": "/j", "timed_out": False},
               "environment": {"faultlab": "0", "torch": "2", "python": "3", "platform": "p",
                               "host": "h", "cpu_count": 2, "git_sha": None}}
    write_journal(tmp_path, journal)
    back = read_journal(tmp_path)
    assert back["schema_version"] == SCHEMA_VERSION and back["verdict"] == "fail"
    md = (tmp_path / "report.md").read_text()
    assert md == render_markdown(back)
    assert "# t: FAIL" in md and "| resume_time_s | 1.000 | 2.500 | **FAIL** |" in md
    # where each step-triggered fault met the job: at its step, or (a gate run past) later
    assert "| k | rank_kill | rank 1 |" in md and "| after step 12 | — |" in md
    assert "| after step 13 (at_step 12) |" in md
    (tmp_path / "report.md").unlink()
    assert cli_main(["report", str(tmp_path)]) == 1  # re-rendered; verdict fail → exit 1
    assert (tmp_path / "report.md").read_text() == md


def test_an_inconclusive_journal_renders_and_exits_3(tmp_path: Path, capsys: Any) -> None:
    """Nothing failed, but bitwise could not be measured (issue 53): the report says so above
    its table, the row reads INCONCLUSIVE, and ``faultlab report`` exits 3, not 0 nor 1."""
    from faultlab.cli import EXIT_INCONCLUSIVE, exit_code
    from faultlab.judge.verdict import SLAResult, combine, verdict_of

    rows = [SLAResult("completes", True, True, True),
            SLAResult("bitwise_equal_to_golden", True, None, False,
                      "not measured: two fault-free runs differ; add X", inconclusive=True)]
    assert verdict_of(rows) == "inconclusive"
    journal = {"verdict": verdict_of(rows), "slas": [r.to_dict() for r in rows],
               "metrics": {"completes": True}, "faults": [],
               "experiment": {"name": "t", "description": "", "file": "x.yaml", "seed": 0},
               "golden": None, "run": {"wall_s": 12.0, "job_dir": "/j", "timed_out": False},
               "environment": {"faultlab": "0", "torch": "2", "python": "3", "platform": "p",
                               "host": "h", "cpu_count": 2, "git_sha": None}}
    write_journal(tmp_path, journal)
    md = (tmp_path / "report.md").read_text()
    assert md.startswith("# t: INCONCLUSIVE")
    assert "**Inconclusive:** nothing failed, but bitwise_equal_to_golden could not be " \
           "measured: not a pass." in md
    assert "| bitwise_equal_to_golden | yes | not measured (not measured: two fault-free runs " \
           "differ; add X) | **INCONCLUSIVE** |" in md
    assert read_journal(tmp_path)["slas"][1]["result"] == "inconclusive"
    assert cli_main(["report", str(tmp_path)]) == EXIT_INCONCLUSIVE
    out = capsys.readouterr().out
    assert "INCONCLUSIVE bitwise_equal_to_golden: not measured: two fault-free runs differ; " \
           "add X" in out
    # the exit codes: one verdict, and many combined
    assert [exit_code(v) for v in ("pass", "fail", "inconclusive", "not run")] == [0, 1, 3, 1]
    assert [combine(v) for v in (["pass", "inconclusive"], ["inconclusive", "fail"], [],
                                 ["pass", "not run"], ["pass", "pass"])] == \
        ["inconclusive", "fail", "fail", "fail", "pass"]


def test_report_of_a_folder_without_journal_is_a_clear_error(tmp_path: Path,
                                                            capsys: Any) -> None:
    assert cli_main(["report", str(tmp_path)]) == 1
    assert "no journal.json" in capsys.readouterr().err


def test_validate_and_dry_run_inject_nothing(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "e.yaml"
    path.write_text(BASE + "faults:\n" + KILL + "expect:\n  completes: true\n")
    assert cli_main(["validate", str(path)]) == 0
    assert cli_main(["run", "--dry-run", str(path), "--report-dir", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "rank_kill" in out and "step 2" in out and "nothing was launched" in out
    assert not (tmp_path / "r").exists()


def test_invalid_experiment_exits_2_with_the_location(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "e.yaml"
    path.write_text(BASE.replace("steps: 40", "steps: forty"))
    assert cli_main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:5 run.steps" in err and "'forty'" in err


def test_list_faults_prints_every_builtin_with_its_params(capsys: Any) -> None:
    assert cli_main(["list", "faults"]) == 0
    out = capsys.readouterr().out
    for name in ("rank_kill", "node_kill", "rank_hang", "node_hang"):
        assert name in out
    assert "signal = 'KILL'" in out


# --- the guard that reaps a job when faultlab dies -------------------------------------------


def test_guard_continues_and_kills_the_job_when_its_parent_dies(tmp_path: Path) -> None:
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    psutil.Process(victim.pid).suspend()  # a frozen rank
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    pidfile = tmp_path / "pids.json"
    pidfile.write_text(json.dumps([victim.pid]))
    guard = subprocess.Popen([sys.executable, "-m", "faultlab.reaper", "--parent",
                              str(parent.pid), "--pidfile", str(pidfile), "--interval-s", "0.1"],
                             stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)
    assert victim.poll() is None  # parent alive: nothing happens
    parent.kill()
    parent.wait()
    assert guard.wait(timeout=20) == 0
    assert victim.wait(timeout=10) == -9
    assert "killed 1 process" in (guard.stderr.read() if guard.stderr else "")


@pytest.mark.parametrize(("fault", "records", "note"), [
    ("{id: k, type: rank_kill, target: {rank: 1}, trigger: {at_time_s: 12}}", [],
     "trigger never reached: the run ended at 7.3 s, before at_time_s 12 s (trigger earlier, "
     "or run longer)"),
    ("{id: k, type: rank_kill, target: {rank: 1}, trigger: {at_step: 10}}", [],
     "trigger never reached: the run ended at step 4, before at_step 10 (after 7.3 s)"),
    ("{id: k, type: rank_kill, target: {rank: 1}, trigger: {after_event: "
     "{kind: step, count: 5, match: {rank: 0}}}}", [],
     "trigger never reached: the run ended after 4 step events matching {'rank': 0}, before "
     "the 5th"),
    ("{id: k, type: rank_kill, target: {rank: 1}, trigger: {at_step: 2}}", [],
     "step 2 was reached but no injection was recorded: a fault planned in the ranks never "
     "reported striking (no fault_injected event for 'k'), or the job ended before faultlab "
     "could fire it"),
    ("{id: k, type: rank_kill, target: {rank: 1}, trigger: {at_time_s: 1}}",
     [FaultRecord(id="k", type="rank_kill", injected_t=1.0, details={"error": "no such rank"})],
     "the trigger fired but the injection failed: no such rank"),
])
def test_a_fault_that_never_fired_says_why(fault: str, records: list[FaultRecord],
                                           note: str) -> None:
    """The run of ``_run_events`` ended at step 4, 7.3 s after launch: a trigger it never
    reached is named as such, not "never fired or failed"."""
    exp = exp_with(f"  - {fault}\n", "  completes: true\n")
    events = _run_events()
    (injected,) = [s for s in judge(exp, compute_metrics(events, records), GOLDEN,
                                    timed_out=False, faults=records, events=events, job_s=7.3)
                   if s.name == "fault_injected[k]"]
    assert not injected.passed and injected.note == note
