"""chaosfaultlab without a training job: discovery, argument errors, the attach target's
ownership rules, the fault journal and rollbacks, and the probes on recorded event streams.

The attach tests stand up a fake job from plain processes: an "agent" whose command line
carries the job's rendezvous id (what ``AttachedTarget`` checks against pid reuse) and a
"worker" child of it, described by a ``launch.json`` and a ``start`` event like a real job's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import chaosfaultlab
import psutil
import pytest
from chaosfaultlab import _jobs, _undo, actions, control, probes
from chaosfaultlab._state import ActionLog
from chaoslib.exceptions import InvalidActivity

from faultlab.errors import FaultError, TargetError
from faultlab.faults import fault_types
from faultlab.targets.attach import AttachedTarget
from faultlab.targets.base import JobContext
from faultlab.targets.local import LocalTarget

# --- discovery --------------------------------------------------------------------------------


def test_discover_lists_exactly_the_exported_activities() -> None:
    d = chaosfaultlab.discover(discover_system=False)
    json.dumps(d)  # what `chaos discover` writes must be JSON
    assert d["extension"] == {"name": "chaosfaultlab", "version": chaosfaultlab.__version__}
    by_type = {(a["type"], a["name"]) for a in d["activities"]}
    assert by_type == ({("action", n) for n in actions.__all__}
                       | {("probe", n) for n in probes.__all__})
    assert d["system"] is None
    args = {a["name"]: {x["name"]: x for x in a["arguments"]} for a in d["activities"]}
    assert list(args["inject_fault"])[:4] == ["fault_type", "target", "params", "run_dir"]
    assert args["recovered_within"]["seconds"]["type"] == "number"
    assert args["recovered_within"]["cold_starts"]["type"] == "number"
    assert args["kill_rank"]["signal"]["default"] == "KILL"
    for activity in d["activities"]:
        assert activity["doc"], f"{activity['name']} has no docstring"


def test_discover_system_lists_the_installed_fault_types() -> None:
    system = chaosfaultlab.discover()["system"]
    assert set(system["fault_types"]) >= {"rank_kill", "node_kill", "rank_hang", "node_hang"}
    assert system["fault_types"]["rank_hang"]["reversible"] is True


def test_every_fault_shortcut_reaches_an_installed_fault() -> None:
    installed = fault_types()
    for fault_type in ("grad_nan", "grad_inf", "collective_delay", "collective_partition",
                       "ckpt_bitflip", "ckpt_truncate", "ckpt_zero_range", "ckpt_delete_shard",
                       "ckpt_stale_pointer", "spot_preemption"):
        assert fault_type in installed
    for shortcut in ("inject_nan", "delay_collectives", "partition_collectives",
                     "corrupt_checkpoint", "send_spot_notice"):
        assert shortcut in actions.__all__


def test_public_names_are_all() -> None:
    for mod in (chaosfaultlab, actions, probes, control):
        for name in mod.__all__:
            assert getattr(mod, name) is not None, (mod.__name__, name)


def test_targets_share_the_job_context() -> None:
    assert issubclass(LocalTarget, JobContext) and issubclass(AttachedTarget, JobContext)


# --- argument errors --------------------------------------------------------------------------

@pytest.mark.parametrize(("call", "expected"), [
    (lambda: actions.inject_fault("nan_inject", {"rank": 0}),
     f"fault_type: 'nan_inject' is not an installed faultlab fault type; installed: "
     f"{', '.join(fault_types())} (see `faultlab list faults`)"),
    (lambda: actions.inject_fault("rank_kill", "rank:1"),
     'target: expected {"rank": N}, {"node": N} (index or name, e.g. "node1") or "all", '
     "got 'rank:1'"),
    (lambda: actions.inject_fault("rank_kill", {"rank": -1}),
     "target: rank must be an integer >= 0, got -1"),
    (lambda: actions.inject_fault("rank_kill", {"gpu": 0}), "target: unknown key 'gpu'"),
    (lambda: actions.inject_fault("rank_kill", {"node": 1}),
     "target: rank_kill cannot hit 'node'; it takes {\"rank\": N} or \"all\""),
    (lambda: actions.inject_fault("rank_kill", {"rank": 1}, {"signal": "HUP"}),
     "rank_kill: params.signal: Input should be 'KILL', 'TERM', 'SEGV' or 'ABRT' (got 'HUP'); "
     "its parameters are: signal"),
    (lambda: actions.inject_fault("rank_hang", {"rank": 1}, {"seconds": 3}),
     "rank_hang: params.seconds: Extra inputs are not permitted"),
    (lambda: actions.inject_fault("rank_kill", {"rank": 1}, duration_s=5),
     "duration_s: rank_kill cannot be undone, so it takes no duration"),
    (lambda: actions.kill_rank(1, after_step=-3), "after_step: expected an integer >= 0, got -3"),
    (lambda: actions.kill_rank(1), "run_dir: missing; pass the job's run directory"),
    (lambda: actions.kill_rank(1, run_dir="${faultlab_run_dir}"),
     "run_dir: '${faultlab_run_dir}' was not substituted: no run context set"),
    (lambda: actions.kill_rank(1, run_dir="/nonexistent/run"),
     "run_dir: '/nonexistent/run' is not a directory"),
    (lambda: probes.recovered_within(-1, run_dir="/tmp"),
     "seconds: expected a number of seconds >= 0, got -1"),
    (lambda: actions.start_training("x.yaml", steps=5),
     "experiment_file: 'x.yaml' defines the job; leave out steps"),
    (lambda: actions.start_training(nodes=0),
     "the training job is invalid: <experiment> topology.nodes"),
])
def test_argument_errors_say_what_and_how(call: Any, expected: str) -> None:
    with pytest.raises((FaultError, TargetError)) as e:
        call()
    assert expected in str(e.value)


def test_run_dir_comes_from_the_run_context_configuration(tmp_path: Path) -> None:
    # No launch.json: the directory is found, the job is not (a clear TargetError).
    with pytest.raises(TargetError, match="launch.json does not exist"):
        actions.continue_all(configuration={"faultlab_run_dir": str(tmp_path)})


def test_control_arguments_are_validated_with_the_experiment() -> None:
    def ctl(**arguments: Any) -> dict[str, Any]:
        return {"name": "run", "provider": {"type": "python", "module": "chaosfaultlab.control",
                                            "arguments": arguments}}

    control.validate_control(ctl(preset="tiny", steps=30))
    with pytest.raises(InvalidActivity, match="unknown argument 'step'; the faultlab run "
                                              "context takes: experiment_file, preset"):
        control.validate_control(ctl(step=30))
    with pytest.raises(InvalidActivity, match="attaches to a running job; leave out preset"):
        control.validate_control(ctl(attach_run_dir="/x", preset="tiny"))
    with pytest.raises(InvalidActivity, match="ready_step: expected an integer >= 0, got -1"):
        control.validate_control(ctl(ready_step=-1))


# --- a fake running job -----------------------------------------------------------------------

_SLEEPER = "import sys, time; time.sleep(120)"


@pytest.fixture
def fake_job(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A run directory whose 'agent' (python, rendezvous id on its command line) has one
    'worker' child; rank 0 is that worker according to the events."""
    run_dir = tmp_path / "job"
    (run_dir / "events").mkdir(parents=True)
    spawn = (f"import subprocess, sys, time; "
             f"p = subprocess.Popen([sys.executable, '-c', {_SLEEPER!r}]); "
             f"print(p.pid, flush=True); time.sleep(120)")
    agent = subprocess.Popen([sys.executable, "-c", spawn, "--rdzv-id", "faultlab-job"],
                             stdout=subprocess.PIPE, text=True)
    assert agent.stdout is not None
    worker = int(agent.stdout.readline())
    (run_dir / "launch.json").write_text(json.dumps({
        "rdzv_endpoint": "127.0.0.1:1", "store_pid": None, "started_t": time.time() + 1,
        "nodes": [{"node": "node0", "agent_pid": agent.pid, "log": "x"}]}))
    now = time.time()
    events = [{"t": now, "kind": "start", "rank": 0, "world_size": 1, "pid": worker,
               "restart": 0, "node": "node0", "resumed_from_step": 0},
              {"t": now + 0.1, "kind": "step", "rank": 0, "world_size": 1, "pid": worker,
               "restart": 0, "node": "node0", "step": 1}]
    (run_dir / "events" / "rank0.jsonl").write_text("".join(json.dumps(e) + "\n"
                                                            for e in events))
    try:
        yield {"run_dir": run_dir, "agent": agent.pid, "worker": worker}
    finally:
        for pid in (worker, agent.pid):
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        agent.wait()


def _stopped(pid: int, expected: bool = True) -> bool:
    """Whether ``pid`` is stopped, waiting a little for a signal's delivery to show."""
    deadline = time.monotonic() + 5
    while (psutil.Process(pid).status() == psutil.STATUS_STOPPED) != expected:
        if time.monotonic() > deadline:
            return not expected
        time.sleep(0.02)
    return expected


def test_attached_target_owns_exactly_the_job(fake_job: dict[str, Any]) -> None:
    target = AttachedTarget(fake_job["run_dir"])
    assert target.node_names() == ["node0"]
    assert target.ranks() == [0] and target.rank_pid(0) == fake_job["worker"]
    assert target.node_of_rank(0) == "node0"
    assert set(target.node_pids("node0")) == {fake_job["agent"], fake_job["worker"]}
    assert target.pids() == {fake_job["agent"], fake_job["worker"]} and target.running()
    target.assert_owned(fake_job["worker"])
    with pytest.raises(FaultError, match=f"process {os.getpid()} is not part of the job"):
        target.assert_owned(os.getpid())
    with pytest.raises(FaultError, match="no node 'node7' in the job"):
        target.node_pids("node7")


def test_attached_target_ignores_a_reused_pid(fake_job: dict[str, Any]) -> None:
    # launch.json names this test process as the agent: it lacks the job's rendezvous id.
    info = json.loads((fake_job["run_dir"] / "launch.json").read_text())
    info["nodes"][0]["agent_pid"] = os.getpid()
    (fake_job["run_dir"] / "launch.json").write_text(json.dumps(info))
    target = AttachedTarget(fake_job["run_dir"])
    assert target.pids() == set() and not target.running()
    assert target.kill_node("node0", signal.SIGCONT) == []
    with pytest.raises(FaultError, match="is not part of the job"):
        target.assert_owned(os.getpid())


def test_attach_needs_a_launch_file(tmp_path: Path) -> None:
    with pytest.raises(TargetError, match="launch.json does not exist"):
        AttachedTarget(tmp_path)
    (tmp_path / "launch.json").write_text('{"nodes": 3}')
    with pytest.raises(TargetError, match=r"expected 'nodes': \[\{node, agent_pid, log\}"):
        AttachedTarget(tmp_path)


def test_hang_is_undone_by_a_rollback_in_another_process(fake_job: dict[str, Any]) -> None:
    run_dir, worker = fake_job["run_dir"], fake_job["worker"]
    done = actions.hang_rank(0, run_dir=str(run_dir))
    assert done["id"] == "rank_hang-1" and done["details"]["pids"] == [worker]
    assert _stopped(worker)
    [active] = ActionLog(run_dir).active()
    assert active.id == "rank_hang-1" and active.details["pids"] == [worker]
    _undo._LIVE.clear()  # what a later `chaos` process knows: only the run directory
    assert actions.undo_faults(str(run_dir)) == {"undone": ["rank_hang-1"], "errors": {}}
    assert not _stopped(worker, False)
    assert ActionLog(run_dir).active() == []
    assert actions.undo_faults(str(run_dir)) == {"undone": [], "errors": {}}  # idempotent


def test_hang_with_a_duration_is_undone_in_time(fake_job: dict[str, Any]) -> None:
    # long enough to see the stop under load: a SIGCONT before the stop shows would hide it
    actions.hang_node("node0", run_dir=str(fake_job["run_dir"]), duration_s=2)
    assert _stopped(fake_job["agent"])
    deadline = time.monotonic() + 10
    while ActionLog(fake_job["run_dir"]).active() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ActionLog(fake_job["run_dir"]).active() == []
    assert not _stopped(fake_job["agent"], False)
    assert not _stopped(fake_job["worker"], False)


def test_a_victim_that_never_starts_is_a_clear_error(fake_job: dict[str, Any]) -> None:
    with pytest.raises(FaultError, match="still runs after 0.3 s at step 1 with ranks \\[0\\]; "
                                         "the fault needed step >= 5"):
        actions.kill_rank(0, run_dir=str(fake_job["run_dir"]), after_step=5, timeout_s=0.3)
    with pytest.raises(FaultError, match="node 3 does not exist; the job has 1 nodes"):
        actions.kill_node(3, run_dir=str(fake_job["run_dir"]))


# --- the fault journal ------------------------------------------------------------------------

def test_action_log_round_trip(tmp_path: Path) -> None:
    log = ActionLog(tmp_path)
    a = log.begin("rank_hang", "rank 1", True, 10.0)
    log.injected(a, "rank_hang", "rank 1", True, 10.5, {"pids": [42]})
    b = log.begin("rank_kill", "rank 0", False, 11.0)
    log.injected(b, "rank_kill", "rank 0", False, 11.5, {"pids_by_rank": {"0": 7}})
    c = log.begin("node_hang", "node 0", True, 12.0)  # the injector died right here
    with open(log.path, "a") as f:
        f.write('{"event": "undone", "id": "rank_ha')  # a torn line
    assert (a, b, c) == ("rank_hang-1", "rank_kill-2", "node_hang-3")
    again = ActionLog(tmp_path)  # as a later process reads it
    assert [f.id for f in again.active()] == [a, c]
    last = again.last_injected()
    assert last is not None and (last.id, last.injected_t) == (b, 11.5)
    again.undone(a, 13.0, {"continued": [42]})
    assert [f.id for f in again.active()] == [c]
    [state] = [f for f in again.faults() if f.id == a]
    assert state.undone_t == 13.0 and state.details == {"pids": [42]}


# --- probes on recorded events ----------------------------------------------------------------

def _write_run(run_dir: Path, events: list[dict[str, Any]]) -> None:
    (run_dir / "events").mkdir(parents=True, exist_ok=True)
    with open(run_dir / "events" / "all.jsonl", "w") as f:
        for e in events:
            f.write(json.dumps({"world_size": 2, "restart": 0, "node": "node0", **e}) + "\n")


def _killed_and_recovered(run_dir: Path, back_after_s: float) -> float:
    """Steps 1..15, rank 1 killed at T, a new group resumes from 10 and is at 15 at T+back."""
    T = 1000.0
    ev: list[dict[str, Any]] = []
    for rank, pid in ((0, 1), (1, 2)):
        ev.append({"t": 900.0, "kind": "start", "rank": rank, "pid": pid, "resumed_from_step": 0})
        ev += [{"t": 900.0 + s, "kind": "step", "rank": rank, "pid": pid, "step": s}
               for s in range(1, 16)]
    ev.append({"t": T + 0.1, "kind": "exit", "rank": 0, "pid": 1, "reason": "error"})
    for rank, pid in ((0, 3), (1, 4)):
        ev.append({"t": T + 2, "kind": "start", "rank": rank, "pid": pid,
                   "resumed_from_step": 10, "restart": 1})
        ev += [{"t": T + back_after_s - (15 - s) * 0.1, "kind": "step", "rank": rank,
                "pid": pid, "step": s} for s in range(11, 16)]
    _write_run(run_dir, ev)
    log = ActionLog(run_dir)
    fid = log.begin("rank_kill", "rank 1", False, T)
    log.injected(fid, "rank_kill", "rank 1", False, T, {"pids_by_rank": {"1": 2}})
    return T


def test_recovered_within_uses_faultlabs_recovery_time(tmp_path: Path) -> None:
    assert probes.recovered_within(0.01, run_dir=str(tmp_path))  # no fault: nothing to recover
    _killed_and_recovered(tmp_path, back_after_s=6.0)
    assert probes.recovered_within(30, run_dir=str(tmp_path))
    assert probes.recovered_within(6.0, run_dir=str(tmp_path))
    t0 = time.monotonic()
    assert not probes.recovered_within(5.9, run_dir=str(tmp_path))
    assert time.monotonic() - t0 < 5  # the job is not running: no waiting for a deadline
    assert probes.current_step(run_dir=str(tmp_path)) == 15


def test_a_window_in_cold_starts_is_the_launched_jobs_own(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """recovered_within(cold_starts=k): k times the job's launch to its first step, which this
    process knows of a job it launched; of any other job it is refused, never guessed."""
    T = _killed_and_recovered(tmp_path, back_after_s=6.0)
    with pytest.raises(TargetError, match="the cold start of the job in .* is not known"):
        probes.recovered_within(run_dir=str(tmp_path), cold_starts=10)
    first_step = min(e["t"] for e in probes._events(tmp_path) if e["kind"] == "step")
    session = SimpleNamespace(launched_t=first_step - 2.0)  # a cold start of 2 s
    monkeypatch.setattr(_jobs, "launched", lambda path: SimpleNamespace(session=session))
    monkeypatch.setattr(_jobs, "job_running", lambda path: False)
    assert _jobs.cold_start_s(tmp_path) == pytest.approx(2.0)
    assert probes.recovered_within(run_dir=str(tmp_path), cold_starts=3)  # 6 s <= 6 s
    assert not probes.recovered_within(run_dir=str(tmp_path), cold_starts=2.9)
    assert not probes.recovered_within(30, run_dir=str(tmp_path), cold_starts=2.9)  # replaced
    with pytest.raises(TargetError, match="recovered_within: give seconds, or cold_starts"):
        probes.recovered_within(run_dir=str(tmp_path))
    assert T > first_step


def test_progress_and_completion_of_a_finished_job(tmp_path: Path) -> None:
    _write_run(tmp_path, [
        {"t": 1.0, "kind": "start", "rank": 0, "pid": 1, "resumed_from_step": 0},
        {"t": 2.0, "kind": "step", "rank": 0, "pid": 1, "step": 1},
        {"t": 3.0, "kind": "final_digest", "rank": 0, "pid": 1, "digest": "abc"},
        {"t": 3.1, "kind": "exit", "rank": 0, "pid": 1, "reason": "completed"}])
    assert probes.training_is_progressing(run_dir=str(tmp_path), within_s=5)
    assert probes.wait_for_completion(run_dir=str(tmp_path), timeout_s=5)
    assert probes.final_digest_matches_golden(run_dir=str(tmp_path), golden_digest="abc")
    assert not probes.final_digest_matches_golden(run_dir=str(tmp_path), golden_digest="abd")
    assert not probes.latest_checkpoint_valid(run_dir=str(tmp_path))  # there is none


def test_a_trainer_that_is_not_reproducible_answers_inconclusive(tmp_path: Path) -> None:
    """Two fault-free runs of the golden experiment differ: no digest of the job can match
    them, and the probe says so with a value a tolerance tells from true and false."""
    from faultlab.engine.golden import golden_cache_dir, golden_key
    from faultlab.spec import load_experiment

    exp_file = tmp_path / "exp.yaml"
    exp_file.write_text("name: g\ngolden: {runs: 2}\nexpect: {bitwise_equal_to_golden: true}\n")
    exp = load_experiment(exp_file)
    cache = golden_cache_dir(exp, tmp_path / "golden")
    cache.mkdir(parents=True)
    entry = {"digest": "abc", "losses": {"1": 2.0}, "wall_s": 1.0, "run_dir": str(tmp_path),
             "checkpoints_outside": [], "second": {"digest": "abd", "losses": {"1": 2.1}}}
    (cache / f"{golden_key(exp)}.json").write_text(json.dumps(entry))
    run_dir = tmp_path / "run"
    _write_run(run_dir, [
        {"t": 1.0, "kind": "start", "rank": 0, "pid": 1, "resumed_from_step": 0},
        {"t": 3.0, "kind": "final_digest", "rank": 0, "pid": 1, "digest": "abc"},
        {"t": 3.1, "kind": "exit", "rank": 0, "pid": 1, "reason": "completed"}])
    answer = probes.final_digest_matches_golden(run_dir=str(run_dir),
                                                golden_experiment=str(exp_file),
                                                golden_cache_dir=str(tmp_path / "golden"))
    assert answer == probes.INCONCLUSIVE == "inconclusive"
    assert answer is not True and answer is not False
    # the same job against the given digest: judged bit for bit
    assert probes.final_digest_matches_golden(run_dir=str(run_dir), golden_digest="abc") is True


def test_a_stalled_job_is_not_progressing(tmp_path: Path) -> None:
    _write_run(tmp_path, [{"t": 1.0, "kind": "start", "rank": 0, "pid": 1,
                           "resumed_from_step": 0},
                          {"t": 2.0, "kind": "step", "rank": 0, "pid": 1, "step": 1}])
    assert not probes.training_is_progressing(run_dir=str(tmp_path), within_s=0.2)
    assert not probes.wait_for_completion(run_dir=str(tmp_path), timeout_s=0.2)
    with pytest.raises(TargetError, match="was not launched by chaosfaultlab, so its golden "
                                          "run is unknown; pass golden_digest"):
        probes.final_digest_matches_golden(run_dir=str(tmp_path))


# --- in-rank and cloud shortcuts ---------------------------------------------------------------

def test_send_spot_notice_drives_a_standalone_metadata_endpoint() -> None:
    from chaosfaultlab.actions import send_spot_notice

    from faultlab.errors import FaultError
    from faultlab.metadata import MetadataServer

    with MetadataServer("aws") as md:
        answer = send_spot_notice(md.url, md.control_token, notice_s=90)
        assert answer["deadline"] == pytest.approx(time.time() + 90, abs=2)
        assert md.state()["preemption"]["deadline"] == answer["deadline"]
        with pytest.raises(FaultError, match="HTTP 401"):
            send_spot_notice(md.url, "wrong-token")
    with pytest.raises(FaultError, match="cannot reach"):
        send_spot_notice(md.url, md.control_token)  # stopped


def test_shortcut_arguments_are_checked_before_anything_runs(tmp_path: Path) -> None:
    from chaosfaultlab.actions import delay_collectives, inject_nan

    from faultlab.errors import FaultError

    with pytest.raises(FaultError, match="value: 'zero'"):
        inject_nan(0, run_dir=str(tmp_path), value="zero")
    with pytest.raises(FaultError, match="delay_ms"):
        delay_collectives(0, delay_ms=-5, run_dir=str(tmp_path))
    with pytest.raises(FaultError, match="kind: 'melt'"):
        actions.corrupt_checkpoint(str(tmp_path), kind="melt")
