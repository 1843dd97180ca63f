"""The local target: the job's nodes are torchrun agents on this host.

It launches a registered trainer (``target.trainer``, e.g. the reference trainer, whose command
line its plugin builds) or a user's command (``target.command``) through the launcher
(``faultlab.targets.launcher.LocalJob``: its own rendezvous store, one agent per node, every
process reaped on stop) and implements the rest of ``Target`` through ``JobContext``: ranks are
mapped to processes from the job's own ``start`` events, and nothing outside the job's process
tree is ever signalled.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any, ClassVar

from faultlab.errors import FaultError, TargetError
from faultlab.observe import EventStream
from faultlab.runtime.bootstrap import bootstrap_env
from faultlab.spec import Experiment
from faultlab.spec.launch_check import Problems, line_problems
from faultlab.spec.target import PYTHON_NAMES, TargetSpec, Topology
from faultlab.spec.trainers import config_settings, get_trainer
from faultlab.targets.base import JobContext
from faultlab.targets.launcher import JobResult, LaunchError, LocalJob, rank_threads

__all__ = ["RUN_DIR_PLACEHOLDER", "LocalTarget", "job_command", "train_config"]

_DEVICE_FOR_BACKEND = {"auto": "auto", "gloo": "cpu", "nccl": "cuda"}


def train_config(exp: Experiment, run_dir: Path) -> Any:
    """The registered trainer's config for an experiment (``target.trainer``)."""
    t = exp.target
    assert t.trainer is not None, "a command target has no trainer config"
    trainer = get_trainer(t.trainer)
    settings = config_settings(
        trainer, preset=t.preset, steps=exp.run.steps, checkpoint_every=exp.run.checkpoint_every,
        seed=exp.seed, device=_DEVICE_FOR_BACKEND[exp.topology.backend])
    try:
        return trainer.make_config(run_dir, **settings, **dict(t.overrides or {}))
    except ValueError as e:  # the spec validated overrides; this is a last line of defence
        raise TargetError(f"target.overrides: {e}") from None


RUN_DIR_PLACEHOLDER = "{run_dir}"
"""In ``target.command``, stands for the run directory of each launch (the golden run's and the
experiment's differ), e.g. ``--ckpt-dir {run_dir}/checkpoints``: runs never share checkpoints."""


def job_command(exp: Experiment, run_dir: Path) -> list[str]:
    """One rank's command line: the user's ``target.command`` (``{run_dir}`` replaced by this
    launch's run directory; a bare ``python`` is the interpreter faultlab runs on), or the
    registered trainer's, after its preflight (a launch that could only crash-loop is refused
    here)."""
    if exp.target.command:
        command = [arg.replace(RUN_DIR_PLACEHOLDER, str(run_dir.resolve()))
                   for arg in exp.target.command]
        if command[0] in PYTHON_NAMES:  # the interpreter (and venv) faultlab runs on
            command[0] = sys.executable
        return command
    assert exp.target.trainer is not None
    trainer = get_trainer(exp.target.trainer)
    cfg = train_config(exp, run_dir)
    try:
        trainer.preflight(cfg, exp.topology.world_size)
    except ValueError as e:
        raise TargetError(str(e)) from None
    return trainer.command(cfg)


class LocalTarget(JobContext):
    """One launch of an experiment's job on this host (the engine polls ``stream``)."""

    job_class: type[LocalJob] = LocalJob
    offers: ClassVar[frozenset[str]] = frozenset({
        "node_restart",  # the launcher starts a lost node's agent again
        "services",  # target.services, beside the nodes
        "host_loopback",  # the nodes are processes of this host
        "node_gpu_state",  # they read the GPU state files where this host writes them
        "node_storage_view",  # and reach the shared directory through its passthrough
    })

    @classmethod
    def check_launch(cls, target: TargetSpec, topology: Topology) -> Problems:
        """A line of the team's own must address every node, dial its own store and name the
        services' ports it uses (``line_problems``)."""
        return line_problems(target, topology)

    def __init__(self, exp: Experiment, run_dir: Path,
                 node_env: dict[str, dict[str, str]] | None = None) -> None:
        self.exp = exp
        self.run_dir = run_dir
        self.seed = exp.seed
        topo = exp.topology
        try:
            self.job = self.job_class(
                command=job_command(exp, run_dir), run_dir=run_dir, nodes=topo.nodes,
                procs_per_node=topo.procs_per_node, min_nodes=topo.min_nodes,
                max_restarts=topo.max_restarts, node_env=node_env or {},
                env=bootstrap_env() if exp.target.command else {},  # level 0
                launch_line=exp.target.launch_line(topo.launcher),
                services=dict(exp.target.services))
        except LaunchError as e:
            raise TargetError(str(e)) from None
        self.stream = EventStream(run_dir / "events")

    # -- lifecycle -----------------------------------------------------------------------------

    @classmethod
    def prepare_run_dir(cls, exp: Experiment, run_folder: Path) -> Path:
        # Every node (a process here, or a container with it bind-mounted at the same path)
        # sees this host's files: nothing to create before the launch.
        return run_folder / "job"

    @classmethod
    def reference_site(cls, exp: Experiment) -> dict[str, Any]:
        """This host's (or its containers'): what the engine reads here is exact. Over it, the
        OpenMP threads the launcher gives each rank (``rank_threads``): a CPU kernel may split
        a reduction among its threads, so a golden run made with another count (another
        ``OMP_NUM_THREADS``, another number of cores) is not this job's reference."""
        return {"rank_threads": rank_threads(exp.topology.world_size)}

    @classmethod
    def golden_cache_dir(cls, exp: Experiment, default: Path) -> Path:
        return default

    @classmethod
    def code_files(cls, exp: Experiment) -> list[Path]:
        return []

    def attach_hub(self, hub: Any) -> str | None:
        self.stream.attach(hub)
        self.job.hub_address = hub.address  # each node's address for it: job.control_host()
        return None

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

    def log_tail(self, num_lines: int = 50) -> str:
        return self.job.log_tail(num_lines)

    def launch_summary(self) -> dict[str, Any]:
        """Which launch line started the nodes and what faultlab filled in (the journal's
        ``run.launch``; ``note`` is the line the run prints)."""
        line = self.job.launch_line
        if line is None:
            return {"launch": "faultlab", "filled": {},
                    "note": "launch: faultlab's tuned launcher (its store outside the nodes, 0.1 s "
                            "polls, keep-alive 1 s x 3, last call 1 s)"}
        filled = dict(self.job.filled)
        shown = ", ".join(f"{{{k}}}={v}" for k, v in filled.items() if k != "run_dir")
        return {"launch": list(line), "filled": filled,
                "note": f"launch on every node: {shlex.join(line)}"
                        + (f" (faultlab filled {shown}; {{node_rank}} per node)" if shown
                           else "")}

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

    def service_names(self) -> list[str]:
        return self.job.service_names()

    def kill_service(self, name: str, sig: int) -> list[int]:
        try:
            return self.job.kill_service(name, sig)
        except KeyError as e:
            raise FaultError(str(e).strip("'\"")) from None

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
