"""Golden (fault-free) runs, cached per session across xdist workers: the first worker to need
one runs it under a file lock, the others reuse its events."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Callable

import pytest
from scenarios import Outcome, Scenario, explain, run_scenario

from reference_trainer.events import read_events
from reference_trainer.launch import JobResult, LocalJob

# Settings that change how a run is operated but not one bit of what it computes.
NUMERICS_NEUTRAL = {"async_checkpoint", "keep_checkpoints", "watchdog_s", "pg_timeout_s",
                    "min_step_time_s"}


@pytest.fixture(scope="session")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Scenario], Outcome]:
    # Under xdist each worker's basetemp is <session>/popen-gwN: share the session's folder.
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "golden-runs"
    shared.mkdir(exist_ok=True)

    def get(scenario: Scenario) -> Outcome:
        assert scenario.fault is None, "a golden run has no fault"
        numerics = {k: v for k, v in scenario.train.items() if k not in NUMERICS_NEUTRAL}
        key = hashlib.sha256(json.dumps(
            [scenario.steps, scenario.nodes, scenario.procs_per_node, numerics],
            sort_keys=True).encode()).hexdigest()[:16]
        run_dir = shared / key
        with open(shared / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (shared / f"{key}.ok").exists():
                shutil.rmtree(run_dir, ignore_errors=True)
                outcome = run_scenario(scenario, run_dir)
                with explain(outcome):
                    assert outcome.result.ok and outcome.digest(), "golden run failed"
                (shared / f"{key}.ok").touch()
                return outcome
        job = LocalJob(cfg=scenario.config(run_dir), nodes=scenario.nodes,
                       procs_per_node=scenario.procs_per_node)
        return Outcome(job=job, result=JobResult({}, set(), 0.0),
                       events=read_events(run_dir / "events"), t_fault=None)

    return get
