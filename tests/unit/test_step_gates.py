"""Step gates (faultlab.runtime.gates): a fault injected from outside at step N meets a fast
user trainer at step N. The gate itself, the engine's side (which gates, when each opens) and a
bootstrapped process that really pauses after step N until the gate opens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from faultlab.engine.runtime_plan import RuntimeSetup
from faultlab.runtime.bootstrap import bootstrap_env
from faultlab.runtime.gates import GATE_TIMEOUT_ENV, GATES_ENV, StepGates, gate_path, open_gate
from faultlab.spec import load_experiment


def test_a_gate_waits_until_opened_then_stays_open(tmp_path: Path) -> None:
    gates = StepGates(tmp_path, [9], timeout_s=10)
    assert gates.wait(8) is None  # no gate there: no wait at all
    start = time.monotonic()  # before the timer: the waiter may start late under load
    threading.Timer(0.3, open_gate, (tmp_path, 9)).start()
    waited, opened = gates.wait(9)  # type: ignore[misc]
    assert opened and waited < 5 and time.monotonic() - start >= 0.3
    again = gates.wait(9)  # a replay of step 9 after a restart: no wait for the open gate
    assert again is not None and again[1] and again[0] < 1


def test_a_waiting_rank_keeps_beating_its_watchdog(tmp_path: Path) -> None:
    beats: list[float] = []
    threading.Timer(1.3, open_gate, (tmp_path, 4)).start()
    waited, opened = StepGates(tmp_path, [4], timeout_s=10).wait(  # type: ignore[misc]
        4, beat=lambda: beats.append(time.monotonic()))
    assert opened and 1 <= len(beats) <= waited / 0.5  # every half second at most


def test_a_level_2_trainer_waits_at_the_gate_through_its_runtime_agent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference trainer writes its own step records: ``rt.step_done(n)`` after each is
    where a fault injected from outside at step n meets it."""
    from faultlab import runtime
    from faultlab.runtime import interposer

    if not interposer.installed():  # attach installs it: put it back for the other tests
        monkeypatch.setattr(runtime, "install", lambda: False)
    for key in ("FAULTLAB_RUNTIME_PLAN", "FAULTLAB_RUNTIME_SECRET"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("FAULTLAB_RUN_DIR", str(tmp_path))
    monkeypatch.setenv(GATES_ENV, "7")
    monkeypatch.setenv(GATE_TIMEOUT_ENV, "10")
    rt = runtime.attach(None, None, emit=lambda kind, **fields: None)
    try:
        assert rt.step_done(6) == 0.0  # no gate at step 6
        start = time.monotonic()
        threading.Timer(0.1, open_gate, (tmp_path, 7)).start()
        assert rt.step_done(7) < 5 and time.monotonic() - start >= 0.1  # opened, not timed out
        assert rt.step_done(7) < 1  # a replayed step 7 passes the open gate
    finally:
        rt.close()
    monkeypatch.setenv(GATE_TIMEOUT_ENV, "0.3")
    monkeypatch.setenv(GATES_ENV, "8")
    rt = runtime.attach(None, None, emit=lambda kind, **fields: None)
    try:
        assert rt.step_done(8) >= 0.3  # never opened: passed after the timeout, never raises
    finally:
        rt.close()
    monkeypatch.setenv(GATES_ENV, "8,eight")
    with pytest.raises(ValueError, match=f"{GATES_ENV}='8,eight'"):
        runtime.attach(None, None)
    monkeypatch.delenv("FAULTLAB_RUN_DIR")
    assert runtime.attach(None, None).step_done(8) == 0.0  # outside faultlab: nothing


def test_a_gate_never_opened_is_passed_after_its_timeout(tmp_path: Path) -> None:
    waited, opened = StepGates(tmp_path, [3], timeout_s=0.2).wait(3)  # type: ignore[misc]
    assert not opened and waited >= 0.2


def test_gates_from_the_environment_and_a_malformed_variable(tmp_path: Path) -> None:
    gates = StepGates.from_env({"FAULTLAB_RUN_DIR": str(tmp_path), GATES_ENV: "9,10",
                                GATE_TIMEOUT_ENV: "5"})
    assert (gates.steps, gates.timeout_s, gates.run_dir) == ({9, 10}, 5.0, tmp_path)
    assert not StepGates.from_env({"FAULTLAB_RUN_DIR": str(tmp_path)}).steps
    with pytest.raises(ValueError, match=f"{GATES_ENV}='9,x'"):
        StepGates.from_env({"FAULTLAB_RUN_DIR": str(tmp_path), GATES_ENV: "9,x"})


EXPERIMENT = """
name: gated
target:
  command: [python, -c, "pass"]
topology: {nodes: 2, procs_per_node: 1, max_restarts: 1}
run: {steps: 16}
faults:
  - {id: rot, type: ckpt_bitflip, target: all, trigger: {at_step: 9}}
  - {id: kill, type: rank_kill, target: {rank: 1}, trigger: {at_step: 9}}
  - {id: later, type: rank_kill, target: {rank: 0}, trigger: {at_step: 12}}
  - {id: nan, type: grad_nan, target: {rank: 0}, trigger: {at_step: 5}}
  - {id: timed, type: rank_kill, target: {rank: 0}, trigger: {at_time_s: 3}}
"""


def test_the_engine_gates_each_step_of_a_fault_injected_from_outside(tmp_path: Path) -> None:
    (tmp_path / "gated.yaml").write_text(EXPERIMENT)
    setup = RuntimeSetup.create(load_experiment(tmp_path / "gated.yaml"), tmp_path / "job")
    # grad_nan is in the launch plan (step-exact in the rank), at_time_s has no step
    assert setup.gates == {9: [0, 1], 12: [2]}
    assert setup.env[GATES_ENV] == "9,12"
    assert setup.open_due_gates([1, 0, 0, 0, 0]) == []  # one of step 9's two faults fired
    assert setup.open_due_gates([1, 1, 0, 0, 0]) == [9]
    job = tmp_path / "job"
    assert gate_path(job, 9).exists() and not gate_path(job, 12).exists()
    assert setup.open_due_gates([1, 1, 0, 0, 0]) == []
    setup.open_all_gates()  # the run is over, whatever happened
    assert gate_path(job, 12).exists()


TRAINER = """
import time, torch
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(4):
    model(torch.ones(3, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
    print(time.time(), flush=True)
"""


def test_a_bootstrapped_trainer_pauses_after_the_gated_step(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTLAB_")}
    env.update({"FAULTLAB_RUN_DIR": str(tmp_path), "RANK": "0", "LOCAL_RANK": "0",
                "WORLD_SIZE": "1", GATES_ENV: "2", GATE_TIMEOUT_ENV: "60"})
    env.update(bootstrap_env(env))
    proc = subprocess.Popen([sys.executable, "-c", TRAINER], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        steps: list[dict[str, object]] = []
        while time.monotonic() < deadline and len(steps) < 2:
            time.sleep(0.05)
            steps = [json.loads(line) for p in (tmp_path / "events").glob("*.jsonl")
                     for line in p.read_text().splitlines() if '"kind":"step"' in line]
        assert [s["step"] for s in steps] == [1, 2]
        time.sleep(0.5)  # paused after step 2: no step 3 however long we wait
        assert proc.poll() is None
        assert len([line for p in (tmp_path / "events").glob("*.jsonl")
                    for line in p.read_text().splitlines() if '"kind":"step"' in line]) == 2
        t_open = time.time()
        open_gate(tmp_path, 2)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    printed = [float(line) for line in out.split()]
    assert len(printed) == 4 and printed[2] >= t_open and "faultlab bootstrap:" not in err


def test_the_journal_says_after_which_step_each_fault_landed(tmp_path: Path) -> None:
    """``landed_steps``: the step each fault triggered by step landed after, read from the
    ranks' records (what the real-job tests check against ``at_step``)."""
    from faultlab.engine.runner import landed_steps
    from faultlab.observe import FaultRecord, compute_metrics

    (tmp_path / "gated.yaml").write_text(EXPERIMENT)
    exp = load_experiment(tmp_path / "gated.yaml")
    steps = [{"t": 100.0 + n, "kind": "step", "step": n, "rank": r, "pid": 10 + r}
             for n in range(1, 16) for r in (0, 1)]
    faults = [FaultRecord(id="kill", type="rank_kill", injected_t=109.5),  # after step 9
              FaultRecord(id="later", type="rank_kill", injected_t=114.2),  # 2 steps late
              FaultRecord(id="timed", type="rank_kill", injected_t=103.0)]  # not by step
    landed = landed_steps(exp, compute_metrics(steps, faults))
    assert landed == {"kill": (9, 9), "later": (12, 14)}


def test_a_late_fault_fails_the_verdict_of_a_trainer_that_holds_the_gates(tmp_path: Path) -> None:
    """The guarantee as a check of the verdict: one ``fault_landed_at_step`` per fault gated
    by step, for the bundled trainers (they call ``rt.step_done``); a user's trainer, which
    may not, gets none (the run only notes a late fault)."""
    from faultlab.engine.runner import landed_checks

    (tmp_path / "gated.yaml").write_text(EXPERIMENT)
    user = load_experiment(tmp_path / "gated.yaml")
    landed = {"kill": (9, 9), "later": (12, 14), "nan": (5, 4)}
    assert landed_checks(user, landed, {"kill", "later"}) == []
    reference = user.model_copy(update={"target": user.target.model_copy(
        update={"command": None, "trainer": "reference"})})
    checks = landed_checks(reference, landed, {"kill", "later"})  # nan: in the launch plan
    assert [(c.name, c.bound, c.measured, c.passed) for c in checks] == [
        ("fault_landed_at_step[kill]", 9, 9, True), ("fault_landed_at_step[later]", 12, 14, False)]
    assert checks[1].describe() == ("fault_landed_at_step[later]: measured 14, required == 12 "
                                    "(landed after step 14: the ranks ran past the step gate "
                                    "at 12)")


@pytest.mark.parametrize("launcher", ["local", "docker", "slurm"])
def test_the_gates_reach_every_rank_on_every_target(launcher: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The ranks learn the gates from their environment and find the gate files under
    ``FAULTLAB_RUN_DIR``: a docker node gets both from its container's environment and the run
    directory bind-mounted read-write at the same path; a Slurm job from ``--export=ALL`` and
    the shared filesystem, where the engine opens the gates at the path the ranks read."""
    from faultlab.targets import make_target
    from faultlab.targets.docker.job import host_mounts

    monkeypatch.setenv("FAULTLAB_SLURM_SHARED", str(tmp_path / "shared"))
    (tmp_path / "x.yaml").write_text(f"""
name: x
target: {{trainer: reference, preset: tiny}}
topology: {{nodes: 2, launcher: {launcher}}}
faults: [{{type: node_kill, target: {{node: 1}}, trigger: {{at_step: 12}}}}]
""")
    exp = load_experiment(tmp_path / "x.yaml")
    job_dir = (tmp_path / "job").resolve()
    setup = RuntimeSetup.create(exp, job_dir)
    target = make_target(exp, job_dir, node_env={f"node{i}": dict(setup.env) for i in (0, 1)})
    if launcher == "slurm":
        env = target.job_environment()  # type: ignore[attr-defined]
    else:
        env = target.job.node_environment("node1")
    gates = StepGates.from_env(env)
    assert gates.steps == {12} and gates.run_dir == job_dir
    setup.open_due_gates([1])
    assert gates.wait(12) is not None and gates.wait(12)[1]  # type: ignore[index]
    if launcher == "docker":
        assert host_mounts(job_dir)[str(job_dir)] == {"bind": str(job_dir), "mode": "rw"}


def test_a_torn_write_is_not_held_at_a_gate(tmp_path: Path) -> None:
    """ckpt_torn_write waits for the next save to start: gating its step deadlocked the job
    (the ranks waited at the gate for the injection, the injection for their save) until its
    60 s wait ran out — ckpt_torn_write.yaml failed so in CI."""
    (tmp_path / "torn.yaml").write_text("""
name: torn
target: {trainer: reference, preset: tiny}
topology: {nodes: 2}
run: {steps: 30, checkpoint_every: 10}
faults:
  - {id: tear, type: ckpt_torn_write, target: all, trigger: {at_step: 19}}
  - {id: kill, type: rank_kill, target: {rank: 1}, trigger: {at_step: 25}}
""")
    setup = RuntimeSetup.create(load_experiment(tmp_path / "torn.yaml"), tmp_path / "job")
    assert setup.gates == {25: [1]}
