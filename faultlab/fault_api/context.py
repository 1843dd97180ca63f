"""What a fault may ask of the job: a small core every target implements (``FaultContext``),
plus named *context capabilities* that only some targets offer.

A capability is something of the nodes or of the target beyond the core: a network stack per
node, a cgroup freezer, a Slurm controller, nodes that read files this host writes. A fault
declares the ones it needs (``Fault.needs``), a target class the ones it offers (``offers``,
``faultlab.targets.base.Target``), and the experiment loader refuses a fault whose
``topology.launcher`` does not offer everything it needs, saying which capability is missing,
what it is, and which launchers offer it. That is how a team's target hosts every built-in
fault it can: by offering the capabilities, never by being named in a fault's list.

A capability with methods has a ``Protocol`` of its own below (``NodeNetwork``,
``NodeFreezer`` ...): what a target that offers it implements, what a fault that needs it may
call. ``require(ctx, name)`` hands a fault its context as that protocol, and raises FaultError
when the target does not offer the capability: the second line of defence, for a fault used
outside a validated experiment. A capability without methods (``host_loopback``) is a property
of the nodes: the fault acts through the core, and only the target can say whether that
reaches the nodes.

``CONTEXT_CAPABILITIES`` is the vocabulary, by name: each with its one-line description (the
load error's and the documentation's) and its protocol. The vocabulary is closed: a fault that
needs, or a target that offers, a name not in it is a plugin error.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from faultlab.errors import FaultError, PluginError

__all__ = ["CONTEXT_CAPABILITIES", "ContextCapability", "FaultContext", "NodeFreezer",
           "NodeMachine", "NodeNetwork", "NodeRestart", "Services", "SharedRunsRoot",
           "SlurmController",
           "declared_capabilities", "not_offered", "require", "unknown_capabilities", "unmet"]


class FaultContext(Protocol):
    """The core of what a fault may use of the running experiment, which every target
    implements (a subset of ``faultlab.targets.base.Target``). What only some targets can do is
    a capability's protocol below, reached through ``require``."""

    run_dir: Path
    """The job's run directory: ``events/``, ``checkpoints/``, ``logs/``."""

    def rng(self, key: str) -> random.Random:
        """A generator seeded by the experiment seed and ``key`` (same run, same draws)."""

    def rank_pid(self, rank: int) -> int:
        """PID of the process currently running ``rank``; raises FaultError if none."""

    def ranks(self) -> list[int]:
        """Ranks of the current incarnation of the job."""

    def node_names(self) -> list[str]:
        """Nodes of the job, e.g. ``node0``."""

    def node_of_rank(self, rank: int) -> str:
        """The node currently holding ``rank``."""

    def node_pids(self, node: str) -> list[int]:
        """Agent and worker PIDs of ``node`` (only processes of this job)."""

    def worker_ranks(self) -> dict[int, tuple[str, int]]:
        """Rank → (node, pid) of every live worker on this host, read from the environment
        its launcher gave it (torchrun's ``RANK``)."""

    def kill_node(self, node: str, sig: int) -> list[int]:
        """Signal a node's agent and every worker at once; returns the PIDs signalled."""

    def assert_owned(self, pid: int) -> None:
        """Raise FaultError unless ``pid`` belongs to the job faultlab launched."""

    def signal(self, pid: int, sig: int) -> bool:
        """Send ``sig`` to one process of the job (``assert_owned`` first, FaultError if it is
        not the job's); False if it was already gone. The target decides how the signal
        reaches the process's node."""

    def host_path(self, path: Path, node: str | None = None) -> Path:
        """Where this host reads and damages the file a node of the job sees at ``path`` (the
        target contract's ``host_path``); FaultError where this host cannot reach it."""

    def checkpoints(self) -> list[tuple[int | None, Path]]:
        """The job's existing checkpoints, oldest first, as ``(step, host path)``: the ones its
        ``checkpoint_saved`` events name, else the ``step_N`` directories of the run."""

    def runtime(self, rank: int, message: dict[str, Any]) -> dict[str, Any]:
        """Send ``message`` to ``rank``'s in-rank runtime agent (``faultlab.runtime``) over its
        control channel; returns the reply. Raises FaultError if it cannot be reached."""

    def mark_lost(self, node: str) -> None:
        """Record that a node left on purpose (preempted): its exit code is not a failure."""


# -- one protocol per capability that has methods ----------------------------------------------


class NodeNetwork(FaultContext, Protocol):
    """``node_network``: every node has a network stack of its own (the docker target)."""

    def node_address(self, node: str) -> str | None:
        """The node's IPv4 address on the job's network; None while it is disconnected."""

    def node_netns_pid(self, node: str) -> int:
        """A host pid inside the node's network namespace (for ``nsenter --net``)."""

    def store_address(self) -> str:
        """The rendezvous store's address as the nodes reach it ('' while it has none)."""

    def disconnect_node(self, node: str) -> None:
        """Take the node off the job's network (it loses its address)."""

    def connect_node(self, node: str) -> bool:
        """Put a disconnected node back on the network; False if it was not disconnected."""


class NodeFreezer(FaultContext, Protocol):
    """``node_freezer``: a whole node can be frozen at once, no signal seen (docker pause)."""

    def pause_node(self, node: str) -> None:
        """Freeze every process of the node at once (cgroup freezer: ``docker pause``)."""

    def unpause_node(self, node: str) -> bool:
        """Thaw a paused node; False if it was not paused (or is gone)."""


class NodeRestart(FaultContext, Protocol):
    """``node_restart``: a node the job lost can be started again."""

    def restart_node(self, node: str) -> int:
        """Start a node that is gone again (a replacement machine); returns its agent's pid.
        FaultError if it cannot now (the node still runs, the launch fails)."""


class NodeMachine(FaultContext, Protocol):
    """``node_machine``: a node's machine can be killed and started again."""

    def kill_machine(self, node: str) -> list[str]:
        """Kill the machine under ``node`` (its scheduler daemon goes with it); returns the
        machines killed. FaultError where this machine cannot be killed from here."""

    def start_machine(self, node: str) -> bool:
        """Start a machine ``kill_machine`` killed again; False if it was not one of those."""


class Services(FaultContext, Protocol):
    """``services``: the target runs the experiment's ``target.services`` beside the nodes."""

    def service_names(self) -> list[str]:
        """The services the target runs, by their name under ``target.services``."""

    def kill_service(self, name: str, sig: int) -> list[int]:
        """Signal a service and everything it started; returns the pids signalled.
        FaultError for a name it does not run."""


class SlurmController(FaultContext, Protocol):
    """``slurm_controller``: the job is a Slurm job, acted on through its controller."""

    job_id: int | None
    """The Slurm job id (None before the submission)."""
    attached: bool
    """True for a job faultlab did not submit (its event stream is polled by ``ranks``)."""
    stream: Any
    """The job's event stream (``faultlab.observe.EventStream``)."""

    def state(self) -> str:
        """The job's state as the controller has it now (``RUNNING`` ...)."""

    def set_node_state(self, node: str, state: str, reason: str) -> None:
        """``scontrol update nodename=NODE state=down|drain reason=...``."""

    def resume_node(self, node: str) -> bool:
        """Resume a node ``set_node_state`` changed; False if it was not one of those."""

    def cancel(self, signal_name: str, batch: bool = False, full: bool = False) -> None:
        """``scancel --signal=SIG [--batch|--full]``: Slurm delivers the signal."""

    def hold_finish(self, until_t: float) -> None:
        """Do not call the job finished before ``until_t`` (a requeue is due by then)."""

    def requeue(self) -> str:
        """``scontrol requeue``; returns the job's state after it."""


@runtime_checkable
class SharedRunsRoot(Protocol):
    """A target's settings (``Target.settings``, ``exp.topology.settings``) whose nodes see the
    run directories on a filesystem they mount themselves (Slurm's): a fault that serves the
    run directory through this host (the storage passthrough) reaches those nodes only where
    that directory propagates mounts to them."""

    def runs_root(self) -> Path:
        """The directory the job's run directories go in; ValueError where none is set yet
        (checked when the run starts)."""


# -- the vocabulary ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContextCapability:
    """One capability a target may offer and a fault may need."""

    name: str
    """What ``Fault.needs`` and a target's ``offers`` say."""
    description: str
    """What it is, in one line: the load error and the documentation show it."""
    protocol: type | None = None
    """The methods a target that offers it implements (None: a property of its nodes)."""

    def methods(self) -> tuple[str, ...]:
        """The names the protocol adds to the core (its methods and attributes)."""
        if self.protocol is None:
            return ()
        own = vars(self.protocol)
        return tuple([*own.get("__annotations__", {}),
                      *(n for n, v in own.items() if not n.startswith("_") and callable(v))])


CONTEXT_CAPABILITIES: dict[str, ContextCapability] = {c.name: c for c in (
    ContextCapability(
        "node_network",
        "nodes with a network stack of their own, each an address to cut or throttle: "
        "containers, not processes that share this host's stack", NodeNetwork),
    ContextCapability(
        "node_freezer",
        "a cgroup freezer that stops a whole node at once, as docker pause does; processes of "
        "this host are stopped with SIGSTOP instead, by node_hang", NodeFreezer),
    ContextCapability(
        "node_restart",
        "starting a node the job lost again, as faultlab's launcher does; Slurm hands a job's "
        "nodes back itself, on a requeue", NodeRestart),
    ContextCapability(
        "node_machine",
        "killing a node's machine and starting it again, as on the local Slurm test cluster",
        NodeMachine),
    ContextCapability(
        "services",
        "services the target runs beside the nodes, from target.services", Services),
    ContextCapability(
        "slurm_controller",
        "a Slurm job, acted on through its controller: scontrol, scancel", SlurmController),
    ContextCapability(
        "host_loopback",
        "nodes that reach this host's loopback, where faultlab serves its fake cloud metadata "
        "endpoints; a container's loopback is its own"),
    ContextCapability(
        "node_gpu_state",
        "nodes that read the GPU state file and kernel-log stand-in faultlab writes under the "
        "run directory; container and Slurm nodes are not wired to them yet"),
    ContextCapability(
        "node_storage_view",
        "nodes whose every file operation passes through this host's storage passthrough, so "
        "that one node can get a view of its own; a Slurm node reaches the shared directory "
        "through its own mount"),
)}
"""Every context capability by name, in the order the documentation lists them."""


def unknown_capabilities(names: Iterable[str]) -> list[str]:
    """The names that are not capabilities (for a plugin's ``needs`` or ``offers``)."""
    return [n for n in names if n not in CONTEXT_CAPABILITIES]


def declared_capabilities(names: object, plugin: str, attr: str) -> frozenset[str]:
    """A plugin's ``needs`` or ``offers`` (``attr``), checked: a collection of capability
    names, else a PluginError that names ``plugin`` (e.g. "fault plugin 'x' (pkg:X)")."""
    if isinstance(names, str) or not isinstance(names, (frozenset, set, tuple, list)) or \
            not all(isinstance(n, str) for n in names):
        example = names if isinstance(names, str) else next(iter(CONTEXT_CAPABILITIES))
        raise PluginError(f"{plugin} declares {attr} = {names!r}: a tuple of capability names, "
                          f"e.g. ({example!r},)")
    unknown = unknown_capabilities(names)
    if unknown:
        raise PluginError(f"{plugin} {attr} {', '.join(map(repr, unknown))}, which is no "
                          f"context capability; "
                          f"known: {', '.join(CONTEXT_CAPABILITIES)}")
    return frozenset(names)


def unmet(needs: Iterable[str], offers: Collection[str]) -> list[str]:
    """What of ``needs`` is not in ``offers``, in the order needed."""
    return [n for n in needs if n not in offers]


def not_offered(ctx: object, name: str, what: str = "") -> FaultError:
    """The FaultError for ``what`` (an action: 'pausing a node') on a context that does not
    offer capability ``name``."""
    cap = CONTEXT_CAPABILITIES[name]
    run_dir = getattr(ctx, "run_dir", None)
    job = f" (the job in {run_dir})" if run_dir is not None else ""
    return FaultError(f"{what or 'this fault'} needs {name} ({cap.description}), which "
                      f"{type(ctx).__name__}{job} does not offer")


def require(ctx: FaultContext, name: str, what: str = "") -> Any:
    """``ctx`` as the protocol of capability ``name``, for a fault that needs it (annotate
    what it returns: ``net: NodeNetwork = require(ctx, "node_network")``). FaultError unless
    ``ctx``'s class offers it (``offers``); a context that declares no ``offers`` (a test
    double) is taken at its word where it has the protocol's methods."""
    offers = getattr(ctx, "offers", None)
    if offers is not None:
        if name not in offers:
            raise not_offered(ctx, name, what)
    elif not all(hasattr(ctx, m) for m in CONTEXT_CAPABILITIES[name].methods()):
        raise not_offered(ctx, name, what)
    return ctx
