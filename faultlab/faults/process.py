"""Process faults: kill or freeze a rank, a whole node, or a service beside the nodes.

Signals go only to processes of the job faultlab launched (``FaultContext.assert_owned``).
A hang is SIGSTOP and is always undone with SIGCONT — at the end of ``duration_s``, when the
job reacts, or when the experiment ends for any reason.
"""

from __future__ import annotations

import signal
import time
from typing import Any, ClassVar, Literal

from pydantic import Field

from faultlab.errors import FaultError
from faultlab.fault_api import (
    Fault,
    FaultContext,
    FaultParams,
    NodeFreezer,
    NodeMachine,
    NodeRestart,
    Services,
    Victim,
    require,
)

__all__ = ["NodeHangFault", "NodeKillFault", "NodePauseFault", "NodeReturnFault", "RankHangFault",
           "RankKillFault", "ServiceKillFault"]

KillSignal = Literal["KILL", "TERM", "SEGV", "ABRT"]


def _signal(name: str) -> signal.Signals:
    return signal.Signals[f"SIG{name}"]


def _continue(ctx: FaultContext, pid: int) -> bool:
    """SIGCONT through the target; a process that is gone (or no longer the job's) is skipped:
    undo must never raise."""
    try:
        return ctx.signal(pid, signal.SIGCONT)
    except FaultError:
        return False


def _struck_at(ctx: FaultContext, details: dict[str, Any]) -> dict[str, Any]:
    """Add when the signal went out where a target delivers it on a remote node (the slurm
    target's step on the node takes a fraction of a second to start)."""
    at = getattr(ctx, "action_t", None)
    return {**details, "at_t": at} if at is not None else details


def _victim_ranks(ctx: FaultContext, victim: Victim) -> list[int]:
    return ctx.ranks() if victim.kind == "all" else [int(victim.value or 0)]


class RankKillFault(Fault):
    """Kill one rank's process (or every rank's) with a signal, as a crash or OOM kill would."""

    type = "rank_kill"
    family = "process"
    targets: ClassVar[tuple[str, ...]] = ("rank", "all")

    class Params(FaultParams):
        signal: KillSignal = Field("KILL", description="signal to send: KILL, TERM, SEGV or "
                                                       "ABRT")

    params: Params

    def inject(self, ctx: FaultContext, victim: Victim) -> dict[str, Any]:
        sig = _signal(self.params.signal)
        done = {}
        for rank in _victim_ranks(ctx, victim):
            pid = ctx.rank_pid(rank)
            if ctx.signal(pid, sig):
                done[rank] = pid
        return _struck_at(ctx, {"signal": sig.name, "pids_by_rank": done})


class NodeKillFault(Fault):
    """Kill a whole node at once — its torchrun agent and every worker — as a machine loss."""

    type = "node_kill"
    family = "process"
    loses_node: ClassVar[bool] = True
    targets: ClassVar[tuple[str, ...]] = ("node",)

    class Params(FaultParams):
        signal: Literal["KILL", "TERM"] = Field("KILL", description="signal sent to the agent "
                                                                    "and every worker")
        method: Literal["processes", "machine"] = Field(
            "processes", description="processes: every process of the job on the node; "
                                     "machine (slurm target, local test cluster): the node's "
                                     "container is killed, slurmd with it, and Slurm must "
                                     "notice by itself; it is started again on undo")

    params: Params

    @classmethod
    def reversible_with(cls, params: FaultParams) -> bool:
        return getattr(params, "method", "processes") == "machine"  # started again on undo

    def __init__(self, params: FaultParams) -> None:
        super().__init__(params)
        self._machines: list[str] = []
        self.reversible = self.reversible_with(params)  # type: ignore[misc]

    def inject(self, ctx: FaultContext, victim: Victim) -> dict[str, Any]:
        node = victim.node(ctx)
        if self.params.method == "machine":
            # (on docker nodes node_kill with method: processes already kills the container)
            machines: NodeMachine = require(ctx, "node_machine", "node_kill method: machine")
            self._machines.append(node)
            machines.kill_machine(node)
            return {"method": "machine", "node": node, "at_t": time.time()}
        pids = ctx.kill_node(node, _signal(self.params.signal))
        return _struck_at(ctx, {"signal": f"SIG{self.params.signal}",
                                "node": node, "pids": pids})

    def undo(self, ctx: FaultContext) -> dict[str, Any]:
        """``method: machine`` (Slurm): start the node's machine again, a replacement host
        for the scheduler to hand back; a killed process is never brought back."""
        if not self._machines:
            return {"machines_started": []}
        machines: NodeMachine = require(ctx, "node_machine", "starting a machine again")
        started = [n for n in self._machines if machines.start_machine(n)]
        self._machines = []
        return {"machines_started": started}


class NodeReturnFault(Fault):
    """Start a node the job lost again, on the same machine: its agent rejoins and the job
    grows back at its next re-rendezvous.

    The counterpart of ``node_kill`` for a node whose processes died but whose machine did
    not (a crashed or killed job started again where it ran, a requeue onto the same hosts):
    what the machine holds survives, such as its NFS client's caches (``stale_shared_fs`` on
    the same node keeps answering for the new processes). A replacement machine is
    ``spot_preemption``'s ``return_after_s``. Needs ``topology.min_nodes`` below ``nodes`` for
    the job to have gone on without it.

    It returns once the node's agent has started workers (the job re-formed with it), at most
    ``wait_s``: the ranks held at the trigger's step gate meanwhile are what the re-formed job
    restarts, whatever the speed of the trainer's steps.
    """

    type = "node_return"
    family = "process"
    targets: ClassVar[tuple[str, ...]] = ("node",)
    needs: ClassVar[tuple[str, ...]] = ("node_restart",)

    class Params(FaultParams):
        wait_s: float = Field(60.0, gt=0, description="how long to wait for the node's agent "
                                                      "to start its workers")

    params: Params

    def inject(self, ctx: FaultContext, victim: Victim) -> dict[str, Any]:
        node = victim.node(ctx)
        if ctx.node_pids(node):
            raise FaultError(f"{node} is still running: node_return starts a node that is "
                             f"gone (after a node_kill)")
        wait_s: float = self.params.wait_s
        restart: NodeRestart = require(ctx, "node_restart", "node_return")
        at_t = time.time()
        agent = restart.restart_node(node)
        deadline = time.monotonic() + wait_s
        # the node's workers (what its launcher gave a RANK), not "every process but the
        # topmost": a docker node's topmost process is the container's init, and its agent is
        # up long before the job takes the node back
        while not (workers := sorted(pid for n, pid in ctx.worker_ranks().values()
                                     if n == node)):
            if time.monotonic() > deadline or not ctx.node_pids(node):
                raise FaultError(f"{node} came back (agent {agent}) but started no worker "
                                 f"within {wait_s:g} s: the job did not take it back "
                                 f"(topology.min_nodes below nodes?)")
            time.sleep(0.1)
        return {"node": node, "agent_pid": agent, "at_t": at_t,
                "rejoined_s": round(time.time() - at_t, 3), "workers": workers}


class _StopFault(Fault):
    reversible = True

    def __init__(self, params: FaultParams) -> None:
        super().__init__(params)
        self._stopped: list[int] = []

    def _stop(self, ctx: FaultContext, pids: list[int]) -> list[int]:
        for pid in pids:
            ctx.assert_owned(pid)
        for pid in pids:
            # Record before signalling: if faultlab dies right here, undo still knows the pid.
            self._stopped.append(pid)
            ctx.signal(pid, signal.SIGSTOP)
        return pids

    def undo(self, ctx: FaultContext) -> dict[str, Any]:
        """SIGCONT to every process it stopped (one already gone is skipped), in the reverse
        order of stopping: a node's workers and their children before its agent. faultlab's
        guard continues them too if faultlab itself dies.

        Why the order: an agent continued first may kill its workers at once (its job
        restarted while it was frozen), and a worker's child in a session of its own (the node
        relay) is then no longer in the job's process tree, so it is not the job's to signal,
        and stays stopped for good. Seen under load: node 1's relay stayed stopped, and every
        restart of the job hung at the step gate it served."""
        continued = [pid for pid in reversed(self._stopped) if _continue(ctx, pid)]
        self._stopped = []
        return {"continued": continued}


class RankHangFault(_StopFault):
    """Freeze a rank's process with SIGSTOP: it holds its sockets but never answers."""

    type = "rank_hang"
    family = "process"
    targets: ClassVar[tuple[str, ...]] = ("rank", "all")

    def inject(self, ctx: FaultContext, victim: Victim) -> dict[str, Any]:
        pids = [ctx.rank_pid(r) for r in _victim_ranks(ctx, victim)]
        return {"signal": "SIGSTOP", "pids": self._stop(ctx, pids)}


class NodeHangFault(_StopFault):
    """Freeze a whole node — agent and workers — with SIGSTOP (a hung host, a long GC pause)."""

    type = "node_hang"
    family = "process"
    targets: ClassVar[tuple[str, ...]] = ("node",)

    def inject(self, ctx: FaultContext, victim: Victim) -> dict[str, Any]:
        node = ctx.node_names()[int(victim.value or 0)]
        return {"signal": "SIGSTOP", "node": node, "pids": self._stop(ctx, ctx.node_pids(node))}


class NodePauseFault(Fault):
    """Freeze a whole node at once with the cgroup freezer (docker pause): no signal is seen.

    Unlike ``node_hang`` (SIGSTOP), no process is told or changes visible state; the node's
    address stays up and its TCP peers see nothing but silence."""

    type = "node_pause"
    family = "process"
    loses_node: ClassVar[bool] = True
    reversible = True
    targets: ClassVar[tuple[str, ...]] = ("node",)
    needs: ClassVar[tuple[str, ...]] = ("node_freezer",)

    def __init__(self, params: FaultParams) -> None:
        super().__init__(params)
        self._paused: list[str] = []

    def inject(self, ctx: FaultContext, victim: Victim) -> dict[str, Any]:
        node = ctx.node_names()[int(victim.value or 0)]
        freezer: NodeFreezer = require(ctx, "node_freezer", "node_pause")
        self._paused.append(node)  # before acting: undo must know, whatever happens next
        freezer.pause_node(node)
        return {"node": node, "paused": True}

    def undo(self, ctx: FaultContext) -> dict[str, Any]:
        """``docker unpause`` of every node it froze; the guard unpauses them if faultlab
        dies."""
        if not self._paused:
            return {"unpaused": []}
        freezer: NodeFreezer = require(ctx, "node_freezer", "unpausing a node")
        thawed = [n for n in self._paused if freezer.unpause_node(n)]
        self._paused = []
        return {"unpaused": thawed}


class ServiceKillFault(Fault):
    """Kill a service the team runs beside the nodes (``target.services``: torchft's
    lighthouse), and whatever it started; no node is touched."""

    type = "service_kill"
    family = "process"
    kills_service: ClassVar[bool] = True
    targets: ClassVar[tuple[str, ...]] = ("all",)
    needs: ClassVar[tuple[str, ...]] = ("services",)

    class Params(FaultParams):
        service: str = Field(description="the service's name under target.services")
        signal: Literal["KILL", "TERM"] = Field("KILL", description="signal sent to it")

    params: Params

    @classmethod
    def refuses_params(cls, params: FaultParams, target: Any) -> tuple[str, str] | None:
        name = getattr(params, "service", None)
        services = list(getattr(target, "services", None) or {})
        if name in services:
            return None
        known = (f"the experiment's services are {', '.join(map(repr, services))}" if services
                 else "the experiment runs none: name it under target.services first")
        return "service", f"no service {name!r}: {known}"

    def inject(self, ctx: FaultContext, victim: Victim) -> dict[str, Any]:
        services: Services = require(ctx, "services", "service_kill")
        name = self.params.service
        pids = services.kill_service(name, _signal(self.params.signal))
        return _struck_at(ctx, {"signal": f"SIG{self.params.signal}",
                                "service": name, "pids": pids})
