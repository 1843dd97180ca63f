"""What every target shares: the ``FaultContext`` of a job, built from its agents and events.

A job is known by two things: the pid of each node's torchrun agent (by node name) and its
event stream. Ranks are mapped to processes from the job's own ``start`` events; a node's
processes are its agent and the agent's descendants; the job's processes are every node's
plus whatever else the target owns (the rendezvous store). Nothing outside that set is ever
signalled: ``assert_owned`` is checked before any signal a fault sends.

``LocalTarget`` (a job faultlab launched) and ``AttachedTarget`` (a job found by its run
directory) differ only in where the agents and the extra processes come from.
"""

from __future__ import annotations

import os
import random
import signal
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import psutil

from faultlab.errors import FaultError
from faultlab.observe import EventStream
from reference_trainer.launch import process_tree

__all__ = ["JobContext"]


class JobContext(ABC):
    """The ``FaultContext`` protocol for a job given by its agents and its event stream.

    Subclasses provide ``agent_pids`` (and may add ``extra_pids``); queries about ranks answer
    from ``stream`` as last polled, after ``refresh()`` (a no-op unless a subclass has no
    engine polling the stream for it).
    """

    run_dir: Path
    stream: EventStream
    seed: int = 0
    """Seed of every random choice a fault makes here (the experiment's seed)."""

    # -- what a subclass provides -------------------------------------------------------------

    @abstractmethod
    def agent_pids(self) -> dict[str, int]:
        """The torchrun agent's pid of every node, by node name, in node order."""

    def extra_pids(self) -> set[int]:
        """Live processes of the job that are not under an agent (the rendezvous store)."""
        return set()

    def refresh(self) -> None:
        """Bring ``stream`` up to date before answering about ranks (default: the caller
        polls it)."""
        return None

    # -- FaultContext ---------------------------------------------------------------------------

    def rng(self, key: str) -> random.Random:
        return random.Random(f"{self.seed}/{key}")

    def ranks(self) -> list[int]:
        self.refresh()
        return self.stream.current_ranks()

    def rank_pid(self, rank: int) -> int:
        self.refresh()
        start = self.stream.latest_start(rank)
        if start is None:
            raise FaultError(f"rank {rank} has not started (yet); ranks seen: "
                             f"{self.stream.current_ranks() or 'none'}")
        pid = self._host_pid(start)
        if pid is None:
            raise FaultError(f"rank {rank}'s process {start['pid']} (on {start.get('node')}) "
                             f"is gone (the job is restarting?)")
        return pid

    def _host_pid(self, start: dict[str, Any]) -> int | None:
        """This host's pid of the live process a ``start`` record names (None if gone)."""
        pid = int(start["pid"])
        return pid if psutil.pid_exists(pid) else None

    def node_names(self) -> list[str]:
        return list(self.agent_pids())

    def node_of_rank(self, rank: int) -> str:
        self.refresh()
        start = self.stream.latest_start(rank)
        if start is None:
            raise FaultError(f"rank {rank} has not started (yet)")
        return str(start["node"])

    def node_pids(self, node: str) -> list[int]:
        return [p.pid for p in process_tree(self._agent_pid(node))]

    def kill_node(self, node: str, sig: int) -> list[int]:
        """Signal a node's agent and every worker at once (tree snapshotted first)."""
        procs = process_tree(self._agent_pid(node))
        for p in procs:
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass
        return [p.pid for p in procs]

    def runtime(self, rank: int, message: dict[str, Any]) -> dict[str, Any]:
        """Send ``message`` to ``rank``'s runtime agent over its control channel (the secret is
        the job's ``runtime/secret``, written at launch); raises FaultError if unreachable."""
        from faultlab.engine.runtime_plan import read_secret
        from faultlab.runtime.client import RuntimeControlError, send

        secret = read_secret(self.run_dir)
        if secret is None:
            raise FaultError(f"no runtime control secret in {self.run_dir / 'runtime'}: the job "
                             f"was not launched by faultlab, so its ranks accept no live "
                             f"in-rank fault")
        try:
            return send(self.run_dir, rank, secret, message)
        except RuntimeControlError as e:
            raise FaultError(str(e)) from None

    def restart_node(self, node: str) -> int:
        raise FaultError(f"this target cannot start {node!r} again (only a job faultlab "
                         f"launched can)")

    def mark_lost(self, node: str) -> None:
        self._agent_pid(node)

    # What only a node with a network of its own can do (the docker target); elsewhere the
    # experiment loader already refused the faults that need it.
    def _isolated_only(self, what: str) -> FaultError:
        return FaultError(f"{what} needs nodes with a network of their own "
                          f"(topology.launcher: docker); the nodes of the job in "
                          f"{self.run_dir} are processes of this host")

    def pause_node(self, node: str) -> None:
        raise self._isolated_only("pausing a node")

    def unpause_node(self, node: str) -> bool:
        raise self._isolated_only("unpausing a node")

    def node_address(self, node: str) -> str | None:
        raise self._isolated_only("a node's address")

    def node_netns_pid(self, node: str) -> int:
        raise self._isolated_only("a node's network namespace")

    def store_address(self) -> str:
        raise self._isolated_only("the rendezvous store's address")

    def disconnect_node(self, node: str) -> None:
        raise self._isolated_only("disconnecting a node")

    def connect_node(self, node: str) -> bool:
        raise self._isolated_only("connecting a node")

    def assert_owned(self, pid: int) -> None:
        if pid not in self.pids():
            raise FaultError(f"process {pid} is not part of the job in {self.run_dir}; "
                             f"faultlab signals only processes of that job")

    # -- beyond the protocol -------------------------------------------------------------------

    def pids(self) -> set[int]:
        """Every live process of the job: agents, their descendants, and ``extra_pids``."""
        out = {p.pid for pid in self.agent_pids().values() for p in process_tree(pid)}
        return out | self.extra_pids()

    def continue_all(self) -> None:
        """SIGCONT every process of the job (nothing may be left stopped)."""
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def _agent_pid(self, node: str) -> int:
        agents = self.agent_pids()
        if node not in agents:
            raise FaultError(f"no node {node!r} in the job in {self.run_dir}; nodes are "
                             f"{', '.join(agents) or 'none'}")
        return agents[node]
