"""Runs that several tests compare against or start from, each run once per session and shared
by the xdist workers.

Golden (fault-free) runs come from faultlab's golden-run cache (``faultlab.engine.golden``) in
the session's ``golden_cache`` folder: the CLI and suite tests' shipped experiments have the
same config (tiny, seed 0, 40 steps, a checkpoint every 10, 2 nodes of 1 rank), so one run of
that job serves them and the trainer's tests alike. A job that stops itself (``stop_after``)
is run by the first worker to need it, under a file lock, and copied for each test, which then
resumes or damages its own copy.
"""

from __future__ import annotations

import fcntl
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from scenarios import JOB_TIMEOUT_S, Outcome, Scenario, explain, run_scenario

from faultlab.engine.golden import golden_run
from faultlab.runtime.events import read_events
from faultlab.spec import experiment_from_dict
from faultlab.targets.launcher import JobResult, LocalJob
from reference_trainer.plugin import command


def _finished(scenario: Scenario, run_dir: Path, wall_s: float) -> Outcome:
    """The outcome of a run that has already ended, read back from its folder."""
    job = LocalJob(command=command(scenario.config(run_dir)), run_dir=run_dir,
                   nodes=scenario.nodes, procs_per_node=scenario.procs_per_node,
                   min_nodes=scenario.min_nodes)
    return Outcome(job=job, result=JobResult({}, set(), wall_s),
                   events=read_events(run_dir / "events"), t_fault=None)


@pytest.fixture(scope="session")
def golden(golden_cache: Path) -> Callable[[Scenario], Outcome]:
    def get(scenario: Scenario) -> Outcome:
        assert scenario.fault is None, "a golden run has no fault"
        config = scenario.config(Path("unused"))  # the scenarios' preset, seed, interval
        exp = experiment_from_dict({
            "name": scenario.name, "seed": config.seed,
            # faultlab leaves settings that change no bit (watchdog, async saving) out of the key
            "target": {"trainer": "reference", "preset": config.preset,
                       "overrides": dict(scenario.train)},
            "topology": {"nodes": scenario.nodes, "procs_per_node": scenario.procs_per_node,
                         "min_nodes": scenario.min_nodes},
            "run": {"steps": scenario.steps, "checkpoint_every": config.checkpoint_every,
                    "timeout_s": JOB_TIMEOUT_S}})
        run = golden_run(exp, golden_cache, timeout_s=JOB_TIMEOUT_S)
        assert run.digest, f"golden run failed; logs in {run.run_dir}/logs"
        return _finished(scenario, Path(run.run_dir), run.wall_s)

    return get


@pytest.fixture(scope="session")
def stopped_run(session_tmp: Path) -> Callable[[Scenario, Path], Outcome]:
    """``stopped_run(scenario, run_dir)``: a copy, in ``run_dir``, of the run of ``scenario``
    (which must stop itself cleanly: ``train={"stop_after": N}``)."""
    shared = session_tmp / "stopped-runs"
    shared.mkdir(exist_ok=True)

    def get(scenario: Scenario, run_dir: Path) -> Outcome:
        assert scenario.fault is None and scenario.train.get("stop_after")
        source = shared / scenario.name
        with open(shared / f"{scenario.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (shared / f"{scenario.name}.ok").exists():
                shutil.rmtree(source, ignore_errors=True)
                outcome = run_scenario(scenario, source)
                with explain(outcome):
                    assert outcome.result.ok, f"{scenario.name} failed"
                    assert {e["reason"] for e in outcome.of("exit")} == {"stopped"}
                (shared / f"{scenario.name}.ok").touch()
        shutil.copytree(source, run_dir, dirs_exist_ok=True)
        return _finished(scenario, run_dir, 0.0)

    return get
