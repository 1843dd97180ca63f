"""A team's own target: every node a plain process of this host in a network namespace of its own.

``topology.launcher: netns`` runs the job as the local target does (faultlab's ``LocalJob``:
its rendezvous store in the faultlab process, one torchrun agent per node, every process
reaped on stop) with one change, in the job's node hooks: each node's agent starts under
``ip netns exec`` in the node's own namespace, whose ``eth0`` is a veth pair to a bridge in
this host's namespace (``netns_network``). So a node has an address of its own and a network
stack of its own, and the built-in network faults (``network_partition``, ``network_throttle``,
``network_flap``) run on it, through the ``node_network`` capability it ``offers``, without a
Docker engine.

It implements faultlab's target contract with nothing of faultlab changed:

- ``settings = NetnsSettings``: its own block, ``topology.netns:`` (the subnet, a name prefix);
- ``check_launch``: what of the experiment's launch line it cannot run (a team's own line:
  it runs faultlab's launcher only);
- ``guard_record``/``undo_from_guard``: the names of everything it creates, known before it
  starts, and their removal by faultlab's guard process should faultlab die.

Needs root (namespaces, links, iptables) and iproute2 and iptables on the host.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from faultlab.errors import FaultError, LaunchError
from faultlab.spec import Experiment
from faultlab.targets.launcher import LocalJob
from faultlab.targets.local import LocalTarget
from faultlab_example_plugin.netns_network import (
    IFNAME,
    NetworkError,
    RunNetwork,
    ip,
    node_ipv4,
    remove,
)

__all__ = ["NetnsJob", "NetnsSettings", "NetnsTarget"]

class NetnsSettings(BaseModel):
    """``topology.netns:``, the netns target's own settings (every one optional)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    subnet: ipaddress.IPv4Network = Field(
        default=ipaddress.IPv4Network("10.213.0.0/16"),
        description="where the run's addresses come from: its first /24 (or the whole subnet, "
                    "if smaller) that no interface of this host is on; .1 is the bridge, "
                    "where faultlab's store listens, node N is .N+2")
    prefix: str = Field(
        default="fl",
        description="the first letters of every name the run creates: namespaces "
                    "PREFIX-RUN-nodeN, the bridge PREFIXRUNb, veths PREFIXRUNvN (1-4 lower-case "
                    "letters or digits, a letter first: an interface name has 15 characters)")

    @field_validator("subnet", mode="before")
    @classmethod
    def _subnet(cls, value: Any) -> ipaddress.IPv4Network:
        try:
            if not isinstance(value, str | ipaddress.IPv4Network):
                raise TypeError("not a string")
            net = ipaddress.IPv4Network(value)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{value!r} is not an IPv4 subnet ({e}): give one such as "
                             f"'10.213.0.0/16'") from None
        if net.prefixlen > 29:
            raise ValueError(f"{value!r} has room for {max(0, net.num_addresses - 2)} "
                             f"address(es): give a /29 or larger (a gateway and the nodes)")
        return net

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z][a-z0-9]{0,3}", value):
            raise ValueError(f"{value!r}: give 1-4 lower-case letters or digits, a letter "
                             f"first, such as 'fl' (every interface name the run creates "
                             f"must fit in 15 characters)")
        return value


def settings_of(exp: Experiment) -> NetnsSettings:
    """The experiment's ``topology.netns:`` (parsed by faultlab's loader), or the defaults."""
    found = getattr(exp.topology, "settings", None)
    return found if isinstance(found, NetnsSettings) else NetnsSettings()


@dataclass(kw_only=True)
class NetnsJob(LocalJob):
    """A ``LocalJob`` whose nodes each run in a network namespace of their own."""

    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    settings: NetnsSettings = field(default_factory=NetnsSettings)
    _addresses: list[ipaddress.IPv4Interface] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.launch_line is not None:
            raise LaunchError(NO_LINE)

    @property
    def network(self) -> RunNetwork:
        return RunNetwork(self.run_id, self.settings.prefix, self.nodes)

    @property
    def gateway(self) -> str:
        """The host's address on the run's bridge ('' before start)."""
        return str(self._addresses[0].ip) if self._addresses else ""

    def start(self) -> NetnsJob:
        try:
            self._addresses = self.network.create(self.settings.subnet)
        except NetworkError as e:
            self.stop()
            raise LaunchError(f"cannot build the run's network: {e}") from None
        super().start()
        return self

    # -- LocalJob's hooks --------------------------------------------------------------------

    def _store_host(self) -> str:
        return self.gateway

    def control_host(self) -> str:
        return self.gateway

    def node_command(self, index: int, endpoint: str, conf: str) -> list[str]:
        """faultlab's agent in the node's namespace, advertising the node's own address
        (``ip netns exec`` execs: the pid the launcher knows is the agent's)."""
        return ["ip", "netns", "exec", self.network.namespace(index), sys.executable,
                *self.agent_argv(endpoint, conf, self._address(index))]

    def node_environment(self, name: str) -> dict[str, str]:
        # gloo's interface, and the runtime agent's control channel on the node's own
        # address (its loopback is its own: the engine could not reach it there)
        index = int(name.removeprefix("node"))
        return {**super().node_environment(name), "GLOO_SOCKET_IFNAME": IFNAME,
                "FAULTLAB_RUNTIME_HOST": self._address(index)}

    def _address(self, index: int) -> str:
        return str(self._addresses[index + 1].ip)

    def _launch_info(self, endpoint: str) -> dict[str, object]:
        return {**super()._launch_info(endpoint), "launcher": "netns", "run_id": self.run_id,
                "network": {**self.network.record(), "gateway": self.gateway,
                            "addresses": [str(a) for a in self._addresses[1:]]}}

    # -- node_network --------------------------------------------------------------------------

    def node_address(self, node: str) -> str | None:
        return node_ipv4(self.network.namespace(self._index(node)))

    def disconnect_node(self, node: str) -> None:
        """Take the node off the bridge: its address is flushed (as a container's is when
        Docker disconnects it), its link stays up."""
        self._ip("-n", self.network.namespace(self._index(node)), "addr", "flush", "dev", IFNAME)

    def connect_node(self, node: str) -> bool:
        """Give a disconnected, running node its address back; False if it has one."""
        index = self._index(node)
        if self.node_address(node) is not None or not self._alive(self._node(node)):
            return False
        self._ip("-n", self.network.namespace(index), "addr", "add",
                 str(self._addresses[index + 1]), "dev", IFNAME)
        return True

    def netns_pid(self, node: str) -> int:
        n = self._node(node)
        if not self._alive(n):
            raise LaunchError(f"{node} is not running (its agent, pid {n.popen.pid}, exited)")
        return n.popen.pid

    def _index(self, node: str) -> int:
        return self._nodes.index(self._node(node))

    @staticmethod
    def _ip(*argv: str) -> None:
        try:
            ip(*argv)
        except NetworkError as e:
            raise LaunchError(str(e)) from None

    # -- clean-up ------------------------------------------------------------------------------

    def stop(self, grace_s: float = 5.0) -> None:
        """Reap every process (``LocalJob.stop``), then remove the run's namespaces, veths,
        bridge and rules. Idempotent."""
        super().stop(grace_s)
        try:
            remove(self.network.record())
        except NetworkError as e:
            print(f"faultlab: could not remove the netns run {self.run_id}'s network: {e}; "
                  f"see `ip netns list` and `ip -br link`", file=sys.stderr)


NO_LINE = ("the netns target runs faultlab's own launcher only (its store outside the nodes, "
           "on the bridge): leave launch unset or set launch: faultlab")


class NetnsTarget(LocalTarget):
    """One launch of an experiment's job in network namespaces (``topology.launcher: netns``)."""

    job_class = NetnsJob
    job: NetnsJob
    offers: ClassVar[frozenset[str]] = frozenset({
        "node_network",  # an address and a network namespace per node
        "node_restart",  # a lost node's agent started again, in its namespace
    })
    """Not the local target's ``services`` (they would listen in this host's namespace, on
    loopback), ``host_loopback`` (a node's loopback is its own), ``node_gpu_state`` or
    ``node_storage_view`` (not wired here)."""
    settings: ClassVar[type[BaseModel] | None] = NetnsSettings
    launch_lines: ClassVar[bool] = False
    """Its nodes start with faultlab's launcher only (its store outside them, on the bridge):
    a command with no ``launch`` runs under it too."""

    def __init__(self, exp: Experiment, run_dir: Path,
                 node_env: dict[str, dict[str, str]] | None = None) -> None:
        super().__init__(exp, run_dir, node_env=node_env)
        self.job.settings = settings_of(exp)

    @classmethod
    def check_launch(cls, target: Any, topology: Any) -> list[tuple[tuple[str | int, ...], str]]:
        """Refuses a team's own launch line, and more nodes than the subnet holds."""
        problems: list[tuple[tuple[str | int, ...], str]] = []
        if target.launch not in (None, "faultlab"):
            problems.append((("target", "launch"), NO_LINE))
        subnet = getattr(getattr(topology, "settings", None), "subnet", None)
        if isinstance(subnet, ipaddress.IPv4Network):
            room = min(subnet.num_addresses, 256) - 3  # network, broadcast, gateway
            if topology.nodes > room:
                problems.append((("topology", "netns", "subnet"),
                                 f"{str(subnet)!r} holds {room} node(s) beside the gateway, "
                                 f"not topology.nodes {topology.nodes}: give a larger subnet"))
        return problems

    @classmethod
    def unavailable(cls) -> str | None:
        """Why no job of it can start here (faultlab.testing.require_target): not root, or a
        tool missing."""
        if os.geteuid() != 0:
            return "the netns target needs root (network namespaces, links, iptables)"
        missing = [t for t in ("ip", "iptables", "nsenter", "tc")
                   if shutil.which(t, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
                   is None]
        return f"not installed: {', '.join(missing)} (iproute2, iptables, util-linux)" \
            if missing else None

    def guard_record(self) -> dict[str, Any] | None:
        return self.job.network.record()

    @classmethod
    def undo_from_guard(cls, record: dict[str, Any]) -> list[str]:
        try:
            return remove(record)
        except NetworkError as e:  # a tool gone since the start: say so, never raise
            return [f"could not remove the netns run's network: {e}"]

    # -- node_network (faultlab.fault_api.context.NodeNetwork) ----------------------------------

    def node_address(self, node: str) -> str | None:
        return self._job_call(self.job.node_address, node)

    def node_netns_pid(self, node: str) -> int:
        return int(self._job_call(self.job.netns_pid, node))

    def store_address(self) -> str:
        """faultlab's store listens on the bridge, outside every node."""
        return self.job.gateway

    def disconnect_node(self, node: str) -> None:
        self._job_call(self.job.disconnect_node, node)

    def connect_node(self, node: str) -> bool:
        return bool(self._job_call(self.job.connect_node, node))

    def _job_call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except (KeyError, LaunchError) as e:
            raise FaultError(str(e).strip("'\"")) from None

