"""``faultlab.observe.healing`` on the records a torchft job writes: two replica groups of one
rank (rank 0 on node0, rank 1 on node1), a fault after step 10."""

from __future__ import annotations

from typing import Any

from faultlab.observe import FaultRecord
from faultlab.observe.healing import healing_metrics

T = 1010.5


def ev(t: float, kind: str, rank: int, pid: int, **fields: Any) -> dict[str, Any]:
    return {"t": t, "kind": kind, "rank": rank, "pid": pid, "world_size": 2,
            "node": f"node{rank}", **fields}


def steps(rank: int, pid: int, first: int, last: int, t0: float,
          digest: str = "d") -> list[dict[str, Any]]:
    return [ev(t0 + s - first, "step", rank, pid, step=s, param_digest=f"{digest}{s}")
            for s in range(first, last + 1)]


def job(after: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Both groups start and step 1..10 together before ``T``; ``after`` follows."""
    out = [ev(1000.0, "start", 0, 100), ev(1000.0, "start", 1, 101)]
    out += steps(0, 100, 1, 10, 1000.2) + steps(1, 101, 1, 10, 1000.2)
    return sorted([*out, *after], key=lambda r: r["t"])


KILL = FaultRecord(id="kill", type="rank_kill", injected_t=T, target="rank 1",
                   details={"pids_by_rank": {"1": 101}})


def test_a_killed_group_heals_from_its_peer_and_the_survivor_loses_nothing() -> None:
    records = job([ev(1012.0, "start", 1, 102),  # its torchrun restarted it
                   *steps(0, 100, 11, 20, 1013.0), *steps(1, 102, 11, 20, 1013.0)])
    h = healing_metrics(records, [KILL])
    assert (h.survivor_restarts, h.survivor_lost_steps) == (0, 0)
    assert (h.healed_at_step, round(h.heal_time_s or 0, 2)) == (11, 2.5)
    assert h.healed_state_matches_peer is True
    assert "rank 1 healed at step 11" in h.note and "equal its peer's at steps 11..20" in h.note


def test_weights_that_differ_after_the_heal_are_named_at_their_first_step() -> None:
    records = job([ev(1012.0, "start", 1, 102), *steps(0, 100, 11, 20, 1013.0),
                   *steps(1, 102, 11, 12, 1013.0), *steps(1, 102, 13, 20, 1015.0, "x")])
    h = healing_metrics(records, [KILL])
    assert h.healed_state_matches_peer is False
    assert "rank 1's weights differ from its peer's at step 13" in h.note


def test_a_hung_group_heals_only_after_it_was_continued() -> None:
    hang = FaultRecord(id="hang", type="node_hang", injected_t=T, undone_t=1016.5,
                       target="node 1", details={"node": "node1", "pids": [101]})
    # the survivor waited for a quorum; the frozen process wrote nothing until continued
    records = job([*steps(0, 100, 11, 20, 1017.0), *steps(1, 101, 11, 20, 1017.0)])
    h = healing_metrics(records, [hang])
    assert (h.healed_at_step, round(h.heal_time_s or 0, 2)) == (11, 6.5)
    assert (h.survivor_restarts, h.survivor_lost_steps) == (0, 0)


def test_a_survivor_that_restarted_and_replayed_counts_both() -> None:
    records = job([ev(1011.0, "start", 0, 103), ev(1011.0, "start", 1, 102),
                   *steps(0, 103, 9, 20, 1013.0), *steps(1, 102, 9, 20, 1013.0)])
    h = healing_metrics(records, [KILL])
    assert (h.survivor_restarts, h.survivor_lost_steps) == (1, 2)  # steps 9 and 10 again
    assert h.note.startswith("rank(s) 0 (not struck) restarted 1 time(s) after the fault; ")


def test_a_lost_lighthouse_strikes_no_rank_and_a_stalled_job_lost_an_unknown_number() -> None:
    lighthouse = FaultRecord(id="lh", type="service_kill",
                             capabilities=("kills_service",), injected_t=T, target="all",
                             details={"service": "lighthouse", "pids": [99]})
    records = job([ev(1016.0, "exit", 0, 100, reason="error"), ev(1017.0, "start", 0, 104)])
    h = healing_metrics(records, [lighthouse])
    assert h.survivor_restarts == 1 and h.survivor_lost_steps is None
    assert (h.healed_at_step, h.heal_time_s, h.healed_state_matches_peer) == (None, None, None)
    assert "rank 0 (not struck) made no step after the fault" in h.note


def test_without_step_digests_the_match_is_not_measured() -> None:
    records = [{k: v for k, v in r.items() if k != "param_digest"}
               for r in job([ev(1012.0, "start", 1, 102), *steps(0, 100, 11, 12, 1013.0),
                             *steps(1, 102, 11, 12, 1013.0)])]
    h = healing_metrics(records, [KILL])
    assert h.healed_at_step == 11 and h.healed_state_matches_peer is None
    assert "observe.step_digest: true" in h.note


def test_a_group_that_starts_over_below_its_own_step_did_not_heal() -> None:
    # its peer had finished: the restarted group found nobody to heal from (seen with
    # --min_replicas 1) and trained from step 1 again, alone
    records = job([*steps(0, 100, 11, 16, 1012.5), ev(1013.0, "exit", 0, 100, reason="completed"),
                   ev(1013.2, "start", 1, 102), *steps(1, 102, 1, 16, 1015.0, "alone")])
    h = healing_metrics(records, [KILL])
    assert (h.healed_at_step, h.heal_time_s, h.healed_state_matches_peer) == (None, None, None)
    assert "stepped again at step 1, not past its step 10 before the fault: it started over" \
        in h.note
    assert (h.survivor_restarts, h.survivor_lost_steps) == (0, 0)


def test_a_job_of_own_worlds_completes_when_a_group_finishes_without_group_0() -> None:
    from faultlab.observe import compute_metrics

    lost = FaultRecord(id="lose-0", type="node_kill",
                       capabilities=("loses_node",), injected_t=T, target="node 0",
                       details={"node": "node0", "pids": [100]})
    after = [*steps(1, 101, 11, 16, 1013.0), ev(1019.0, "exit", 1, 101, reason="completed"),
             ev(1019.5, "final_digest", 0, 9, digest="f" * 64)]
    own = [{**r, "own_world": True} if r["kind"] == "start" else r for r in job(after)]
    metrics = compute_metrics(own, [lost])
    assert metrics.completes is True and metrics.survivor_lost_steps == 0
    # ranks of one world: rank 0 gone without an exit is a job that did not complete
    assert compute_metrics(job(after), [lost]).completes is False
