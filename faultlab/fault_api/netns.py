"""Kernel-level network faults on a node's own network namespace, applied from the host.

The primitives the ``node_network`` faults (``faultlab.faults.network``) act through, beneath
them and every target that offers that capability (the docker target's containers, a team's
target whose nodes are processes in namespaces of their own): a node is the pid of a process
in its namespace (``NodeNetwork.node_netns_pid``). faultlab enters it with ``nsenter`` (as root
on the host, so the nodes need no extra capability) and changes only that namespace:

- a partition is a filter chain of DROP rules (``iptables``) hooked into INPUT and OUTPUT, one
  chain per fault, so undoing it removes exactly those rules and nothing of anyone else's;
- a throttle is a ``tbf`` qdisc (this kernel has no ``netem``) on the node's ``eth0`` (what it
  sends) and, for ``both``, on the host side of its veth pair (what it receives).

Everything here dies with the node's namespace anyway; undo removes it earlier. It imports
nothing of faultlab but ``faultlab.errors``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from faultlab.errors import FaultError

__all__ = ["add_drop_chain", "host_veth", "remove_drop_chain", "remove_tbf", "set_tbf"]

_TIMEOUT_S = 10.0


def _tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin")
    if path is None:
        raise FaultError(f"{name} is not installed on this host; the network faults need it "
                         f"(Debian: apt-get install iptables iproute2 util-linux)")
    return path


def run_in(pid: int | None, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in the network namespace of process ``pid`` (the host's for None)."""
    cmd = [_tool(argv[0]), *argv[1:]]
    if pid is not None:
        cmd = [_tool("nsenter"), f"--net=/proc/{pid}/ns/net", "--", *cmd]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise FaultError(f"{' '.join(argv)} did not finish within {_TIMEOUT_S:g} s") from None


def _must(pid: int | None, argv: list[str]) -> str:
    done = run_in(pid, argv)
    if done.returncode != 0:
        where = "on the host" if pid is None else f"in the network namespace of pid {pid}"
        raise FaultError(f"`{' '.join(argv)}` failed {where}: "
                         f"{(done.stderr or done.stdout).strip()[:300]}")
    return done.stdout


def add_drop_chain(pid: int, chain: str, peers: list[str]) -> list[str]:
    """Drop every packet to and from ``peers`` (IPv4 addresses) in ``pid``'s namespace.
    Returns the rules added (for the journal)."""
    ipt = ["iptables", "-w", "5"]
    _must(pid, [*ipt, "-N", chain])
    rules = []
    try:
        for peer in peers:
            for hook, flag in (("INPUT", "-s"), ("OUTPUT", "-d")):
                _must(pid, [*ipt, "-A", chain, flag, peer, "-j", "DROP"])
                rules.append(f"{hook} {flag} {peer} DROP")
        for hook in ("INPUT", "OUTPUT"):
            _must(pid, [*ipt, "-I", hook, "1", "-j", chain])
    except FaultError:
        remove_drop_chain(pid, chain)
        raise
    return rules


def remove_drop_chain(pid: int, chain: str) -> bool:
    """Unhook and delete ``chain``; False if it (or the namespace) was already gone."""
    if not Path(f"/proc/{pid}/ns/net").exists():
        return False
    ipt = ["iptables", "-w", "5"]
    for hook in ("INPUT", "OUTPUT"):
        while run_in(pid, [*ipt, "-D", hook, "-j", chain]).returncode == 0:
            pass
    run_in(pid, [*ipt, "-F", chain])
    return run_in(pid, [*ipt, "-X", chain]).returncode == 0


def host_veth(pid: int, dev: str = "eth0") -> str:
    """The host-side name of the veth pair whose other end is ``dev`` in ``pid``'s netns."""
    # "2: eth0@if15: <...>": the number after @if is the peer's index in the host namespace
    # (sysfs would show the host's interfaces: only the network namespace is entered).
    first = _must(pid, ["ip", "-o", "link", "show", "dev", dev]).split(":", 2)[1]
    if "@if" not in first:
        raise FaultError(f"{dev} in the namespace of pid {pid} is not one end of a veth pair")
    peer_index = first.split("@if", 1)[1].strip()
    for line in _must(None, ["ip", "-o", "link"]).splitlines():
        index, name = line.split(":", 2)[:2]
        if index.strip() == peer_index:
            return name.strip().split("@")[0]
    raise FaultError(f"no host interface with index {peer_index} (the peer of {dev} in the "
                     f"namespace of pid {pid})")


def set_tbf(pid: int | None, dev: str, rate: str, burst: str, latency_ms: float) -> str:
    """Replace ``dev``'s root qdisc with a token bucket (``tc qdisc replace ... tbf``)."""
    argv = ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", burst,
            "latency", f"{latency_ms:g}ms"]
    _must(pid, argv)
    return " ".join(argv)


def remove_tbf(pid: int | None, dev: str) -> bool:
    """Delete ``dev``'s root qdisc (back to the default); False if there was none."""
    if pid is not None and not Path(f"/proc/{pid}/ns/net").exists():
        return False
    return run_in(pid, ["tc", "qdisc", "del", "dev", dev, "root"]).returncode == 0
