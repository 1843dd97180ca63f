"""The attach target: a job that is already running, found by its run directory.

The staging-cluster case: the job was launched by someone else (``python -m
faultlab launch``, an earlier ``chaos`` process, a CI step), and faultlab is pointed at
its run directory. Everything it needs is there:

- ``RUN_DIR/launch.json`` (written by ``LocalJob``): the nodes and their agents' pids, the
  rendezvous store's pid, when the job started;
- ``RUN_DIR/events/``: the ranks and their current pids (the job's own ``start`` events).

The job's processes are the agents, their descendants and the store. Pids are reused by the
kernel once a process is gone, so an agent or store pid from ``launch.json`` only counts while
the process behind it is still the one the launcher started: created no later than
``started_t``, with this job's rendezvous id (agents) or the store's module (store) on its
command line. A process that fails that check is treated as gone, never signalled.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psutil

from faultlab.errors import TargetError
from faultlab.observe import EventStream
from faultlab.spec.launch_check import Problems, line_problems
from faultlab.spec.target import TargetSpec, Topology
from faultlab.targets.base import JobContext
from faultlab.targets.procs import process_tree

__all__ = ["AttachedTarget", "read_launch_info"]

LAUNCH_FILE = "launch.json"
# psutil derives create_time from the boot time in whole seconds (seen ~1 s off time.time()).
_CLOCK_SLACK_S = 2.0


def read_launch_info(run_dir: Path) -> dict[str, Any]:
    """``RUN_DIR/launch.json`` as written by ``LocalJob.start``; TargetError says what is
    wrong."""
    path = run_dir / LAUNCH_FILE
    try:
        info = json.loads(path.read_text())
    except FileNotFoundError:
        raise TargetError(f"{path} does not exist: {str(run_dir)!r} is not the run directory "
                          f"of a job launched by faultlab (run or launch) (or it "
                          f"has not started yet)") from None
    except (OSError, ValueError) as e:
        raise TargetError(f"{path}: cannot read it: {e}") from None
    nodes = info.get("nodes") if isinstance(info, dict) else None
    if not isinstance(nodes, list) or not all(
            isinstance(n, dict) and isinstance(n.get("node"), str)
            and isinstance(n.get("agent_pid"), int) for n in nodes):
        raise TargetError(f"{path}: expected 'nodes': [{{node, agent_pid, log}}, ...], got "
                          f"{nodes!r}")
    return info


class AttachedTarget(JobContext):
    """``FaultContext`` for a running job found by its run directory."""

    @classmethod
    def check_launch(cls, target: TargetSpec, topology: Topology) -> Problems:
        return line_problems(target, topology)  # as a line of local nodes

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir).resolve()
        if not self.run_dir.is_dir():
            raise TargetError(f"run directory {str(run_dir)!r} does not exist")
        self.info = read_launch_info(self.run_dir)
        self.stream = EventStream(self.run_dir)
        self._started_t = float(self.info.get("started_t") or 0.0)
        # launch.json names the rendezvous id (older launches derived it from the folder name)
        self._rdzv_id = str(self.info.get("rdzv_id") or f"faultlab-{self.run_dir.name}")

    def refresh(self) -> None:
        self.stream.poll()  # no engine polls for us: read what the job wrote since last time

    def agent_pids(self) -> dict[str, int]:
        return {n["node"]: n["agent_pid"] for n in self.info["nodes"]}

    def _live_agent(self, pid: int) -> bool:
        return self._is_ours(pid, self._rdzv_id)

    def pids(self) -> set[int]:
        out: set[int] = set()
        for pid in self.agent_pids().values():
            if self._live_agent(pid):
                out.update(p.pid for p in process_tree(pid))
        return out | self.extra_pids()

    def node_pids(self, node: str) -> list[int]:
        pid = self._agent_pid(node)
        return [p.pid for p in process_tree(pid)] if self._live_agent(pid) else []

    def kill_node(self, node: str, sig: int) -> list[int]:
        pid = self._agent_pid(node)
        return super().kill_node(node, sig) if self._live_agent(pid) else []

    def running(self) -> bool:
        """True while any node's agent is still alive."""
        return any(self._live_agent(pid) for pid in self.agent_pids().values())

    def _is_ours(self, pid: int, marker: str) -> bool:
        try:
            p = psutil.Process(pid)
            if p.status() == psutil.STATUS_ZOMBIE:
                return False
            if self._started_t and p.create_time() > self._started_t + _CLOCK_SLACK_S:
                return False  # a newer process that got a reused pid
            return marker in " ".join(p.cmdline())
        except psutil.Error:
            return False

