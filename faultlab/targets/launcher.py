"""Launch a local elastic job: N torchrun agents ("nodes") on this host, one rendezvous store.

    faultlab launch --nodes 3 --min-nodes 2 --run-dir runs/demo -- \\
        python -m reference_trainer.train --preset tiny --steps 40 --checkpoint-every 10

Any command torchrun can start is a job: each node is a torchrun agent in its own session with
its own workers, started with ``--no-python`` so the command is run as given, and every worker
finds its run directory in ``FAULTLAB_RUN_DIR``. The c10d rendezvous store is served by the
launching process itself, not by a node, so that no node's death takes the store with it, and
the agents are torchrun's own with a faster rendezvous poll (``faultlab.targets.torchrun_agent``).
The elastic pitfalls this works around are listed in ``node_environment`` and
``_start_rendezvous`` below (and in reference_trainer/README.md). ``LocalJob`` is the same
thing as a Python object, for tests and for the local and docker targets.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil

from faultlab.errors import LaunchError
from faultlab.runtime.relay import HUB_ENV
from faultlab.spec.launch import (
    TORCHRUN_DEFAULT,
    fill,
    launcher_index,
    node_worlds,
    placeholders_in,
    program,
    trainer_argv,
)
from faultlab.targets.procs import (
    die_with_parent,
    process_tree,
    send_pid,
    send_signal,
    signal_tree,
    tree_listens,
)
from faultlab.targets.services import ServiceError, Services

__all__ = ["JobResult", "LaunchError", "LocalJob", "main"]



@dataclass(slots=True)
class JobResult:
    returncodes: dict[str, int | None]
    """Exit code of each node's agent (negative: killed by that signal)."""
    killed: set[str]
    """Nodes that were killed on purpose (``kill_node``); their exit codes do not count."""
    wall_s: float

    @property
    def ok(self) -> bool:
        counted = [rc for name, rc in self.returncodes.items() if name not in self.killed]
        return bool(counted) and all(rc == 0 for rc in counted)


@dataclass(slots=True)
class _Node:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    cmd: list[str]


@dataclass(kw_only=True)
class LocalJob:
    """A local elastic job. Use as a context manager: leaving it always reaps every process.

    ``command`` is the job's whole command line (``["python", "train.py", ...]``), started by
    every node's torchrun agent as given (``--no-python``) in ``nproc_per_node`` workers.
    """

    command: list[str]
    """The trainer's command line, e.g. ``[sys.executable, "-m", "reference_trainer.train"]``."""
    run_dir: Path
    """The job's run directory: ``logs/`` and ``launch.json`` go here, and every worker gets it
    as ``FAULTLAB_RUN_DIR``."""
    nodes: int = 2
    procs_per_node: int = 1
    min_nodes: int | None = None
    max_restarts: int = 3
    last_call_timeout_s: int = 1
    """How long the rendezvous waits for more nodes once ``min_nodes`` have joined."""
    torchrun_defaults: bool = False
    """Plain torchrun as documented: agent-hosted store, default timeouts (benchmark baseline);
    the same as ``launch_line=TORCHRUN_DEFAULT``."""
    launch_line: tuple[str, ...] | None = None
    """The team's own launch line for every node (``faultlab.spec.launch``: placeholders
    filled per node and per launch, the command after it); None: faultlab's tuned agents and
    store. With a line, faultlab starts nothing of its own: the line's launcher runs the
    rendezvous (with c10d, the agent that binds the endpoint hosts the store: node 0, which is
    started first and listening before the others start, as on a cluster whose endpoint is
    node 0's address)."""
    env: dict[str, str] = field(default_factory=dict)
    node_env: dict[str, dict[str, str]] = field(default_factory=dict)
    """Extra environment of one node's agent and workers, by node name (``node0`` ...): e.g.
    each node's own cloud metadata endpoint."""
    services: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Processes the team runs beside the nodes (``target.services``: torchft's lighthouse),
    by name: started before the nodes with a free port each in ``{NAME_port}``, reaped with
    the job, untouched by a node's loss (``faultlab.targets.services``)."""
    hub_address: Callable[[str], str] | None = None
    """The engine's hub (``faultlab.engine.hub.Hub.address``): given the address the nodes
    reach this host at (``control_host``), where the node relays connect. None: no hub."""
    _nodes: list[_Node] = field(default_factory=list, init=False)
    _services: Services | None = field(default=None, init=False)
    _store: Any = field(default=None, init=False)
    """torch's ``TCPStore`` for the rendezvous, served from this process while the job runs."""
    _killed: set[str] = field(default_factory=set, init=False)
    _t0: float = field(default=0.0, init=False)
    _endpoint: str = field(default="", init=False)
    _conf: str = field(default="", init=False)
    _rdzv_id: str = field(default_factory=lambda: f"faultlab-{uuid.uuid4().hex[:12]}",
                          init=False)
    _master_port: int = field(default=0, init=False)
    filled: dict[str, str] = field(default_factory=dict, init=False)
    """Placeholder → what faultlab put there for this launch (``{node_rank}`` per node aside)."""

    def __post_init__(self) -> None:
        self.command = [str(a) for a in (self.command or [])]
        if not self.command:
            raise LaunchError("command: empty; give the trainer's command line")
        self.run_dir = Path(self.run_dir)
        if self.min_nodes is None:
            self.min_nodes = self.nodes
        if self.nodes < 1:
            raise LaunchError(f"--nodes: {self.nodes!r} must be >= 1")
        if self.procs_per_node < 1:
            raise LaunchError(f"--procs-per-node: {self.procs_per_node!r} must be >= 1")
        if not 1 <= self.min_nodes <= self.nodes:
            raise LaunchError(f"--min-nodes: {self.min_nodes!r} must be between 1 and "
                              f"--nodes ({self.nodes})")
        if self.max_restarts < 0:
            raise LaunchError(f"--max-restarts: {self.max_restarts!r} must be >= 0")
        if self.last_call_timeout_s < 0:
            raise LaunchError(f"--rdzv-last-call-s: {self.last_call_timeout_s!r} must be >= 0")
        if self.torchrun_defaults and self.launch_line is None:
            self.launch_line = TORCHRUN_DEFAULT
        if self.launch_line is not None:
            self.launch_line = tuple(str(a) for a in self.launch_line)
            if not self.launch_line:
                raise LaunchError("launch line: empty; give the launcher and its flags")

    @property
    def world_size(self) -> int:
        """The world size the job starts with."""
        return self.nodes * self.procs_per_node

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> LocalJob:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> LocalJob:
        self._t0 = time.monotonic()
        logs = self.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        try:
            endpoint, conf = self._start_rendezvous(self._store_host())
            if self.services:
                self._services = Services(self.services,
                                          free_port=lambda: _free_port(self._store_host()))
                self._services.start(logs, self.line_values(endpoint), _spawner().submit)
            self._start_nodes(endpoint, conf, logs)
        except ServiceError as e:
            self.stop()
            raise LaunchError(str(e)) from None
        except BaseException:
            self.stop()
            raise
        self._endpoint, self._conf = endpoint, conf
        self._write_launch_json(endpoint)
        return self

    def restart_node(self, node: str) -> int:
        """Start a node that is gone again (a replacement machine with the same name): a new
        agent joins the rendezvous and the job grows back at its next re-rendezvous. Returns
        the new agent's pid."""
        old = self._node(node)
        if self._alive(old):
            raise LaunchError(f"{node} is still running (pid {self._root_pid(old)})")
        index = self._nodes.index(old)
        self._retire(old)
        self._nodes[index] = self._spawn(index, self._endpoint, self._conf, self.run_dir / "logs")
        self._killed.discard(node)  # its new agent's exit code counts
        self._write_launch_json(self._endpoint)
        return self._root_pid(self._nodes[index])

    def mark_lost(self, node: str) -> None:
        """A node that left on purpose (preempted): its agent's exit code does not count."""
        self._node(node)
        self._killed.add(node)

    # -- what a job whose nodes are not local processes changes (the docker target's job) -----

    def _store_host(self) -> str:
        """The address the rendezvous store listens on, as the nodes reach it."""
        return "127.0.0.1"

    def _start_nodes(self, endpoint: str, conf: str, logs: Path) -> None:
        for i in range(self.nodes):  # one at a time: stop() reaps whatever did start
            self._nodes.append(self._spawn(i, endpoint, conf, logs))

    def _alive(self, n: _Node) -> bool:
        return n.popen.poll() is None

    def _root_pid(self, n: _Node) -> int:
        """The node's topmost process: its agent."""
        return n.popen.pid

    def _returncode(self, n: _Node) -> int | None:
        return n.popen.returncode

    def _retire(self, n: _Node) -> None:
        """Release what is left of a node that is gone before it is started again."""

    def _node_info(self, n: _Node) -> dict[str, object]:
        return {"node": n.name, "agent_pid": n.popen.pid, "log": str(n.log_path)}

    def _start_rendezvous(self, host: str = "127.0.0.1") -> tuple[str, str]:
        if self.launch_line is not None:  # the team's launcher runs its own rendezvous
            self._master_port = _free_port(host)
            return f"{host}:{_free_port(host)}", ""
        # The store is served from this process, by a thread of torch's that needs no GIL: not
        # a node, so no node's death takes it, and it ends with the job or with this process,
        # whose death ends the job anyway (the guard reaps it). It had a process of its own,
        # which cost every job 1.4 CPU-s of `import torch` (docs/development.md).
        from torch.distributed import TCPStore

        self._store = TCPStore(host, 0, is_master=True, wait_for_workers=False,
                               timeout=timedelta(seconds=60))
        port = self._store.port
        # is_host=false: no agent tries to host the store. A short last call: once min_nodes
        # are in, wait only this long for the rest (torchrun's default is 30 s). A dead node
        # stays a participant until it misses keep_alive_max_attempt heartbeats: 3 x 1 s here,
        # 3 x 5 s by default (measured: node-loss resume 16.0 s before, 7.6 s after).
        conf = (f"is_host=false,last_call_timeout={self.last_call_timeout_s},join_timeout=300,"
                f"keep_alive_interval=1,keep_alive_max_attempt=3")
        return f"{host}:{port}", conf

    def _spawn(self, index: int, endpoint: str, conf: str, logs: Path) -> _Node:
        """Start a node's agent from a thread that lives as long as this process: the agent's
        parent-death signal (PR_SET_PDEATHSIG) fires when the *thread* that forked it exits,
        and callers may be short-lived threads (a fault's timer, a Chaos Toolkit action)."""
        return _spawner().submit(self._start_node, index, endpoint, conf, logs).result()

    def _start_node(self, index: int, endpoint: str, conf: str, logs: Path) -> _Node:
        name = f"node{index}"
        env = {**os.environ, **self.node_environment(name)}
        cmd = self.node_command(index, endpoint, conf)
        log_path = logs / f"{name}.log"
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=die_with_parent)
        node = _Node(name, popen, log_path, cmd)
        if index == 0 and self.launch_line is not None and self.nodes > 1 and \
                not node_worlds(self.launch_line) and \
                placeholders_in(self.launch_line) & {"rdzv_endpoint", "master_port"}:
            self._await_first_listener(node, endpoint)
        return node

    def node_command(self, index: int, endpoint: str, conf: str) -> list[str]:
        """Node ``index``'s whole command line: faultlab's agent, or the team's line filled
        in (a target whose nodes are processes in another namespace wraps it)."""
        if self.launch_line is None:
            return [sys.executable, *self.agent_argv(endpoint, conf, "127.0.0.1")]
        return self.node_line(index, endpoint)

    def line_values(self, endpoint: str) -> dict[str, str]:
        """What faultlab puts in each placeholder of the launch line for this launch."""
        host = endpoint.rpartition(":")[0]
        nnodes = str(self.nodes) if self.min_nodes == self.nodes else \
            f"{self.min_nodes}:{self.nodes}"
        return {"run_dir": str(self.run_dir.resolve()), "nnodes": nnodes,
                "num_nodes": str(self.nodes), "min_nodes": str(self.min_nodes),
                "nproc_per_node": str(self.procs_per_node),
                "max_restarts": str(self.max_restarts), "rdzv_endpoint": endpoint,
                "rdzv_id": self._rdzv_id, "master_addr": host,
                "master_port": str(self._master_port),
                **(self._services.values() if self._services is not None else {})}

    def node_line(self, index: int, endpoint: str) -> list[str]:
        """Node ``index``'s command: the launch line filled in, then the trainer's command."""
        assert self.launch_line is not None
        host = endpoint.rpartition(":")[0]
        values = {**self.line_values(endpoint), "node_rank": str(index)}
        if node_worlds(self.launch_line):  # local nodes only (the spec refuses it elsewhere)
            port = _free_port(host)  # a new one for a restarted node
            values |= {"node_master_port": str(port), "node_rdzv_endpoint": f"{host}:{port}"}
        used = placeholders_in(self.launch_line)
        self.filled = {k: v for k, v in values.items()
                       if k in used and k not in ("node_rank", "node_master_port",
                                                  "node_rdzv_endpoint")}
        line = fill(self.launch_line, values)
        line[0] = program(line[0]) or line[0]
        at = launcher_index(line)  # behind an env VAR=value prefix: the launcher itself
        if 0 < at < len(line):
            line[at] = program(line[at]) or line[at]
        return [*line, *trainer_argv(self.launch_line, self.command, (sys.executable,))]

    def _await_first_listener(self, node: _Node, endpoint: str, timeout_s: float = 60) -> None:
        """Wait until node 0's launcher listens on the rendezvous port (it hosts the store),
        so that node 0 is the host on every launch, as on a cluster whose endpoint is node
        0's address; with every agent on this host, any of them could bind it first. Only a
        line with ``{rdzv_endpoint}`` or ``{master_port}`` is waited on: a rendezvous outside
        the nodes (an etcd or a store run as a ``target.services`` entry, ``is_host=false``)
        has no node that listens, and waiting held node 1 back for the whole ``timeout_s``,
        so the job trained on one node and passed (seen by issue 38's probe)."""
        ports = {int(endpoint.rpartition(":")[2]), self._master_port}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and node.popen.poll() is None:
            if tree_listens(node.popen.pid, ports):
                return
            time.sleep(0.05)

    def node_environment(self, name: str) -> dict[str, str]:
        """What a node's agent (and so its workers) gets on top of the launcher's environment."""
        world = self.nodes * self.procs_per_node
        env = {**self.env, **self.node_env.get(name, {}),
               "FAULTLAB_NODE": name, "FAULTLAB_RUN_DIR": str(self.run_dir),
               "PYTHONUNBUFFERED": "1",
               "OMP_NUM_THREADS": rank_threads(world)}
        if self.launch_line is not None and node_worlds(self.launch_line):
            # every node is a torchrun world of its own whose ranks start at RANK 0: number
            # them across the job as torchft's global_rank does (faultlab.runtime.records)
            env["FAULTLAB_RANK_OFFSET"] = str(int(name.removeprefix("node")) *
                                              self.procs_per_node)
            env["FAULTLAB_WORLD_SIZE"] = str(world)
        if self.hub_address is not None:
            env[HUB_ENV] = self.hub_address(self.control_host())
        if self.launch_line is None:
            # torch 2.13: when the node holding group rank 0 dies, survivors disagree on
            # MASTER_PORT if the rendezvous store is shared with the workers, and hang.
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        return env

    def control_host(self) -> str:
        """The address the nodes reach faultlab's host at: loopback for local nodes."""
        return "127.0.0.1"

    def agent_argv(self, endpoint: str, conf: str, local_addr: str) -> list[str]:
        """A node's agent command line after the interpreter (``-m ...``)."""
        cmd = ["-m", "faultlab.targets.torchrun_agent",
               "--nnodes", f"{self.min_nodes}:{self.nodes}",
               "--nproc-per-node", str(self.procs_per_node),
               "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
               "--rdzv-id", self._rdzv_id,
               "--max-restarts", str(self.max_restarts),
               "--local-addr", local_addr]
        if conf:
            cmd += ["--rdzv-conf", conf, "--monitor-interval", "0.1"]
        return [*cmd, "--no-python", *self.command]

    def _launch_info(self, endpoint: str) -> dict[str, object]:
        return {
            "rdzv_endpoint": endpoint, "rdzv_id": self._rdzv_id,
            "nodes": [self._node_info(n) for n in self._nodes],
            "procs_per_node": self.procs_per_node, "min_nodes": self.min_nodes,
            "max_restarts": self.max_restarts, "launcher_pid": os.getpid(),
            "started_t": time.time(),
            "launch": "faultlab" if self.launch_line is None else list(self.launch_line),
            "filled": self.filled,
            "services": self._services.info() if self._services is not None else [],
        }

    def _write_launch_json(self, endpoint: str) -> None:
        info = self._launch_info(endpoint)
        path = self.run_dir / "launch.json"
        path.with_suffix(".tmp").write_text(json.dumps(info, indent=1))
        os.replace(path.with_suffix(".tmp"), path)

    # -- observing and breaking --------------------------------------------------------------

    def describe(self) -> str:
        """The exact agent command lines, for a person reproducing a failure by hand."""
        services = self._services.describe() if self._services is not None else []
        return "\n".join([*services, *(f"{n.name}: FAULTLAB_NODE={n.name} {shlex.join(n.cmd)}"
                                       for n in self._nodes)])

    def log_tail(self, num_lines: int = 50) -> str:
        """The last lines of every node's log (agent and workers)."""
        out = []
        for n in self._nodes:
            lines = n.log_path.read_text(errors="replace").splitlines()[-num_lines:]
            out.append(f"--- {n.log_path} (last {len(lines)} lines)\n" + "\n".join(lines))
        return "\n".join(out)

    def node_names(self) -> list[str]:
        return [n.name for n in self._nodes]

    def agent_pid(self, node: str) -> int:
        return self._root_pid(self._node(node))

    def worker_pids(self, node: str) -> list[int]:
        """Current worker processes of a node (children of its agent)."""
        try:  # torchrun starts each worker as a direct child of the agent
            return [p.pid for p in psutil.Process(self.agent_pid(node)).children()]
        except psutil.NoSuchProcess:
            return []

    def pids(self) -> set[int]:
        """Every live process of the job: agents, workers and their children, services."""
        out = {p.pid for n in self._nodes for p in process_tree(self._root_pid(n))}
        if self._services is not None:
            out |= self._services.pids()
        return out

    def service_names(self) -> list[str]:
        return self._services.names() if self._services is not None else []

    def kill_service(self, name: str, sig: int = signal.SIGKILL) -> list[int]:
        """Kill a service the team runs beside the nodes (and whatever it started)."""
        if self._services is None:
            raise KeyError(f"no service {name!r}: this job runs none")
        return self._services.kill(name, sig)

    def kill_node(self, node: str, sig: int = signal.SIGKILL) -> list[int]:
        """Kill a node as a machine loss would: its agent and every worker at once."""
        self._killed.add(node)
        return signal_tree(self.agent_pid(node), sig)

    def poll(self) -> bool:
        """True once every agent has exited (each one is reaped: no zombie lingers)."""
        return all([not self._alive(n) for n in self._nodes])

    def wait(self, timeout_s: float | None = None) -> JobResult:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self.poll():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job in {self.run_dir} still running after {timeout_s} s")
            time.sleep(0.05)
        self._stop_store()
        return self.result()

    def result(self) -> JobResult:
        return JobResult(returncodes={n.name: self._returncode(n) for n in self._nodes},
                         killed=set(self._killed), wall_s=time.monotonic() - self._t0)

    def stop(self, grace_s: float = 5.0) -> None:
        """Reap everything: agents, workers (stopped ones too); stop the store. Idempotent."""
        procs: list[psutil.Process] = []
        for n in self._nodes:
            procs += process_tree(n.popen.pid)
        for p in procs:  # a SIGSTOPped worker must run to act on SIGTERM
            send_signal(p, signal.SIGCONT)
        for n in self._nodes:
            if n.popen.poll() is None:
                send_pid(n.popen.pid, signal.SIGTERM)  # the agent stops its own workers
        _gone, alive = psutil.wait_procs(procs, timeout=grace_s)
        for p in alive:
            send_signal(p, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=5)
        for n in self._nodes:
            try:
                n.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._stop_store()

    def _stop_store(self) -> None:
        if self._services is not None:
            self._services.stop()
        self._store = None  # its last reference: torch stops serving it

    def _node(self, name: str) -> _Node:
        for n in self._nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node {name!r}; nodes are {', '.join(self.node_names())}")


def rank_threads(world: int) -> str:
    """``OMP_NUM_THREADS`` of each rank: faultlab's own, when it is set (a host that runs other
    jobs beside this one, as the test suite's three workers on two cores do: a lone rank's two
    OpenMP threads spun against the other jobs and cost three times its CPU), else the host's
    cores shared among the job's ranks."""
    return os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // world))


def _free_port(host: str) -> int:
    import socket

    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


_SPAWNER: ThreadPoolExecutor | None = None


def _spawner() -> ThreadPoolExecutor:
    global _SPAWNER
    if _SPAWNER is None:
        _SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="localjob-spawn")
    return _SPAWNER


class _OneLineParser(argparse.ArgumentParser):
    """Usage errors are one line on stderr and exit code 2 (no usage dump)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def launch_parser() -> argparse.ArgumentParser:
    """The options of ``faultlab launch`` (before its ``--``; the command follows it)."""
    p = _OneLineParser(
        prog="faultlab launch", description=__doc__.splitlines()[0],
        usage="faultlab launch [options] --run-dir DIR -- COMMAND [ARG ...]")
    p.add_argument("--run-dir", type=Path, required=True, help="where events, checkpoints and "
                   "logs go (the job finds it in FAULTLAB_RUN_DIR); the same directory resumes")
    p.add_argument("--nodes", type=int, default=2, help="torchrun agents to start (default 2)")
    p.add_argument("--procs-per-node", type=int, default=1, help="workers per node (default 1)")
    p.add_argument("--min-nodes", type=int, default=None,
                   help="fewest nodes the job runs on after losing some (default: --nodes)")
    p.add_argument("--max-restarts", type=int, default=3, help="worker-group restarts allowed")
    p.add_argument("--rdzv-last-call-s", type=int, default=1, help="after --min-nodes joined, "
                   "wait this long for the others (torchrun's default: 30)")
    p.add_argument("--torchrun-defaults", action="store_true",
                   help="plain torchrun: agent-hosted store, default timeouts (for comparison)")
    p.add_argument("--timeout-s", type=float, default=None, help="stop the job after this long")
    return p


def main(argv: list[str] | None = None) -> int:
    """``faultlab launch``: run a command as a local elastic job until it ends. Exit codes: 0
    every counted node exited 0, 1 otherwise, 2 bad arguments, 124 timeout, 130 interrupted."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = launch_parser()
    own, sep, command = _split_command(argv)
    args = parser.parse_args(own)
    if not sep or not command:
        parser.error("give the job's command after --, e.g. -- python train.py")
    try:
        job = LocalJob(command=command, run_dir=args.run_dir, nodes=args.nodes,
                       procs_per_node=args.procs_per_node, min_nodes=args.min_nodes,
                       max_restarts=args.max_restarts, last_call_timeout_s=args.rdzv_last_call_s,
                       torchrun_defaults=args.torchrun_defaults)
    except LaunchError as e:
        parser.error(str(e))
        return 2

    def on_term(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    print(f"launching {args.nodes} node(s) x {args.procs_per_node} proc(s) in {args.run_dir}",
          flush=True)
    try:
        with job:
            result = job.wait(timeout_s=args.timeout_s)
    except LaunchError as e:
        print(f"faultlab launch: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: every process of the job was stopped", file=sys.stderr)
        return 130
    except TimeoutError as e:
        print(f"timeout: {e}; every process of the job was stopped", file=sys.stderr)
        return 124
    codes = ", ".join(f"{k}={v}" for k, v in result.returncodes.items())
    print(f"job {'finished' if result.ok else 'FAILED'} in {result.wall_s:.1f} s ({codes})")
    return 0 if result.ok else 1


def _split_command(argv: list[str]) -> tuple[list[str], bool, list[str]]:
    """``faultlab launch``'s own flags, whether ``--`` was given, and the job's command."""
    if "--" not in argv:
        return argv, False, []
    i = argv.index("--")
    return argv[:i], True, argv[i + 1:]


if __name__ == "__main__":
    sys.exit(main())
