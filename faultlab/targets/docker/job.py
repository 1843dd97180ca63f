"""A local elastic job whose nodes are Docker containers: ``DockerJob``.

Same contract as ``faultlab.targets.launcher.LocalJob`` (it is one, with the nodes swapped):
one launcher per node, every process and every engine object reaped on ``stop``. Under
faultlab's tuned launcher (``launch: faultlab``) each node runs faultlab's torchrun agent and the
rendezvous store lives in a process of its own *outside* the nodes; under the team's line
(``launch: torchrun`` or their own) each container runs that line as the team runs it on a
machine, and its rendezvous is the line's own: with c10d, the store lives in node 0's agent,
inside node 0's container. What changes from local nodes:

- each node is a container (``faultlab-<run>-nodeN``, hostname ``nodeN``) on a bridge network
  of the run's own, created ``internal`` (no route off the host) — so a node has its own
  address, loses it when it is disconnected, and vanishes with it when killed;
- every node's hostname (``nodeN``) is also its alias on the run's network, so it resolves in
  every node: torchrun advertises ``socket.getfqdn()`` (the hostname) to its peers, and the
  team's line meets at ``{rdzv_endpoint}`` = ``node0:29400`` (``{master_addr}`` ``node0``,
  ``{master_port}`` 29500): torchrun's default ports, free in a network namespace of the run's
  own;
- faultlab's store listens on the network's gateway address (the host's side of the bridge),
  the only address of the host the containers can reach;
- containers run the host's interpreter and virtual environment, bind-mounted read-only at the
  same paths, and the run directory read-write, with the caller's uid/gid; a minimal init
  (``--init``) is PID 1 and the agent its child;
- ranks log ``pid`` in their container's PID namespace; ``host_pid`` maps it back.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faultlab.errors import TargetError
from faultlab.spec.launch import docker_node_paths
from faultlab.targets.docker.engine import (
    LABEL,
    RUN_LABEL,
    build_image,
    connect,
    remove_run,
)
from faultlab.targets.launcher import LaunchError, LocalJob
from faultlab.targets.procs import pid_alive, process_tree, signal_tree

__all__ = ["DockerJob", "host_mounts", "listening_ports"]

RDZV_PORT = 29400
"""The team's line's rendezvous port in node 0's container (torchrun's default)."""
MASTER_PORT = 29500
"""The team's line's static master port (torch's default)."""
UNPAUSE_SETTLE_S = 10.0
"""How long ``unpause_node`` waits for the engine to stop reporting the container paused."""


@dataclass(slots=True)
class _DockerNode:
    name: str
    container: Any
    log_path: Path
    cmd: list[str]
    init_pid: int
    exit_code: int | None = None


def listening_ports(pid: int) -> set[int]:
    """The TCP ports something listens on in the network namespace of process ``pid``."""
    out = set()
    for table in ("tcp", "tcp6"):
        try:
            rows = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 3 and fields[3] == "0A":  # TCP_LISTEN
                out.add(int(fields[1].rsplit(":", 1)[1], 16))
    return out


def host_mounts(run_dir: Path) -> dict[str, dict[str, str]]:
    """Bind mounts of a node: the host's ``/usr``, Python, virtual environment, this project
    and the working directory read-only, the run directory read-write (same paths inside)."""
    ro = [*docker_node_paths(), "/etc/ld.so.cache"]
    mounts: dict[str, dict[str, str]] = {}
    for path in sorted({p for p in ro if p and Path(p).exists()}):
        if path == "/" or any(path.startswith(m.rstrip("/") + "/") for m in mounts):
            continue
        mounts[path] = {"bind": path, "mode": "ro"}
    mounts[str(run_dir)] = {"bind": str(run_dir), "mode": "rw"}
    return mounts


@dataclass(kw_only=True)
class DockerJob(LocalJob):
    """A ``LocalJob`` with one container per node. Use as a context manager."""

    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    _client: Any = field(default=None, init=False)
    _network: Any = field(default=None, init=False)
    _image: str = field(default="", init=False)
    _gateway: str = field(default="", init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.run_dir = self.run_dir.resolve()  # the ranks find it at the same path inside

    # -- LocalJob's hooks --------------------------------------------------------------------

    def _store_host(self) -> str:
        """The run's image and network first: the store listens on the network's gateway."""
        self._client = connect()
        self._image = build_image(self._client, self.run_id)
        self._network = self._client.networks.create(
            f"faultlab-{self.run_id}", driver="bridge", internal=True,
            labels={LABEL: "1", RUN_LABEL: self.run_id})
        self._network.reload()
        self._gateway = self._network.attrs["IPAM"]["Config"][0]["Gateway"].split("/")[0]
        return self._gateway

    def control_host(self) -> str:
        """The host's address on the run's network: where the node relays reach the hub."""
        return self._gateway

    def _start_rendezvous(self, host: str = "127.0.0.1") -> tuple[str, str]:
        """The team's line runs its own rendezvous at node 0 (by its name on the run's
        network); faultlab's launcher, a store of its own on the gateway."""
        if self.launch_line is None:
            return super()._start_rendezvous(host)
        self._master_port = MASTER_PORT
        return f"node0:{RDZV_PORT}", ""

    def _start_nodes(self, endpoint: str, conf: str, logs: Path) -> None:
        # In parallel (a container takes seconds to start); one that fails to start is still
        # removed by stop(), by its label. Under the team's line node 0 first, until its
        # launcher listens: until then its name may not resolve and nothing answers there.
        first = 0
        if self.launch_line is not None and self.nodes > 1:
            self._nodes.append(self._start_node(0, endpoint, conf, logs))  # type: ignore[arg-type]
            self._await_listener(self._dnodes()[0], (RDZV_PORT, MASTER_PORT))
            first = 1
        with ThreadPoolExecutor(max_workers=self.nodes) as pool:
            started = list(pool.map(lambda i: self._start_node(i, endpoint, conf, logs),
                                    range(first, self.nodes)))
        self._nodes.extend(started)  # type: ignore[arg-type]

    def _await_listener(self, n: _DockerNode, ports: tuple[int, ...],
                        timeout_s: float = 60) -> None:
        """Wait until something in ``n``'s container listens on one of ``ports`` (read from
        its network namespace's ``/proc/PID/net/tcp``), while it runs; a line whose rendezvous
        needs no listener there (etcd ...) is not waited on past ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self._alive(n):
            if listening_ports(n.init_pid) & set(ports):
                return
            time.sleep(0.05)

    def _alive(self, n: _DockerNode) -> bool:  # type: ignore[override]
        return pid_alive(n.init_pid)

    def _root_pid(self, n: _DockerNode) -> int:  # type: ignore[override]
        """The host pid of the node's PID 1 (its init; the agent is its child)."""
        return n.init_pid

    def _returncode(self, n: _DockerNode) -> int | None:  # type: ignore[override]
        return None if self._alive(n) else self._exit_code(n)

    def _retire(self, n: _DockerNode) -> None:  # type: ignore[override]
        self._remove_container(n)  # its name is taken until it is removed

    def _node_info(self, n: _DockerNode) -> dict[str, object]:  # type: ignore[override]
        return {"node": n.name, "container": n.container.name, "init_pid": n.init_pid,
                "log": str(n.log_path)}

    def _launch_info(self, endpoint: str) -> dict[str, object]:
        return {**super()._launch_info(endpoint), "launcher": "docker", "run_id": self.run_id,
                "network": self._network.name if self._network else None,
                "image": self._image}

    def _start_node(self, index: int, endpoint: str, conf: str,  # type: ignore[override]
                    logs: Path) -> _DockerNode:
        import docker.errors

        name = f"node{index}"
        env = {**self.node_environment(name),
               # gloo picks its interface from the hostname otherwise; the runtime agent's
               # control channel listens on the node's own address (not loopback), where the
               # engine on the host can reach it.
               "GLOO_SOCKET_IFNAME": "eth0", "FAULTLAB_RUNTIME_HOST": "@hostname",
               "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin:/usr/sbin",
               "HOME": "/tmp"}
        container_name = f"faultlab-{self.run_id}-{name}"
        # faultlab's agent advertises the container's name, the team's torchrun its hostname
        # (nodeN, the node's alias): the network's DNS resolves both in every node, to
        # whatever address the node has now.
        argv = [sys.executable, *self.agent_argv(endpoint, conf, container_name)] \
            if self.launch_line is None else self.node_line(index, endpoint)
        log_path = logs / f"{name}.log"
        shell = ["/bin/sh", "-c", 'exec "$@" >>"$0" 2>&1', str(log_path), *argv]
        try:
            container = self._client.containers.run(
                self._image, shell, name=container_name, hostname=name, detach=True,
                init=True, network=self._network.name, environment=env,
                networking_config={self._network.name: self._client.api.create_endpoint_config(
                    aliases=[name])},
                volumes=host_mounts(self.run_dir), tmpfs={"/tmp": "rw,exec"},
                working_dir=os.getcwd(), user=f"{os.getuid()}:{os.getgid()}",
                labels={LABEL: "1", RUN_LABEL: self.run_id, "faultlab.node": name},
                stdin_open=False)
            container.reload()
        except docker.errors.DockerException as e:
            raise TargetError(f"cannot start {name} ({container_name}): {e}") from None
        pid = int(container.attrs["State"]["Pid"])
        if not pid:
            raise TargetError(f"{name} ({container_name}) exited at once; see {log_path}")
        return _DockerNode(name, container, log_path, argv, pid)

    # -- observing -----------------------------------------------------------------------------

    def describe(self) -> str:
        import shlex

        return "\n".join(f"{n.name}: container {n.container.name} on network "
                         f"{self._network.name}: {shlex.join(n.cmd)}" for n in self._dnodes())

    def worker_pids(self, node: str) -> list[int]:
        tree = process_tree(self.agent_pid(node))
        return [p.pid for p in tree[2:]] if len(tree) > 2 else []

    def host_pid(self, node: str, ns_pid: int) -> int | None:
        """The host pid of the process that is ``ns_pid`` in ``node``'s PID namespace."""
        for p in process_tree(self.agent_pid(node)):
            try:
                with open(f"/proc/{p.pid}/status") as f:
                    for line in f:
                        if line.startswith("NSpid:"):
                            if int(line.split()[-1]) == ns_pid:
                                return p.pid
                            break
            except (OSError, ValueError):
                continue
        return None

    # -- breaking ------------------------------------------------------------------------------

    def kill_node(self, node: str, sig: int = 9) -> list[int]:
        """``docker kill``: the container's PID 1 gets ``sig`` (SIGKILL takes down every
        process of the node at once, as a machine loss does)."""
        import docker.errors

        n = self._dnode(node)
        pids = [p.pid for p in process_tree(n.init_pid)]
        self._killed.add(node)
        try:
            n.container.kill(signal=int(sig))
        except docker.errors.APIError:
            pass  # already gone
        return pids

    def pause_node(self, node: str) -> None:
        self._dnode(node).container.pause()

    def unpause_node(self, node: str) -> bool:
        import docker.errors

        c = self._dnode(node).container
        try:
            c.reload()
            if c.status != "paused":
                return False
            c.unpause()
            # The engine may still report "paused" right after the call returned (seen once in
            # a suite run): undone means the engine says so, so wait for it, bounded.
            deadline = time.monotonic() + UNPAUSE_SETTLE_S
            while c.status == "paused" and time.monotonic() < deadline:
                time.sleep(0.05)
                c.reload()
            return True
        except docker.errors.NotFound:
            return False

    def node_address(self, node: str) -> str | None:
        """The node's IPv4 address on the run's network (None while disconnected)."""
        c = self._dnode(node).container
        c.reload()
        net = c.attrs["NetworkSettings"]["Networks"].get(self._network.name)
        return (net or {}).get("IPAddress") or None

    def netns_pid(self, node: str) -> int:
        n = self._dnode(node)
        if not self._alive(n):
            raise LaunchError(f"{node} is not running (container {n.container.name})")
        return n.init_pid

    @property
    def gateway(self) -> str:
        """The host's address on the run's network: where the rendezvous store listens."""
        return self._gateway

    def disconnect_node(self, node: str) -> None:
        self._network.disconnect(self._dnode(node).container, force=True)

    def connect_node(self, node: str) -> bool:
        import docker.errors

        n = self._dnode(node)
        if self.node_address(node) is not None or not self._alive(n):
            return False
        try:
            self._network.connect(n.container, aliases=[node])
        except docker.errors.APIError:
            return False
        return True

    # -- clean-up ------------------------------------------------------------------------------

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop every node (a paused one is unpaused, a stopped process continued, first),
        then remove the run's containers, network and image, then the store. Idempotent."""
        import signal

        import docker.errors

        for n in self._dnodes():
            try:
                self.unpause_node(n.name)
            except docker.errors.APIError:
                pass
            signal_tree(n.init_pid, signal.SIGCONT)  # a stopped process must act on SIGTERM
        running = [n for n in self._dnodes() if self._alive(n)]
        if running:
            with ThreadPoolExecutor(max_workers=len(running)) as pool:
                list(pool.map(lambda n: self._stop_container(n, grace_s), running))
        for n in self._dnodes():
            self._exit_code(n)
        if self._client is not None:
            try:
                remove_run(self._client, self.run_id)
            except Exception as e:  # noqa: BLE001 - the store must still be stopped
                print(f"faultlab: could not remove every engine object of run {self.run_id}: "
                      f"{e}; run `faultlab docker clean`", file=sys.stderr)
        self._stop_store()

    # -- helpers -------------------------------------------------------------------------------

    def _dnodes(self) -> list[_DockerNode]:
        return self._nodes  # type: ignore[return-value]

    def _dnode(self, name: str) -> _DockerNode:
        return self._node(name)  # type: ignore[return-value]

    def _exit_code(self, n: _DockerNode) -> int | None:
        import docker.errors

        if n.exit_code is None:
            try:
                n.container.reload()
                if n.container.status in ("exited", "dead"):
                    n.exit_code = int(n.container.attrs["State"]["ExitCode"])
            except docker.errors.NotFound:
                pass
        return n.exit_code

    @staticmethod
    def _stop_container(n: _DockerNode, grace_s: float) -> None:
        import docker.errors

        try:
            n.container.stop(timeout=max(1, int(grace_s)))
        except docker.errors.APIError:
            pass

    def _remove_container(self, n: _DockerNode) -> None:
        import docker.errors

        self._exit_code(n)
        try:
            n.container.remove(force=True)
        except docker.errors.APIError:
            pass
