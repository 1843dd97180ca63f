"""The target contract: how a job is launched and addressed, whatever runs its nodes.

Every way of running a job — torchrun agents on this host (``local``), one container per node
(``docker``), a job that is already running (``attach``) — implements ``Target`` below. The
engine, the faults, the Chaos Toolkit extension and the golden run talk to a job only through
it. Each method's docstring is the contract (in the style of a pluggy hookspec): what it must
do, what it returns, what it raises. Faults see the narrower ``FaultContext``
(``faultlab.fault_api.context``), which every ``Target`` is, plus the context capabilities its
class ``offers`` (``node_network``, ``slurm_controller`` ...), each a protocol of that module:
the experiment loader refuses a fault that needs one the launcher's target does not offer.

``JobContext`` implements the addressing half for any job whose nodes are process trees this
host can see: a node is its torchrun agent's pid (by node name), ranks are mapped to processes
from the job's own ``start`` events, and nothing outside the job's process tree is ever
signalled (``assert_owned`` is checked before every signal).

This module may import ``faultlab.errors``, ``faultlab.observe`` and ``faultlab.runtime`` (and,
for type hints only, ``faultlab.spec``); no target imports the engine, and none imports a
trainer.
"""

from __future__ import annotations

import os
import random
import signal
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import psutil
from pydantic import BaseModel

from faultlab.errors import FaultError
from faultlab.observe import EventStream
from faultlab.targets.procs import process_tree, send_pid, signal_tree

if TYPE_CHECKING:
    from faultlab.spec import Experiment
    from faultlab.spec.target import TargetSpec, Topology

__all__ = ["JobContext", "JobResult", "Target"]


class Target(Protocol):
    """One job under test. The engine calls ``start`` once, polls ``finished`` and the
    ``stream``, injects through the ``FaultContext`` methods, and calls ``stop`` exactly once
    on every exit path (an exception and Ctrl-C included)."""

    # -- what it offers faults beyond the core -----------------------------------------------

    offers: ClassVar[frozenset[str]]
    """The context capabilities this target class offers beyond the core ``FaultContext``
    (names of ``faultlab.fault_api.context.CONTEXT_CAPABILITIES``), read from the class when an
    experiment loads: a fault that ``needs`` one it lacks is refused there, with the launchers
    that offer it. For each capability that has a protocol (``NodeNetwork`` ...) the target
    implements its methods. A subclass inherits its base's: a target that cannot keep one of
    them sets its own. Empty (``JobContext``'s): the core only."""

    settings: ClassVar[type[BaseModel] | None]
    """The model of the target's own settings (as ``Fault.Params`` is a fault's), written in
    the experiment as the block ``topology.<launcher name>:`` (Slurm's ``topology.slurm:``,
    ``SlurmSettings``): parsed when the experiment loads, its errors located at file:line like
    every spec error, into ``exp.topology.settings`` (the defaults where the block is absent).
    A block for another launcher than the one named is a located error. None
    (``JobContext``'s): the target has no settings, and a block for it is an error."""

    launch_lines: ClassVar[bool]
    """Whether the nodes start with a launch line (``target.launch``, or faultlab's launcher
    for the reference trainer). False: the target starts them its own way (Slurm's batch
    script), ``TargetSpec.launch_line`` is None and ``check_launch`` refuses a ``launch``."""

    @classmethod
    def check_launch(cls, target: TargetSpec, topology: Topology
                     ) -> list[tuple[tuple[str | int, ...], str]]:
        """The problems of the experiment's launch line (``target.launch``, ``services``) for
        this target, known when the experiment loads: ``(yaml path under the experiment,
        message)`` each, e.g. ``(("target", "launch", 3), "...")``; the loader locates them
        at file:line. ``JobContext``'s: none. The built-ins check what their nodes need of a
        line (``faultlab.spec.launch.line_problems``: addressing, the store, the services'
        ports; docker: a line that runs inside a container)."""

    # -- where events and logs are -------------------------------------------------------------

    run_dir: Path
    """The job's run directory as this host sees it: ``events/`` (JSON lines, the event
    protocol: one file per node relay, or per process outside the engine), ``logs/`` (one log
    per node), ``launch.json``."""
    stream: EventStream
    """The job's event stream (``run_dir/events``), polled by whoever drives the job."""

    def log_tail(self, num_lines: int = 50) -> str:
        """The last ``num_lines`` lines of every node's log, for a failure message."""

    def describe(self) -> str:
        """The exact command lines of every node, for a person reproducing a run by hand."""

    # -- start, poll, stop, result ----------------------------------------------------------

    @classmethod
    def prepare_run_dir(cls, exp: Experiment, run_folder: Path) -> Path:
        """The ``run_dir`` a launch of ``exp`` is given, for the report's ``run_folder``, ready
        before the target is built (the engine writes the ranks' settings there first):
        ``run_folder/job`` where the nodes see this host's files; a target whose nodes see
        another filesystem creates the directory there and links it as ``run_folder/job``.
        Raises ``TargetError`` naming the setting at fault if it cannot."""

    @classmethod
    def reference_site(cls, exp: Experiment) -> dict[str, Any]:
        """Where a job of ``exp`` computes its bits, as known before it runs, over what the
        engine reads on this host (``faultlab.runtime.site``: accelerator and count, driver,
        torch, CUDA, NCCL): ``{}`` where the nodes are this host's, else the nodes' own site
        and what else decides the bits (Slurm: the cluster, and the site its nodes last
        reported). Part of the golden run's cache key; it runs nothing (``faultlab validate``
        reads it).

        Optional, for a target whose nodes are elsewhere (the engine asks with ``getattr``):
        ``probe_site(cls, exp) -> None``, called before a golden run is looked up, learns the
        nodes' site by running something small there (Slurm: one ``srun``), and raises
        ``TargetError`` naming the setting at fault where a job cannot run; ``site_seen(cls,
        exp, site, source) -> bool`` is told the site a run's rank 0 reported (a golden run's,
        or a run that met other hardware than its reference) and returns whether that changed
        what ``reference_site`` answers.

        Optional too: ``preflight(cls, exp) -> list[(yaml path, message)]``, what stops a job
        of ``exp`` before it runs, known without launching anything (``faultlab validate`` and
        ``faultlab run`` refuse it, located: Slurm's run directory the nodes do not share, a
        partition too small ...). And ``unavailable(cls) -> str | None``: why no job of this
        target can start on this machine at all (docker: no engine answers), for tests
        (``faultlab.testing.require_target`` skips with it)."""

    @classmethod
    def golden_cache_dir(cls, exp: Experiment, default: Path) -> Path:
        """Where golden runs of ``exp`` are cached when the caller names no cache: ``default``
        (the report directory's) where the nodes see this host's files, or a directory every
        submit host of the target sees (Slurm: the shared runs root)."""

    @classmethod
    def code_files(cls, exp: Experiment) -> list[Path]:
        """Files of the target's own whose content is part of what the job computes (Slurm:
        the team's batch script): hashed into the golden run's code version."""

    def start(self) -> None:
        """Launch the job and return once every node was started (not once ranks run).
        Raises ``TargetError`` with the reason if it cannot; whatever did start is stopped."""

    def finished(self) -> bool:
        """True once every node has exited (exited nodes are reaped, never left as zombies)."""

    def result(self) -> JobResult:
        """Exit code of every node, the nodes lost on purpose, and the wall time so far."""

    def stop(self) -> None:
        """Stop and reap everything the job started — stopped processes are continued first,
        paused nodes thawed, containers and networks removed. Idempotent; never raises for
        what is already gone."""

    # -- nodes and ranks -------------------------------------------------------------------

    def node_names(self) -> list[str]:
        """The job's nodes in launch order, ``node0`` ...; a lost node keeps its name."""

    def ranks(self) -> list[int]:
        """Ranks of the job's current incarnation (from its ``start`` events, else from its
        workers' environment: torchrun's ``RANK``)."""

    def node_of_rank(self, rank: int) -> str:
        """The node currently holding ``rank``; FaultError if it has not started."""

    def rank_pid(self, rank: int) -> int:
        """This host's pid of the process running ``rank`` now; FaultError if none."""

    def node_pids(self, node: str) -> list[int]:
        """Every live process of ``node`` that belongs to the job (agent and workers)."""

    def worker_ranks(self) -> dict[int, tuple[str, int]]:
        """Rank → (node, pid) of every live worker on this host, from the environment its
        launcher gave it (torchrun's ``RANK``)."""

    def pids(self) -> set[int]:
        """Every live process of the job, on every node, and its helpers (the store)."""

    # -- how a signal reaches a process on a node -----------------------------------------

    def assert_owned(self, pid: int) -> None:
        """FaultError unless ``pid`` is a live process of this job."""

    def signal(self, pid: int, sig: int) -> bool:
        """Send ``sig`` to one process of the job (``assert_owned`` first); False if it was
        already gone. A target whose nodes are remote delivers it on the node."""

    def kill_node(self, node: str, sig: int) -> list[int]:
        """Signal a node's agent and every worker at once, as a machine loss would; the node's
        exit code is then not held against the result. Returns the pids signalled."""

    def continue_all(self) -> None:
        """SIGCONT every process of the job: nothing may be left stopped."""

    # -- how a file on a node is read or damaged ---------------------------------------------

    def host_path(self, path: Path, node: str | None = None) -> Path:
        """Where faultlab, on this host, reads and writes the file a node sees at ``path``
        (a checkpoint on the job's shared filesystem). FaultError where this host cannot reach
        that node's files."""

    def checkpoints(self) -> list[tuple[int | None, Path]]:
        """The job's checkpoints that still exist, oldest first, as ``(step, host path)``:
        those its ``checkpoint_saved`` events name (any trainer's saves, seen by the runtime
        agent), else the ``step_N`` directories of ``run_dir/checkpoints``."""

    # -- what the engine asks of every target (``JobContext`` answers "nothing") ----------------

    def guard_record(self) -> dict[str, Any] | None:
        """What the guard (``faultlab.reaper``) must remove or undo if faultlab itself dies,
        JSON-able (docker: the run's label, naming its containers, network and image; Slurm:
        the job id and the nodes a fault set down); None: nothing outside the job's process
        tree. Asked before ``start`` and kept current by the engine's tick after it, so it
        names everything the target may create that is known before start; a target that
        changes something outside the job mid-run calls ``guard_now()`` before the change,
        so the record is written at once rather than at the next tick."""

    guard_writer: Callable[[], None] | None
    """Set by the engine before ``start``: writes ``guard_record()`` for the guard now. A
    ``JobContext`` calls it through ``guard_now()``."""

    @classmethod
    def undo_from_guard(cls, record: dict[str, Any]) -> list[str]:
        """Remove and undo what ``record`` (a ``guard_record``) names. Run by the guard in a
        fresh process of its own after faultlab died (nothing of the run's objects is left
        but the record): idempotent, never raises for what is already gone, and returns one
        line per thing it did, for the guard's report."""

    def launch_summary(self) -> dict[str, Any] | None:
        """Which launch line started the nodes and what faultlab filled in (the journal's
        ``run.launch``); None where the target has no launch line of its own (Slurm's batch
        script, an attached job)."""

    def scheduler_view(self) -> dict[str, Any] | None:
        """What the scheduler saw of the job (Slurm: requeues, node states), for the metrics;
        None where there is no scheduler."""

    def attach_hub(self, hub: Any) -> str | None:
        """Before ``start``: the node relays push to ``hub`` (``faultlab.engine.hub``). The
        target gives the nodes ``FAULTLAB_HUB`` at the address they reach this host at and
        returns None; or it returns why it cannot, and the nodes use the file channel."""


class JobResult(Protocol):
    """What ``Target.result`` returns (``faultlab.targets.launcher.JobResult``)."""

    returncodes: dict[str, int | None]
    killed: set[str]
    wall_s: float

    @property
    def ok(self) -> bool:
        """Every node not lost on purpose exited 0."""


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
    offers: ClassVar[frozenset[str]] = frozenset()
    """The core ``FaultContext`` only: a subclass names the capabilities it adds (``Target``).
    Where it offers none, the capability methods below raise FaultError."""

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

    # -- what the engine asks of every target (``Target``), with the answer "nothing" --------

    settings: ClassVar[type[BaseModel] | None] = None
    launch_lines: ClassVar[bool] = True
    guard_writer: Callable[[], None] | None = None
    """Set by the engine before ``start``: writes the guard's record now (``guard_now``)."""

    @classmethod
    def check_launch(cls, target: TargetSpec, topology: Topology
                     ) -> list[tuple[tuple[str | int, ...], str]]:
        return []

    def guard_record(self) -> dict[str, Any] | None:
        return None

    @classmethod
    def undo_from_guard(cls, record: dict[str, Any]) -> list[str]:
        return []

    def guard_now(self) -> None:
        """Have the engine write ``guard_record()`` for the guard at once (before a change
        outside the job), not at its next tick; nothing outside the engine."""
        if self.guard_writer is not None:
            self.guard_writer()

    def launch_summary(self) -> dict[str, Any] | None:
        return None

    def scheduler_view(self) -> dict[str, Any] | None:
        return None

    def attach_hub(self, hub: Any) -> str | None:
        """A target that gives its nodes no hub address: the file channel."""
        return f"{type(self).__name__} gives its nodes no address of this host"

    # -- FaultContext ---------------------------------------------------------------------------

    def rng(self, key: str) -> random.Random:
        return random.Random(f"{self.seed}/{key}")

    def ranks(self) -> list[int]:
        self.refresh()
        return self.stream.current_ranks() or sorted(self.worker_ranks())

    def rank_pid(self, rank: int) -> int:
        self.refresh()
        start = self.stream.latest_start(rank)
        pid = None if start is None else self._host_pid(start)
        if pid is None and rank in (workers := self.worker_ranks()):
            return workers[rank][1]  # no (live) start record: the worker's own environment
        if start is None:
            raise FaultError(f"rank {rank} has not started (yet); ranks seen: "
                             f"{self.stream.current_ranks() or 'none'}")
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
            if rank in (workers := self.worker_ranks()):
                return workers[rank][0]
            raise FaultError(f"rank {rank} has not started (yet)")
        return str(start["node"])

    def worker_ranks(self) -> dict[int, tuple[str, int]]:
        """Rank → (node, pid) of every live torchrun worker, read from the environment torchrun
        gave it (``RANK``, plus ``FAULTLAB_RANK_OFFSET`` where each node is a torchrun world of
        its own): what a job that writes no ``start`` events is addressed by. The
        topmost process with a rank counts (a data-loader worker inherits its rank's RANK)."""
        out: dict[int, tuple[str, int]] = {}
        for node, agent in self.agent_pids().items():
            tree = process_tree(agent)
            ranks: dict[int, int] = {}
            for proc in tree:
                try:
                    environ = proc.environ()
                except psutil.Error:
                    continue
                raw = environ.get("RANK", "")
                offset = environ.get("FAULTLAB_RANK_OFFSET", "0")  # a node that is its own world
                if raw.isdigit():
                    ranks[proc.pid] = int(raw) + (int(offset) if offset.isdigit() else 0)
            for proc in tree:
                rank = ranks.get(proc.pid)
                if rank is None:
                    continue
                try:
                    parent_rank = ranks.get(proc.ppid())
                except psutil.Error:
                    continue
                if parent_rank != rank:
                    out[rank] = (node, proc.pid)
        return out

    def node_pids(self, node: str) -> list[int]:
        return [p.pid for p in process_tree(self._agent_pid(node))]

    def kill_node(self, node: str, sig: int) -> list[int]:
        """Signal a node's agent and every worker at once (tree snapshotted first)."""
        return signal_tree(self._agent_pid(node), sig)

    def signal(self, pid: int, sig: int) -> bool:
        self.assert_owned(pid)
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return False
        return True

    def host_path(self, path: Path, node: str | None = None) -> Path:
        # Every node of a job on this host (processes, or containers with the run directory
        # bind-mounted at the same path) sees the files where this host does.
        return Path(path)

    def checkpoints(self) -> list[tuple[int | None, Path]]:
        self.refresh()
        by_path: dict[str, tuple[int | None, float]] = {}
        for e in self.stream.of_kind("checkpoint_saved"):
            if isinstance(e.get("path"), str):
                step = e.get("step")
                by_path[e["path"]] = (step if isinstance(step, int) else None, float(e["t"]))
        found = [(step, t, self.host_path(Path(path))) for path, (step, t) in by_path.items()]
        found = [f for f in found if f[2].exists()]
        if found:  # by step where known, else by when it was saved
            found.sort(key=lambda f: (f[0] is None, f[0] or 0, f[1]))
            return [(step, path) for step, _t, path in found]
        from faultlab.runtime.manifest import list_checkpoints

        root = self.host_path(self.run_dir / "checkpoints")
        return [(step, path) for step, path in reversed(list_checkpoints(root))]

    def log_tail(self, num_lines: int = 50) -> str:
        out = []
        for log in sorted((self.run_dir / "logs").glob("node*.log")):
            lines = log.read_text(errors="replace").splitlines()[-num_lines:]
            out.append(f"--- {log} (last {len(lines)} lines)\n" + "\n".join(lines))
        return "\n".join(out)

    def runtime(self, rank: int, message: dict[str, Any]) -> dict[str, Any]:
        """Send ``message`` to ``rank``'s runtime agent over its control channel (the secret is
        the job's ``runtime/secret``, written at launch); raises FaultError if unreachable."""
        reply = self.runtime_many({rank: message})[rank]
        if isinstance(reply, FaultError):
            raise reply
        return reply

    def runtime_many(self, messages: dict[int, dict[str, Any]]
                     ) -> dict[int, dict[str, Any] | FaultError]:
        """Send each rank its message: through the node relays where the hub knows the rank
        (one message per node, ``faultlab.engine.hub``), else straight to the rank's control
        server (its address file on the run directory). Each value is the agent's reply, or
        the FaultError that says why there is none."""
        from faultlab.runtime.client import RuntimeControlError, read_secret, send

        out: dict[int, dict[str, Any] | FaultError] = {}
        hub = self.stream.hub
        rest = list(messages)
        if hub is not None:
            replies, rest = hub.control(messages)
            for rank, reply in replies.items():
                out[rank] = FaultError(f"rank {rank}: {reply['unreachable']}") \
                    if "unreachable" in reply else reply
        if not rest:
            return out
        secret = read_secret(self.run_dir)
        for rank in rest:
            if secret is None:
                out[rank] = FaultError(
                    f"no runtime control secret in {self.run_dir / 'runtime'}: the job was not "
                    f"launched by faultlab, so its ranks accept no live in-rank fault")
                continue
            try:
                out[rank] = send(self.run_dir, rank, secret, messages[rank])
            except RuntimeControlError as e:
                out[rank] = FaultError(str(e))
        return out

    def restart_node(self, node: str) -> int:
        raise self._not_offered("node_restart", f"starting {node} again")

    def mark_lost(self, node: str) -> None:
        self._agent_pid(node)

    # The methods of capabilities only some targets offer (``offers``; the docker target's
    # network and freezer): the experiment loader refuses a fault that needs one where it is
    # not offered, and a fault asks ``faultlab.fault_api.require`` before it calls one; this
    # is the last line, for a caller that did neither.
    def _not_offered(self, capability: str, what: str) -> FaultError:
        offered = ", ".join(sorted(self.offers)) or "the core only"
        return FaultError(f"{what} needs the {capability} capability, which "
                          f"{type(self).__name__} (the job in {self.run_dir}) does not offer "
                          f"(it offers: {offered})")

    def pause_node(self, node: str) -> None:
        raise self._not_offered("node_freezer", "pausing a node")

    def unpause_node(self, node: str) -> bool:
        raise self._not_offered("node_freezer", "unpausing a node")

    def node_address(self, node: str) -> str | None:
        raise self._not_offered("node_network", "a node's address")

    def node_netns_pid(self, node: str) -> int:
        raise self._not_offered("node_network", "a node's network namespace")

    def store_address(self) -> str:
        raise self._not_offered("node_network", "the rendezvous store's address")

    def disconnect_node(self, node: str) -> None:
        raise self._not_offered("node_network", "disconnecting a node")

    def connect_node(self, node: str) -> bool:
        raise self._not_offered("node_network", "connecting a node")

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
            send_pid(pid, signal.SIGCONT)

    def _agent_pid(self, node: str) -> int:
        agents = self.agent_pids()
        if node not in agents:
            raise FaultError(f"no node {node!r} in the job in {self.run_dir}; nodes are "
                             f"{', '.join(agents) or 'none'}")
        return agents[node]
