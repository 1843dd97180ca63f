"""The docker target: each node of the job is a container with an address of its own.

On one host, nodes that are plain processes share one network stack: a real partition, or a
node that vanishes together with its address, cannot be shown. ``DockerTarget`` runs every node
as a container (``DockerJob``) on a bridge network of the run's own and adds what only it can
do to the ``FaultContext``: pause a node (cgroup freezer), find a node's address and network
namespace, disconnect and reconnect it. Everything it created in the engine is removed when the
run ends (also by the guard process if faultlab itself dies, and by ``faultlab docker clean``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from faultlab.errors import FaultError
from faultlab.spec import Experiment
from faultlab.spec.launch import NODE_WORLD_PLACEHOLDERS, docker_problems, node_worlds
from faultlab.spec.launch_check import Problems, line_problems
from faultlab.spec.target import TargetSpec, Topology
from faultlab.targets.docker.engine import connect, engine_problem, remove_run, run_resources
from faultlab.targets.docker.job import DockerJob
from faultlab.targets.launcher import LaunchError
from faultlab.targets.local import LocalTarget

__all__ = ["DockerJob", "DockerTarget", "connect", "remove_run", "run_resources"]


class DockerTarget(LocalTarget):
    """One launch of an experiment's job as containers (``topology.launcher: docker``)."""

    job_class = DockerJob
    job: DockerJob
    offers: ClassVar[frozenset[str]] = frozenset({
        "node_network",  # an address and a network namespace per container
        "node_freezer",  # docker pause
        "node_restart",  # a lost node's container started again
        "node_storage_view",  # the run directory, bind-mounted, is seen through the passthrough
    })
    """Not ``LocalTarget``'s ``services`` (they run beside local nodes only),
    ``host_loopback`` (a container's loopback is its own) or ``node_gpu_state`` (not wired to
    containers yet)."""

    def __init__(self, exp: Experiment, run_dir: Path,
                 node_env: dict[str, dict[str, str]] | None = None) -> None:
        super().__init__(exp, run_dir.resolve(), node_env=node_env)

    @classmethod
    def check_launch(cls, target: TargetSpec, topology: Topology) -> Problems:
        """``line_problems`` of the line each container starts with, a command's default
        torchrun line included (it runs inside the container too), then what a container
        lacks: a torchrun world per node, programs and paths it does not have."""
        problems = line_problems(target, topology, default_line=True)
        line = target.launch_line(topology.launcher)
        if problems or line is None:
            return problems
        own = isinstance(target.launch, tuple)  # else a named line: torchrun
        if node_worlds(line):
            at = next(i for i, a in enumerate(line)
                      if any(f"{{{n}}}" in a for n in NODE_WORLD_PLACEHOLDERS))
            return [(("target", "launch", at), "a torchrun world per node (torchft's replica "
                     "groups) runs on local nodes only (topology.launcher: local)")]
        return [(("target", "launch", i) if own else ("target", "launch"), problem)
                for i, problem in docker_problems(line)]

    @classmethod
    def unavailable(cls) -> str | None:
        """Why no job of this target can start here: no Docker engine answers (None: one
        does)."""
        return engine_problem()

    @property
    def run_id(self) -> str:
        return self.job.run_id

    # -- the guard: the run's containers, network and image, by their label ----------------

    def guard_record(self) -> dict[str, Any]:
        """The run's label (``faultlab.run=RUN_ID``), known before anything is created."""
        return {"run_id": self.job.run_id}

    @classmethod
    def undo_from_guard(cls, record: dict[str, Any]) -> list[str]:
        """Remove the run's containers, network and image (``remove_run``: idempotent)."""
        removed = remove_run(connect(), str(record["run_id"]))
        return [f"removed docker run {record['run_id']}'s {kind}: {', '.join(names)}"
                for kind, names in removed.items() if names] or \
            [f"docker run {record['run_id']}: nothing left to remove"]

    # -- FaultContext: ranks log their pid in their container's PID namespace ---------------

    def _host_pid(self, start: dict[str, Any]) -> int | None:
        return self._job_call(self.job.host_pid, str(start["node"]),
                              int(start["pid"]))

    # -- what only containers can do -----------------------------------------------------------

    def pause_node(self, node: str) -> None:
        self._job_call(self.job.pause_node, node)

    def unpause_node(self, node: str) -> bool:
        return bool(self._job_call(self.job.unpause_node, node))

    def node_address(self, node: str) -> str | None:
        return self._job_call(self.job.node_address, node)

    def node_netns_pid(self, node: str) -> int:
        return int(self._job_call(self.job.netns_pid, node))

    def store_address(self) -> str:
        """Where the rendezvous store is: faultlab's on the gateway; under the team's line,
        node 0's agent hosts it (the address node 0 has now, '' while it has none)."""
        if self.job.launch_line is None:
            return self.job.gateway
        return self.node_address("node0") or ""

    def disconnect_node(self, node: str) -> None:
        self._job_call(self.job.disconnect_node, node)

    def connect_node(self, node: str) -> bool:
        return bool(self._job_call(self.job.connect_node, node))

    def _job_call(self, fn, *args):
        import docker.errors

        try:
            return fn(*args)
        except (KeyError, LaunchError) as e:
            raise FaultError(str(e).strip("'\"")) from None
        except docker.errors.DockerException as e:
            raise FaultError(f"Docker engine: {e}") from None
