"""What ``completes`` asks of the job's nodes, beyond its ranks' records: the final world is the
topology's, and every node that no fault struck exited 0 (docs/concepts.md, SLA).

Pure functions over the records of the job's event stream, the fault records and what the
target reports of its nodes (``Target.result()``: each node's exit code, the nodes lost on
purpose), used by the judge once the ranks' records say the job completed.

The final world
    The ``world_size`` of the latest ``start`` record (the final incarnation). It must be the
    topology's ``nodes * procs_per_node``; an elastic topology (``min_nodes`` set) may have
    shrunk by the nodes the faults struck, never below ``min_nodes`` nodes' worth. Not
    measured without a ``start`` carrying a ``world_size`` (a user's trainer run without
    faultlab's runtime writes none), nor where every node is a world of its own (a ``start``
    with ``own_world``: torchft's replica groups, whose ``world_size`` is the job's size as
    faultlab's launcher gives it, whichever groups trained).
The nodes' exits
    Every node that no fault struck ended with exit code 0. A node is struck by a fault whose
    victim is that node (``node K``: the job's K-th node), a rank the node held when the fault
    was injected (from the ``start`` records' ``node``), or ``all``; a fault whose injection
    failed struck nothing. Not held against the job: a node lost on purpose (the target's
    ``killed``), one the engine stopped because training had completed and it was still
    running (the runner's lingering nodes, whose code is the stop's: -15, 143 or torchrun's
    1), one whose code is unknown (None). An entry that is not a node (a Slurm job's own exit
    code, ``job N``) stands for the whole job: any fault that struck excuses it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from faultlab.observe.records import FaultRecord

__all__ = ["final_world_shortfall", "struck_nodes", "unclean_node_exit"]

def struck_nodes(faults: Sequence[FaultRecord], records: Sequence[Mapping[str, Any]],
                 node_names: Sequence[str]) -> tuple[set[str], bool]:
    """The names of the nodes some fault struck, and whether one struck the whole job (``all``,
    or a victim whose node is unknown: then no node can be told apart from another)."""
    starts = sorted((r for r in records if r.get("kind") == "start"
                     and isinstance(r.get("node"), str)), key=lambda r: float(r.get("t") or 0))
    struck: set[str] = set()
    for f in faults:
        if f.details.get("error"):
            continue
        named = [n for n in (f.details.get("node"), *(f.details.get("nodes") or ()))
                 if isinstance(n, str) and n]
        struck.update(named)
        kind, _, value = str(f.target).partition(" ")
        if kind == "node" and value.isdigit():
            index = int(value)
            struck.add(node_names[index] if index < len(node_names) else f"node{index}")
        elif kind == "rank" and value.lstrip("-").isdigit():
            held = _node_of_rank(starts, int(value), f.injected_t)
            if held is None and not named:
                return struck, True
            struck.update([held] if held else [])
        elif not named:  # all, or a victim this module cannot place
            return struck, True
    return struck, False


def _node_of_rank(starts: list[Mapping[str, Any]], rank: int, t: float) -> str | None:
    """The node that held ``rank`` at ``t``: its latest start before then, else its first."""
    mine = [s for s in starts if s.get("rank") == rank]
    before = [s for s in mine if float(s.get("t") or 0) <= t]
    held = before[-1] if before else (mine[0] if mine else None)
    return str(held["node"]) if held else None


def final_world_shortfall(records: Sequence[Mapping[str, Any]], *, nodes: int,
                          procs_per_node: int, min_nodes: int | None,
                          struck: int) -> str:
    """Why the final world is smaller than the job may end with ('' if it is not, or if it is
    not measured: module docstring). ``struck``: how many nodes the faults struck."""
    starts = [r for r in records if r.get("kind") == "start"]
    if any(r.get("own_world") is True for r in starts):
        return ""
    sized = [r for r in starts if isinstance(r.get("world_size"), int)
             and not isinstance(r.get("world_size"), bool)]
    if not sized:
        return ""
    last = max(sized, key=lambda r: float(r.get("t") or 0))
    world = int(last["world_size"])
    full = nodes * procs_per_node
    fewest_nodes = nodes if min_nodes is None else max(min_nodes, nodes - struck)
    if world >= fewest_nodes * procs_per_node:
        return ""
    allowed = f"; min_nodes {min_nodes} lets it shrink only by the nodes a fault struck, " \
        f"and none struck one" if min_nodes is not None and not struck else ""
    allowed = allowed if fewest_nodes == nodes else (
        f"; elastic (min_nodes {min_nodes}) with {struck} node(s) struck by a fault, it may "
        f"shrink to {fewest_nodes} node(s), world size {fewest_nodes * procs_per_node}")
    return (f"the final incarnation trained at world size {world}, the topology's is {full} "
            f"({nodes} node(s) x {procs_per_node} rank(s)){allowed}")


def unclean_node_exit(node_exits: Mapping[str, int | None], *, struck: Collection[str],
                      struck_all: bool, lost: Collection[str] = (),
                      stopped: Collection[str] = (), any_struck: bool = False) -> str:
    """Why a node no fault struck did not end cleanly: its name and exit code ('' if every
    such node exited 0; module docstring for what is not held against the job)."""
    bad = []
    for name, code in node_exits.items():
        if code is None or code == 0 or name in lost or name in stopped:
            continue
        whole_job = name.startswith("job ") and name not in struck
        if struck_all or (any_struck if whole_job else name in struck):
            continue
        bad.append((name, code))
    if not bad:
        return ""
    return "; ".join(f"{name}, struck by no fault, exited with code {code}" for name, code in bad)
