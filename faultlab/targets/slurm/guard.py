"""What a fault changes outside the job, and the guard that undoes it if faultlab dies.

A node set down (``scontrol update``, which needs ``slurm.allow_node_state_changes``) or a test
cluster's machine killed (``docker kill`` of a container labelled ``LAB_LABEL``) changes the
cluster for everyone, not only the job. Each change enters the guard's record
(``guard_record``; ``guard_now`` has the engine write it for the guard at once) before it is
made, and leaves it once undone; ``restore_cluster`` undoes what is left when the run stops,
and the guard process (``faultlab.reaper``) calls ``undo_from_guard`` with the record's last
state if faultlab itself dies: the job is cancelled (unless attached), the nodes resumed, the
machines started. ``ClusterChanges`` is that part of ``SlurmTarget``.
"""

from __future__ import annotations

import os
import subprocess
from typing import TYPE_CHECKING, Any

from faultlab.errors import FaultError
from faultlab.targets.slurm.settings import SlurmSettings
from faultlab.targets.slurm.slurmcli import SlurmError, run

__all__ = ["LAB_LABEL", "ClusterChanges", "restore_from_guard"]

LAB_LABEL = "faultlab.slurm-cluster"
"""The label of the local test cluster's node containers (``scripts/slurm-cluster.sh``): the
only machines a ``node_kill`` with ``method: machine`` may kill."""


class ClusterChanges:
    """``SlurmTarget``'s changes to the cluster (nodes set down, machines killed), each
    recorded in the guard's state file first, and their undoing."""

    spec: SlurmSettings | None
    job_id: int | None
    attached: bool
    _nodes_down: list[str]
    _machines: list[str]
    _lost: set[str]

    if TYPE_CHECKING:
        def _node(self, node: str) -> str: ...  # SlurmTarget's: FaultError unless the job's
        def guard_now(self) -> None: ...  # JobContext's: the engine writes guard_record now

    def set_node_state(self, node: str, state: str, reason: str) -> None:
        """``scontrol update nodename=NODE state=down|drain``; recorded for the guard first."""
        assert self.spec is not None
        if not self.spec.allow_node_state_changes:
            raise FaultError(f"setting {node} {state} changes it for every user of the cluster: "
                             f"allow it with slurm.allow_node_state_changes: true")
        self._nodes_down.append(node)
        self.guard_now()
        try:
            run(["scontrol", "update", f"nodename={node}", f"state={state}",
                 f"reason={reason}"])
        except SlurmError as e:
            raise FaultError(f"{e} (changing a node's state needs Slurm operator rights)") \
                from None

    def resume_node(self, node: str) -> bool:
        """Return a node a fault set down to service; False if it was not one of those."""
        if node not in self._nodes_down:
            return False
        try:
            run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
        finally:
            self._nodes_down.remove(node)
            self.guard_now()
        return True

    def kill_machine(self, node: str) -> list[str]:
        """The local test cluster only: ``docker kill`` the node's container (a machine loss:
        slurmd goes with it, and Slurm must notice by itself, through ``SlurmdTimeout``)."""
        self._node(node)
        label = _docker(["inspect", "-f", "{{index .Config.Labels \"" + LAB_LABEL + "\"}}",
                         node])
        if label.returncode != 0 or label.stdout.strip() != "1":
            raise FaultError(f"{node} is not a container of the local test cluster "
                             f"(scripts/slurm-cluster.sh); on a real cluster a machine cannot "
                             f"be killed from the login node: use slurm_node_down, or "
                             f"node_kill with method: processes")
        self._machines.append(node)
        self._lost.add(node)
        self.guard_now()
        proc = _docker(["kill", node])
        if proc.returncode != 0:
            raise FaultError(f"docker kill {node}: {proc.stderr.strip()}")
        return [node]

    def start_machine(self, node: str) -> bool:
        if node not in self._machines:
            return False
        try:
            _docker(["start", node])
        finally:
            self._machines.remove(node)
            self.guard_now()
        return True

    def restore_cluster(self) -> dict[str, list[str]]:
        """Resume every node a fault set down, start every machine a fault killed."""
        out: dict[str, list[str]] = {"resumed": [], "machines_started": []}
        for node in list(self._nodes_down):
            if self.resume_node(node):
                out["resumed"].append(node)
        for node in list(self._machines):
            if self.start_machine(node):
                out["machines_started"].append(node)
        return out

    # -- the guard (``Target.guard_record``, ``undo_from_guard``) -----------------------------

    def guard_record(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "cancel": not self.attached,
                "nodes_down": list(self._nodes_down), "machines": list(self._machines),
                "slurm_conf": os.environ.get("SLURM_CONF")}

    @classmethod
    def undo_from_guard(cls, record: dict[str, Any]) -> list[str]:
        return restore_from_guard(record)


def _docker(args: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60)
    except (FileNotFoundError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(["docker", *args], 1, "", str(e))


def restore_from_guard(state: dict[str, Any]) -> list[str]:
    """What the guard does when faultlab died: cancel the job (unless attached), resume the
    nodes a fault set down, start the machines a fault killed. Returns what it did."""
    done = []
    env = {**os.environ, **({"SLURM_CONF": state["slurm_conf"]} if state.get("slurm_conf")
                            else {})}
    if state.get("job_id") and state.get("cancel"):
        run(["scancel", "--full", str(state["job_id"])], env=env, check=False)
        done.append(f"cancelled job {state['job_id']}")
    for node in state.get("nodes_down", []):
        run(["scontrol", "update", f"nodename={node}", "state=resume"], env=env, check=False)
        done.append(f"resumed {node}")
    for node in state.get("machines", []):
        _docker(["start", node])
        done.append(f"started machine {node}")
    return done
