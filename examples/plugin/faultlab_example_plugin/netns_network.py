"""The netns target's network: a bridge in this host's namespace, one namespace per node.

Everything one run creates is named from its run id before any of it exists (``RunNetwork``),
so that the guard, a process of its own started before the job, can remove all of it from the
names alone (``remove``) if faultlab dies:

- a bridge ``<prefix><run>b`` holding the run's subnet's first address (the gateway: where
  faultlab's rendezvous store and hub listen, the only address of this host a node reaches);
- per node, a network namespace ``<prefix>-<run>-nodeN`` whose ``eth0`` is one end of a veth
  pair; the other end, ``<prefix><run>vN``, is a port of the bridge;
- two iptables rules in this host's namespace that let the bridge's traffic through: where
  ``br_netfilter`` is loaded (a Docker host), bridged packets cross the FORWARD chain, whose
  policy Docker sets to DROP.

The subnet is taken when the run starts: the first /24 of ``subnet`` (or the whole of it) that
no interface of this host is on, chosen and claimed under a host-wide lock, so two runs at
once never share one.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["IFNAME", "NetworkError", "RunNetwork", "ip", "node_ipv4", "present", "remove"]

_TIMEOUT_S = 10.0
IFNAME = "eth0"
"""Every node's interface in its namespace: one end of its veth pair."""
_LOCK = Path(tempfile.gettempdir()) / "faultlab-netns.lock"


class NetworkError(RuntimeError):
    """A command that builds or changes the run's network failed; the message quotes it."""


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    tool = shutil.which(argv[0]) or shutil.which(argv[0], path="/usr/sbin:/sbin:/usr/bin")
    if tool is None:
        raise NetworkError(f"{argv[0]} is not installed on this host; the netns target needs "
                           f"iproute2 and iptables (Debian: apt-get install iproute2 iptables)")
    try:
        done = subprocess.run([tool, *argv[1:]], capture_output=True, text=True,
                              timeout=_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise NetworkError(f"`{' '.join(argv)}` did not finish within {_TIMEOUT_S:g} s") \
            from None
    if check and done.returncode != 0:
        raise NetworkError(f"`{' '.join(argv)}` failed: "
                           f"{(done.stderr or done.stdout).strip()[:300]}")
    return done


def ip(*argv: str) -> str:
    """``ip ARGV...``'s output; NetworkError quoting it if it failed."""
    return _run(["ip", *argv]).stdout


@dataclass(frozen=True)
class RunNetwork:
    """The names of what one run creates, known before it creates any of them."""

    run_id: str
    prefix: str
    nodes: int

    @property
    def bridge(self) -> str:
        return f"{self.prefix}{self.run_id}b"

    def namespace(self, index: int) -> str:
        return f"{self.prefix}-{self.run_id}-node{index}"

    def veth(self, index: int) -> str:
        return f"{self.prefix}{self.run_id}v{index}"

    @property
    def rules(self) -> list[list[str]]:
        """The iptables rules (chain first) this run adds to this host's namespace."""
        br = self.bridge
        return [["FORWARD", "-i", br, "-o", br, "-j", "ACCEPT"],
                ["INPUT", "-i", br, "-j", "ACCEPT"]]

    def record(self) -> dict[str, Any]:
        """What the guard removes if faultlab dies (``remove``): JSON, names only."""
        return {"bridge": self.bridge,
                "namespaces": [self.namespace(i) for i in range(self.nodes)],
                "veths": [self.veth(i) for i in range(self.nodes)],
                "iptables": self.rules}

    def create(self, subnet: ipaddress.IPv4Network) -> list[ipaddress.IPv4Interface]:
        """Build the bridge, the rules and every node's namespace; returns the addresses,
        the gateway's first, then node 0's ... Whatever it built is left for ``remove``."""
        with _host_lock():
            net = _free_subnet(subnet, self.nodes)
            hosts = net.hosts()
            ifaces = [ipaddress.IPv4Interface(f"{next(hosts)}/{net.prefixlen}")
                      for _ in range(self.nodes + 1)]
            ip("link", "add", self.bridge, "type", "bridge")
            ip("addr", "add", str(ifaces[0]), "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for rule in self.rules:
            _run(["iptables", "-w", "5", "-I", rule[0], "1", *rule[1:]])
        for i in range(self.nodes):
            self._add_node(i, str(ifaces[i + 1]))
        return ifaces

    def _add_node(self, index: int, cidr: str) -> None:
        ns, veth = self.namespace(index), self.veth(index)
        ip("netns", "add", ns)
        ip("link", "add", veth, "type", "veth", "peer", "name", IFNAME, "netns", ns)
        ip("link", "set", veth, "master", self.bridge, "up")
        ip("-n", ns, "addr", "add", cidr, "dev", IFNAME)
        ip("-n", ns, "link", "set", IFNAME, "up")
        ip("-n", ns, "link", "set", "lo", "up")


def _networks_in_use() -> list[ipaddress.IPv4Network]:
    out = _run(["ip", "-4", "-o", "addr", "show"]).stdout
    return [ipaddress.IPv4Interface(line.split()[3]).network for line in out.splitlines()
            if len(line.split()) > 3]


def _free_subnet(subnet: ipaddress.IPv4Network, nodes: int) -> ipaddress.IPv4Network:
    """The first /24 of ``subnet`` (``subnet`` itself if smaller) that no interface is on."""
    used = _networks_in_use()
    candidates = [subnet] if subnet.prefixlen >= 24 else subnet.subnets(new_prefix=24)
    for net in candidates:
        if net.num_addresses - 2 >= nodes + 1 and not any(net.overlaps(u) for u in used):
            return net
    raise NetworkError(f"topology.netns.subnet {str(subnet)!r}: no free /24 left in it "
                       f"(every one is on an interface of this host, or too small for "
                       f"{nodes} nodes and the gateway); give another subnet, or remove what "
                       f"an earlier run left: `ip -br addr`")


@contextmanager
def _host_lock() -> Iterator[None]:
    with open(_LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def node_ipv4(namespace: str) -> str | None:
    """The IPv4 address ``IFNAME`` has in ``namespace`` now (None: none, or no namespace)."""
    done = _run(["ip", "-n", namespace, "-4", "-o", "addr", "show", "dev", IFNAME],
                check=False)
    for line in done.stdout.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[2] == "inet":
            return fields[3].split("/")[0]
    return None


def present(record: dict[str, Any]) -> dict[str, list[str]]:
    """What of ``record`` exists now: namespaces, links (veths, bridge), iptables rules."""
    namespaces = set(_run(["ip", "netns", "list"], check=False).stdout.split())
    links = {line.split(":")[1].strip().split("@")[0]
             for line in _run(["ip", "-o", "link"]).stdout.splitlines() if ":" in line}
    rules = _run(["iptables", "-w", "5", "-S"]).stdout.splitlines()
    return {"namespaces": [ns for ns in record["namespaces"] if ns in namespaces],
            "links": [link for link in [*record["veths"], record["bridge"]] if link in links],
            "iptables": [" ".join(r) for r in record["iptables"]
                         if any(f"-A {' '.join(r)}" == line for line in rules)]}


def remove(record: dict[str, Any]) -> list[str]:
    """Remove what ``record`` (``RunNetwork.record``) names: every process still in one of
    its namespaces (SIGKILL), the namespaces, the veths, the bridge and the rules. Idempotent;
    returns one line per thing it removed."""
    done: list[str] = []
    namespaces = set(_run(["ip", "netns", "list"], check=False).stdout.split())
    for ns in record.get("namespaces", []):
        if ns not in namespaces:
            continue
        pids = _run(["ip", "netns", "pids", ns], check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        if _run(["ip", "netns", "del", ns], check=False).returncode == 0:
            done.append(f"network namespace {ns}" + (f" (killed {len(pids)} process(es) in "
                                                     f"it)" if pids else ""))
    for link in [*record.get("veths", []), record.get("bridge")]:
        if link and _run(["ip", "link", "del", link], check=False).returncode == 0:
            done.append(f"link {link}")
    for rule in record.get("iptables", []):
        while _run(["iptables", "-w", "5", "-D", *rule], check=False).returncode == 0:
            done.append(f"iptables rule {' '.join(rule)}")
    return done
