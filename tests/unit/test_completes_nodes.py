"""``completes`` sees every node, not only the ranks' records: the final world is the
topology's (an elastic one shrunk only by the nodes a fault struck, never below ``min_nodes``),
and every node no fault struck exited 0 (``faultlab.observe.node_exits``).

Each run here completed as far as its ranks' records go (every rank of the final incarnation
exited completed); what differs is what the target reports of its nodes, or the world the final
incarnation trained at.
"""

from __future__ import annotations

from typing import Any

import pytest

from faultlab.judge.verdict import SLAResult, judge
from faultlab.observe import FaultRecord, compute_metrics
from faultlab.spec import experiment_from_dict
from tests.fault_records import declared


def ev(t: float, kind: str, rank: int, world: int, node: str, **fields: Any) -> dict[str, Any]:
    return {"t": t, "kind": kind, "rank": rank, "pid": int(t * 10) + rank, "world_size": world,
            "node": node, "level": 0, **fields}


def incarnation(t0: float, nodes: list[str], *, steps: range = range(1, 11),
                ppn: int = 1, exits: bool = True, **start: Any) -> list[dict[str, Any]]:
    """One incarnation of ``len(nodes) * ppn`` ranks: start, steps, and (``exits``) a completed
    exit of every rank."""
    world = len(nodes) * ppn
    ranks = [(r, nodes[r // ppn]) for r in range(world)]
    out = [ev(t0, "start", r, world, n, **start) for r, n in ranks]
    for step in steps:
        out += [ev(t0 + step, "step", r, world, n, step=step, step_time_s=0.5)
                for r, n in ranks]
    if exits:
        out += [ev(t0 + steps[-1] + 0.5, "exit", r, world, n, reason="completed")
                for r, n in ranks]
    return out


def completes(topology: dict[str, Any], events: list[dict[str, Any]],
              faults: list[FaultRecord] = (), **nodes: Any) -> SLAResult:  # type: ignore[assignment]
    exp = experiment_from_dict({"name": "n", "topology": topology, "run": {"steps": 20},
                                "expect": {"completes": True}})
    metrics = compute_metrics(events, list(faults))
    assert metrics.completes, "the ranks' records alone say completed"
    (result,) = [r for r in judge(exp, metrics, None, timed_out=False, faults=list(faults),
                                  events=events, **nodes) if r.name == "completes"]
    return result


def kill(target: str, t: float, **details: Any) -> FaultRecord:
    kind = "node_kill" if target.startswith("node") else "rank_kill"
    return FaultRecord(id="f", type=kind,
                       capabilities=declared(kind), injected_t=t, target=target, details=details)


TWO = {"nodes": 2, "procs_per_node": 1}
RUN = incarnation(1000.0, ["node0", "node1"])


# -- failing: what the ranks' records alone passed -------------------------------------------

def test_a_node_no_fault_struck_that_exits_non_zero_fails() -> None:
    # rank 1 was killed and restarted on node 1; node 0 was struck by nothing, and its agent
    # still exited 1
    events = RUN[:2] + incarnation(1004.5, ["node0", "node1"], steps=range(4, 11))
    result = completes(TWO, events, [kill("rank 1", 1004.0)],
                       node_exits={"node0": 1, "node1": 0})
    assert (result.measured, result.passed) == (False, False)
    assert "node0" in result.note and "code 1" in result.note, result.describe()


def test_an_unfaulted_job_whose_node_exits_non_zero_fails() -> None:
    result = completes(TWO, RUN, node_exits={"node0": 0, "node1": 2})
    assert not result.passed
    assert result.note == "node1, struck by no fault, exited with code 2"


def test_a_world_smaller_than_the_topology_fails() -> None:
    # 2 nodes of 2 ranks, but the job trained with node0's 2 ranks only: node1 never joined
    events = incarnation(1000.0, ["node0"], ppn=2)
    result = completes({"nodes": 2, "procs_per_node": 2}, events,
                       node_exits={"node0": 0, "node1": 0})
    assert not result.passed
    assert "world size 2, the topology's is 4 (2 node(s) x 2 rank(s))" in result.note, \
        result.describe()


def test_an_elastic_job_below_min_nodes_fails() -> None:
    # 3 nodes, min_nodes 2: node 1 was killed and the job went on with node 0 alone
    events = incarnation(1000.0, ["node0", "node1", "node2"], steps=range(1, 6), exits=False) \
        + incarnation(1006.0, ["node0"], steps=range(6, 11))
    result = completes({"nodes": 3, "min_nodes": 2}, events, [kill("node 1", 1005.5)],
                       node_exits={"node0": 0, "node1": -9, "node2": 0}, lost_nodes={"node1"})
    assert not result.passed
    assert "world size 1, the topology's is 3" in result.note
    assert "shrink to 2 node(s), world size 2" in result.note, result.describe()


def test_an_elastic_job_that_a_node_never_joined_fails() -> None:
    # min_nodes lets a job shrink by the nodes a fault took, not start without one of them
    events = incarnation(1000.0, ["node0", "node1"])
    result = completes({"nodes": 3, "min_nodes": 2}, events,
                       node_exits={"node0": 0, "node1": 0, "node2": 0})
    assert not result.passed
    assert "min_nodes 2 lets it shrink only by the nodes a fault struck" in result.note


def test_a_lingering_node_not_named_stopped_counts() -> None:
    # the engine's stop gave it -15: without the runner naming it, it is a failed node
    result = completes(TWO, RUN, node_exits={"node0": 0, "node1": -15})
    assert not result.passed


def test_a_slurm_job_with_no_fault_must_exit_0() -> None:
    exp_faults: list[FaultRecord] = []
    result = completes(TWO, RUN, exp_faults, node_exits={"job 17": 1})
    assert not result.passed
    assert result.note == "job 17, struck by no fault, exited with code 1"


# -- passing ------------------------------------------------------------------------------

def test_a_node_a_fault_killed_is_not_held_against_the_job() -> None:
    # elastic 3 → 2: node 1 killed after step 5, the job went on with nodes 0 and 2
    events = incarnation(1000.0, ["node0", "node1", "node2"], steps=range(1, 6), exits=False) \
        + incarnation(1006.0, ["node0", "node2"], steps=range(6, 11))
    fault = kill("node 1", 1005.5)
    for lost in ({"node1"}, set()):  # struck by the fault: lost on purpose or not
        result = completes({"nodes": 3, "min_nodes": 2}, events, [fault],
                           node_exits={"node0": 0, "node1": -9, "node2": 0}, lost_nodes=lost)
        assert (result.measured, result.passed) == (True, True), result.describe()


def test_the_node_of_a_killed_rank_may_exit_non_zero() -> None:
    events = RUN[:2] + incarnation(1004.5, ["node0", "node1"], steps=range(4, 11))
    result = completes(TWO, events, [kill("rank 1", 1004.0)],
                       node_exits={"node0": 0, "node1": 1})
    assert result.passed, result.describe()


def test_a_node_stopped_after_training_completed_passes() -> None:
    # training done, node 1's agent still ran LINGER_S later: the engine stopped it
    for code in (-15, 143, 1):
        result = completes(TWO, RUN, node_exits={"node0": 0, "node1": code},
                           stopped_nodes=["node1"])
        assert result.passed, result.describe()


def test_an_unknown_exit_code_is_not_a_failure() -> None:
    assert completes(TWO, RUN, node_exits={"node0": 0, "node1": None}).passed


def test_a_fault_on_all_excuses_every_node() -> None:
    fault = FaultRecord(id="f", type="io_error",
                        capabilities=("fails_saves", "mounts_storage"), injected_t=1003.0,
                        target="all", details={})
    assert completes(TWO, RUN, [fault], node_exits={"node0": 1, "node1": 1}).passed


def test_a_failed_injection_struck_nothing() -> None:
    fault = FaultRecord(id="f", type="node_kill",
                        capabilities=("loses_node",), injected_t=1003.0, target="node 1",
                        details={"error": "no such node"})
    assert not completes(TWO, RUN, [fault], node_exits={"node0": 0, "node1": 1}).passed


def test_a_slurm_job_struck_by_a_fault_may_end_non_zero() -> None:
    result = completes(TWO, RUN, [kill("rank 1", 1004.0)], node_exits={"job 17": -15})
    assert result.passed, result.describe()


@pytest.mark.parametrize("why, events", [
    # torchft: every replica group is a world of its own; world_size is faultlab's job size
    ("own_world", incarnation(1000.0, ["node0"], own_world=True)),
    # a user's trainer without faultlab's runtime: no start record at all
    ("no start", [r for r in RUN if r["kind"] != "start"]),
])
def test_the_world_is_not_measured_where_starts_do_not_say_it(
        why: str, events: list[dict[str, Any]]) -> None:
    result = completes(TWO, events, node_exits={"node0": 0, "node1": 0})
    assert result.passed, f"{why}: {result.describe()}"


def test_without_node_exits_only_the_world_is_judged() -> None:
    assert completes(TWO, RUN).passed
    assert not completes(TWO, incarnation(1000.0, ["node0"])).passed
