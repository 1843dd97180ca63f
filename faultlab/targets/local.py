"""The local target: the job's nodes are torchrun agents on this host.

It launches the reference trainer or a user's command through ``reference_trainer.launch``'s
``LocalJob`` (its own rendezvous store, one agent per node, every process reaped on stop) and
implements the ``FaultContext`` that faults act through (``targets.base.JobContext``): ranks are
mapped to processes from the job's own ``start`` events, and nothing outside the job's process
tree is ever signalled.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from faultlab.errors import FaultError, TargetError
from faultlab.observe import EventStream
from faultlab.spec import Experiment
from faultlab.targets.base import JobContext
from reference_trainer.config import ConfigError, TrainConfig
from reference_trainer.launch import JobResult, LaunchError, LocalJob

__all__ = ["LocalTarget", "make_target", "train_config"]

_DEVICE_FOR_BACKEND = {"auto": "auto", "gloo": "cpu", "nccl": "cuda"}


def train_config(exp: Experiment, run_dir: Path) -> TrainConfig:
    """The reference trainer's config for an experiment."""
    t = exp.target
    kwargs: dict[str, Any] = {
        "preset": t.preset, "steps": exp.run.steps, "checkpoint_every": exp.run.checkpoint_every,
        "seed": exp.seed, "device": _DEVICE_FOR_BACKEND[exp.topology.backend],
        **dict(t.overrides or {}),
    }
    try:
        return TrainConfig(run_dir=run_dir, **kwargs)
    except ConfigError as e:  # the spec validated overrides; this is a last line of defence
        raise TargetError(f"target.overrides: {e}") from None


class LocalTarget(JobContext):
    """One launch of an experiment's job on this host (the engine polls ``stream``)."""

    job_class: type[LocalJob] = LocalJob

    def __init__(self, exp: Experiment, run_dir: Path,
                 node_env: dict[str, dict[str, str]] | None = None) -> None:
        self.exp = exp
        self.run_dir = run_dir
        self.seed = exp.seed
        topo = exp.topology
        common = dict(nodes=topo.nodes, procs_per_node=topo.procs_per_node,
                      min_nodes=topo.min_nodes, max_restarts=topo.max_restarts,
                      node_env=node_env or {})
        try:
            if exp.target.command:
                self.job = self.job_class(command=list(exp.target.command), run_dir_=run_dir,
                                          **common)  # type: ignore[arg-type]
            else:
                self.job = self.job_class(cfg=train_config(exp, run_dir),
                                          **common)  # type: ignore[arg-type]
        except LaunchError as e:
            raise TargetError(str(e)) from None
        self.stream = EventStream(run_dir / "events")

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        (self.run_dir / "events").mkdir(parents=True, exist_ok=True)
        try:
            self.job.start()
        except LaunchError as e:
            raise TargetError(str(e)) from None

    def finished(self) -> bool:
        return self.job.poll()

    def result(self) -> JobResult:
        return self.job.result()

    def stop(self) -> None:
        self.job.stop()

    def describe(self) -> str:
        return self.job.describe()

    # -- FaultContext (the rest is JobContext's) ----------------------------------------------

    def agent_pids(self) -> dict[str, int]:
        return {name: self.job.agent_pid(name) for name in self.job.node_names()}

    def node_names(self) -> list[str]:
        return self.job.node_names()

    def kill_node(self, node: str, sig: int) -> list[int]:
        # Through the job, so that the node's exit code is not held against the result.
        return self.job.kill_node(node, sig)

    def pids(self) -> set[int]:
        return self.job.pids()

    def restart_node(self, node: str) -> int:
        try:
            return self.job.restart_node(node)
        except (LaunchError, KeyError) as e:
            raise FaultError(str(e)) from None

    def mark_lost(self, node: str) -> None:
        try:
            self.job.mark_lost(node)
        except KeyError as e:
            raise FaultError(str(e)) from None


def make_target(exp: Experiment, run_dir: Path,
                node_env: dict[str, dict[str, str]] | None = None) -> LocalTarget:
    """The target ``topology.launcher`` asks for."""
    if exp.topology.launcher == "docker":
        from faultlab.targets.docker import DockerTarget

        return DockerTarget(exp, run_dir, node_env=node_env)
    return LocalTarget(exp, run_dir, node_env=node_env)
