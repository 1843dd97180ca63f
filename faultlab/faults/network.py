"""Network faults: kernel-level partitions, throttles and flaps between nodes.

They need nodes with a network stack of their own (the ``node_network`` capability: the docker
target's containers, or a team's target that offers it): on one host, nodes that are processes
share one stack, and cutting "node 1" would cut everyone. Rules go into the victim nodes' own
network namespaces (``faultlab.fault_api.netns``, reached through ``NodeNetwork``), one
chain per fault, so undoing a fault removes exactly its rules; they also die with the
container. Every fault here is reversible and undone on every exit path.

- ``network_partition``: drop every packet between the victim node and its peers — the other
  nodes and, with ``scope: all`` (the default), the rendezvous store too: a node whose link
  died. ``scope: nodes`` keeps the store reachable (the control plane still sees the node: a
  split brain). ``target: all`` with ``groups`` splits the nodes into sets instead.
  ``method: disconnect`` takes the node off the network (it loses its address) instead of
  dropping packets.
- ``network_throttle``: a token-bucket rate limit (``tbf``; this kernel has no ``netem``) on
  what the victim node sends, and with ``direction: both`` on what it receives.
- ``network_flap``: a partition switched on and off with a period, until undone.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from faultlab.errors import FaultError
from faultlab.fault_api import Fault, FaultContext, FaultParams, NodeNetwork, Victim, require
from faultlab.fault_api.netns import (
    add_drop_chain,
    host_veth,
    remove_drop_chain,
    remove_tbf,
    set_tbf,
)

__all__ = ["NetworkFlapFault", "NetworkPartitionFault", "NetworkThrottleFault"]

_RATE = re.compile(r"^\d+(\.\d+)?(bit|kbit|mbit|gbit|bps|kbps|mbps|gbps)$")
_SIZE = re.compile(r"^\d+(\.\d+)?(b|kb|mb|kbit|mbit)?$")


class _NetworkFault(Fault):
    family = "network"
    reversible = True
    needs: ClassVar[tuple[str, ...]] = ("node_network",)
    """Only nodes with a network stack of their own can be cut or throttled one by one: on
    local nodes every node shares this host's."""


# ----------------------------------------------------------------------------- partitions


class PartitionParams(FaultParams):
    scope: Literal["all", "nodes"] = Field(
        "all", description="all: cut the victim from the other nodes and the rendezvous store "
                           "(its link died); nodes: only from the other nodes")
    method: Literal["drop", "disconnect"] = Field(
        "drop", description="drop: DROP rules in the node's network namespace; disconnect: "
                            "take the node off the network (it loses its address; scope all)")
    groups: list[list[int]] | None = Field(
        None, min_length=2, description="with target: all, split the nodes into these sets "
                                        "(node indices); the store stays with the first set")

    @field_validator("groups")
    @classmethod
    def _disjoint(cls, groups: list[list[int]] | None) -> list[list[int]] | None:
        if groups is None:
            return None
        seen: set[int] = set()
        for g in groups:
            if not g:
                raise ValueError("every group needs at least one node")
            if any(n < 0 for n in g):
                raise ValueError(f"node indices are >= 0, got {g}")
            if seen & set(g):
                raise ValueError(f"node {sorted(seen & set(g))[0]} is in two groups")
            seen |= set(g)
        return groups

    @model_validator(mode="after")
    def _method(self) -> PartitionParams:
        if self.method == "disconnect" and (self.scope != "all" or self.groups is not None):
            raise ValueError("method: disconnect takes the whole node off the network: it "
                             "needs scope: all and no groups")
        return self


class _Partition:
    """The DROP chains (or disconnections) of one partition; ``remove`` undoes all of it."""

    def __init__(self, params: PartitionParams) -> None:
        self.params = params
        self.chain = f"faultlab-{uuid.uuid4().hex[:8]}"
        self.chains: list[tuple[str, int]] = []
        self.disconnected: list[str] = []

    def sides(self, ctx: FaultContext, victim: Victim) -> tuple[list[list[str]], bool]:
        nodes = ctx.node_names()
        groups = self.params.groups
        if victim.kind == "node":
            if groups is not None:
                raise FaultError("groups go with target: all (the sets name the nodes)")
            mine = nodes[int(victim.value or 0)]
            return [[n for n in nodes if n != mine], [mine]], True
        if groups is None:
            raise FaultError("target: all needs params.groups (which nodes are on which side)")
        for g in groups:
            for i in g:
                if i >= len(nodes):
                    raise FaultError(f"groups: node {i} does not exist (nodes 0..{len(nodes) - 1})")
        listed = {i for g in groups for i in g}
        sets = [[nodes[i] for i in g] for g in groups]
        rest = [n for i, n in enumerate(nodes) if i not in listed]
        if rest:  # unlisted nodes stay with the first set
            sets[0] += rest
        return sets, False

    def apply(self, ctx: FaultContext, victim: Victim) -> dict[str, Any]:
        net: NodeNetwork = require(ctx, "node_network", "a network partition")
        sets, single = self.sides(ctx, victim)
        store = net.store_address()
        if self.params.method == "disconnect":
            node = sets[1][0]
            self.disconnected.append(node)  # before acting: undo must know, whatever happens
            net.disconnect_node(node)
            return {"method": "disconnect", "cut": [node]}
        addresses = {n: net.node_address(n) for s in sets for n in s}
        rules: dict[str, list[str]] = {}
        for k, side in enumerate(sets):
            if single and k == 0:
                continue  # one side's rules cut both directions
            others = [addresses[n] for j, s in enumerate(sets) if j != k for n in s]
            cut_store = self.params.scope == "all" and k > 0
            # a store inside a node (the team's c10d line: node 0's agent) goes with its node
            outside = store and store not in addresses.values()
            peers = [a for a in others if a] + ([store] if cut_store and outside else [])
            for node in side:
                pid = net.node_netns_pid(node)
                self.chains.append((node, pid))
                rules[node] = add_drop_chain(pid, self.chain, peers)
        return {"method": "drop", "scope": self.params.scope, "chain": self.chain,
                "sides": sets, "store": store if self.params.scope == "all" else None,
                "rules": rules}

    def remove(self, ctx: FaultContext) -> dict[str, Any]:
        removed = [node for node, pid in self.chains if remove_drop_chain(pid, self.chain)]
        self.chains = []
        reconnected = []
        for node in self.disconnected:
            try:
                net: NodeNetwork = require(ctx, "node_network", "reconnecting a node")
                if net.connect_node(node):
                    reconnected.append(node)
            except FaultError:
                pass  # the node is gone: nothing left to reconnect
        self.disconnected = []
        return {"rules_removed": removed, "reconnected": reconnected}


class NetworkPartitionFault(_NetworkFault):
    """Cut a node off the network (drop rules or a disconnect), or split nodes into sets."""

    type = "network_partition"
    loses_node: ClassVar[bool] = True
    targets: ClassVar[tuple[str, ...]] = ("node", "all")
    Params = PartitionParams
    params: PartitionParams

    def __init__(self, params: FaultParams) -> None:
        super().__init__(params)
        self._partition = _Partition(self.params)

    def inject(self, ctx: FaultContext, victim: Victim) -> dict[str, Any]:
        return self._partition.apply(ctx, victim)

    def undo(self, ctx: FaultContext) -> dict[str, Any]:
        """Delete its drop rules (or reconnect the node to the job's network); the guard
        removes them if faultlab dies."""
        return self._partition.remove(ctx)


class NetworkFlapFault(_NetworkFault):
    """A partition switched on for ``down_s`` out of every ``period_s``, until undone."""

    type = "network_flap"
    targets: ClassVar[tuple[str, ...]] = ("node", "all")

    class Params(PartitionParams):
        period_s: float = Field(4.0, gt=0, le=3600, description="length of one down+up cycle")
        down_s: float = Field(1.0, gt=0, le=3600, description="partitioned part of each cycle")

        @model_validator(mode="after")
        def _cycle(self) -> NetworkFlapFault.Params:
            if self.down_s >= self.period_s:
                raise ValueError(f"down_s ({self.down_s:g}) must be shorter than period_s "
                                 f"({self.period_s:g}): otherwise it is a partition")
            return self

    params: Params

    def __init__(self, params: FaultParams) -> None:
        super().__init__(params)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._current: _Partition | None = None
        self._cycles = 0
        self._errors: list[str] = []

    def inject(self, ctx: FaultContext, victim: Victim) -> dict[str, Any]:
        first = self._down(ctx, victim)  # the first cut happens now, or the fault fails now
        self._thread = threading.Thread(target=self._run, args=(ctx, victim),
                                        name="faultlab-network-flap", daemon=True)
        self._thread.start()
        return {"period_s": self.params.period_s, "down_s": self.params.down_s,
                "first": first}

    def _down(self, ctx: FaultContext, victim: Victim) -> dict[str, Any]:
        with self._lock:
            part = _Partition(self.params)
            self._current = part
            try:
                done = part.apply(ctx, victim)
            except FaultError:
                part.remove(ctx)
                self._current = None
                raise
            self._cycles += 1
            return done

    def _up(self, ctx: FaultContext) -> None:
        with self._lock:
            if self._current is not None:
                self._current.remove(ctx)
                self._current = None

    def _run(self, ctx: FaultContext, victim: Victim) -> None:
        p = self.params
        while not self._stop.wait(p.down_s):
            self._up(ctx)
            if self._stop.wait(p.period_s - p.down_s):
                return
            try:
                self._down(ctx, victim)
            except FaultError as e:  # the node may be restarting: try again next cycle
                self._errors.append(str(e))

    def undo(self, ctx: FaultContext) -> dict[str, Any]:
        """Stop the cycle and bring the link up for good (its partition removed)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
        self._up(ctx)
        return {"cycles": self._cycles, "errors": self._errors[:5]}


# ----------------------------------------------------------------------------- throttling


class NetworkThrottleFault(_NetworkFault):
    """Rate-limit a node's link with a token bucket (tbf): a degraded NIC or a slow hop."""

    type = "network_throttle"
    slows_job: ClassVar[bool] = True
    targets: ClassVar[tuple[str, ...]] = ("node", "all")

    class Params(FaultParams):
        rate: str = Field("10mbit", description="tc rate, e.g. 10mbit, 500kbit, 1gbit")
        burst: str = Field("64kb", description="bucket size, e.g. 32kb (tc burst)")
        latency_ms: float = Field(100.0, gt=0, le=60_000, description="longest a packet may "
                                  "wait in the bucket's queue before it is dropped, ms")
        direction: Literal["egress", "both"] = Field(
            "egress", description="egress: what the node sends; both: and what it receives "
                                  "(the host side of its veth)")

        @field_validator("rate")
        @classmethod
        def _rate(cls, value: str) -> str:
            if not _RATE.match(value.strip().lower()):
                raise ValueError(f"{value!r} is not a tc rate: a number and one of bit, kbit, "
                                 f"mbit, gbit, bps, kbps, mbps, gbps (e.g. 10mbit)")
            return value.strip().lower()

        @field_validator("burst")
        @classmethod
        def _burst(cls, value: str) -> str:
            if not _SIZE.match(value.strip().lower()):
                raise ValueError(f"{value!r} is not a tc size (e.g. 32kb, 1mb, 64kbit)")
            return value.strip().lower()

    params: Params

    def __init__(self, params: FaultParams) -> None:
        super().__init__(params)
        self._applied: list[tuple[int | None, str]] = []

    def inject(self, ctx: FaultContext, victim: Victim) -> dict[str, Any]:
        p = self.params
        net: NodeNetwork = require(ctx, "node_network", "network_throttle")
        nodes = ctx.node_names()
        chosen = nodes if victim.kind == "all" else [nodes[int(victim.value or 0)]]
        done: dict[str, list[str]] = {}
        for node in chosen:
            pid = net.node_netns_pid(node)
            self._applied.append((pid, "eth0"))
            done[node] = [set_tbf(pid, "eth0", p.rate, p.burst, p.latency_ms)]
            if p.direction == "both":
                veth = host_veth(pid)
                self._applied.append((None, veth))
                done[node].append(set_tbf(None, veth, p.rate, p.burst,
                                          p.latency_ms))
        # The ranks on the throttled nodes: the straggler the job should name is one of them.
        ranks = [r for r in ctx.ranks() if ctx.node_of_rank(r) in chosen]
        return {"nodes": chosen, "ranks": ranks, "tc": done, "at_t": time.time()}

    def undo(self, ctx: FaultContext) -> dict[str, Any]:
        """Delete the token-bucket qdisc from every link it throttled."""
        removed = [f"{'host' if pid is None else pid}:{dev}" for pid, dev in self._applied
                   if remove_tbf(pid, dev)]
        self._applied = []
        return {"removed": removed}
