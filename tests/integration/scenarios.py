"""One runner for every integration scenario: launch a real local elastic job, break it, report.

A scenario is a config plus a fault plus what must come out. ``run_scenario`` launches the job
with faultlab's ``LocalJob`` launcher (real torchrun agents, real FSDP2 ranks), applies
the fault when its trigger is seen in the event stream, and returns the events. When an
assertion about the outcome fails, the test prints the exact agent command lines and the last
50 lines of every node's log (``explain``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faultlab.runtime.events import read_events
from faultlab.targets.launcher import JobResult, LocalJob
from reference_trainer.config import TrainConfig
from reference_trainer.plugin import command

JOB_TIMEOUT_S = 240


# --- what a test can do to a running job -----------------------------------------------------


Fault = Callable[[LocalJob, list[dict[str, Any]]], bool]
"""Called with the job and the events so far, about every 20 ms; returns True once it fired."""


def latest_start(events: list[dict[str, Any]], rank: int) -> dict[str, Any]:
    return [e for e in events if e["kind"] == "start" and e["rank"] == rank][-1]


def max_step(events: list[dict[str, Any]]) -> int:
    return max((e["step"] for e in events if e["kind"] == "step"), default=0)


def kill_rank(rank: int, after_step: int, sig: int = signal.SIGKILL) -> Fault:
    def fault(job: LocalJob, events: list[dict[str, Any]]) -> bool:
        if max_step(events) < after_step:
            return False
        os.kill(latest_start(events, rank)["pid"], sig)
        return True
    return fault


# --- what a job's events say ----------------------------------------------------------------


def committed_steps(events: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The trajectory that survived: for each step, rank 0's last record of it."""
    return {e["step"]: e for e in events if e["kind"] == "step" and e["rank"] == 0}


def losses(events: list[dict[str, Any]]) -> dict[int, float]:
    """Each step's loss on the trajectory that survived."""
    return {s: e["loss"] for s, e in committed_steps(events).items()}


# --- running ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    job: LocalJob
    result: JobResult
    events: list[dict[str, Any]]
    t_fault: float | None

    @property
    def run_dir(self) -> Path:
        return self.job.run_dir

    def of(self, kind: str, **match: Any) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"] == kind
                and all(e.get(k) == v for k, v in match.items())]

    def digest(self) -> str | None:
        found = self.of("final_digest")
        return found[-1]["digest"] if found else None

    def committed_steps(self) -> dict[int, dict[str, Any]]:
        return committed_steps(self.events)

    def losses(self) -> dict[int, float]:
        return losses(self.events)


@dataclass
class Scenario:
    name: str
    steps: int = 40
    nodes: int = 2
    procs_per_node: int = 1
    min_nodes: int | None = None
    max_restarts: int = 3
    train: dict[str, Any] = field(default_factory=dict)
    fault: Fault | None = None

    def config(self, run_dir: Path) -> TrainConfig:
        base: dict[str, Any] = dict(preset="tiny", steps=self.steps, checkpoint_every=10,
                                    seed=0, watchdog_s=60, pg_timeout_s=60)
        return TrainConfig(run_dir=run_dir, **{**base, **self.train})


def run_scenario(scenario: Scenario, run_dir: Path) -> Outcome:
    cfg = scenario.config(run_dir)
    job = LocalJob(command=command(cfg), run_dir=run_dir, nodes=scenario.nodes,
                   procs_per_node=scenario.procs_per_node, min_nodes=scenario.min_nodes,
                   max_restarts=scenario.max_restarts)
    t_fault = None
    with job:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while scenario.fault is not None and t_fault is None and not job.poll():
            if time.monotonic() > deadline:
                break
            if scenario.fault(job, read_events(run_dir / "events")):
                t_fault = time.time()
            time.sleep(0.02)
        try:
            result = job.wait(timeout_s=max(1.0, deadline - time.monotonic()))
        except TimeoutError:
            print(job.describe(), job.log_tail(), sep="\n")
            raise
    return Outcome(job=job, result=result, events=read_events(run_dir / "events"),
                   t_fault=t_fault)


@contextlib.contextmanager
def explain(*outcomes: Outcome) -> Iterator[None]:
    """On a failed assertion, print how to reproduce each run and the tail of its logs."""
    try:
        yield
    except AssertionError:
        for o in outcomes:
            print(f"=== run {o.run_dir} exit codes {o.result.returncodes}")
            print(o.job.describe())
            print(o.job.log_tail(50))
        raise


