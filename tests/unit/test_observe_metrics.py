"""faultlab.observe.metrics on synthetic event streams with hand-computed expectations.

``Job`` writes the records the reference trainer writes (same kinds and fields, same sample
layout: step ``s`` takes ``[(s-1)·G, s·G)``, rank ``r`` of ``W`` the ``r``-th near-equal
slice), with timestamps chosen by each test so every expected latency is exact arithmetic.
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faultlab.observe import FaultMetrics, FaultRecord, Metrics, compute_metrics
from faultlab.observe.metrics import completion
from tests.fault_records import declared

G = 12  # global batch


def local_slice(step: int, rank: int, world_size: int) -> list[int]:
    base, extra = divmod(G, world_size)
    start = (step - 1) * G + rank * base + min(rank, extra)
    return [start, start + base + (1 if rank < extra else 0)]


@dataclass
class Job:
    """Builds one job's event records, incarnation by incarnation."""

    records: list[dict[str, Any]] = field(default_factory=list)
    world_size: int = 0
    pids: dict[int, int] = field(default_factory=dict)  # rank -> pid of the current process
    restart: int = -1
    next_pid: int = 1000

    def emit(self, t: float, kind: str, rank: int, **fields: Any) -> dict[str, Any]:
        record = {"t": t, "kind": kind, "rank": rank, "world_size": self.world_size,
                  "pid": self.pids[rank], "restart": self.restart,
                  "node": f"node{rank}", **fields}
        self.records.append(record)
        return record

    def launch(self, t: float, world_size: int, *, resumed_from: int = 0) -> None:
        """A new worker group: new pids, in ``main`` at t - 0.5; load (if resuming) at ``t``,
        ``start`` at t + 0.2 (rank r 0.01·r later)."""
        self.world_size, self.restart = world_size, self.restart + 1
        for rank in range(world_size):
            self.pids[rank] = self.next_pid
            self.next_pid += 1
            if resumed_from:
                self.emit(t + 0.01 * rank, "checkpoint_loaded", rank, step=resumed_from,
                          path=f"ckpt/step_{resumed_from}", fell_back_from=[], rng="restored")
            self.emit(t + 0.2 + 0.01 * rank, "start", rank, resumed_from_step=resumed_from,
                      # created by its launcher 1 s before main (the interpreter start and
                      # imports): the kernel's start time, as the runtime reads it
                      t_process_created=t - 1.5, t_main=t - 0.5, t_ready=t + 0.2)

    def step(self, t: float, step: int, *, step_time_s: float = 0.5,
             skipped: bool = False, ranks: list[int] | None = None) -> None:
        for rank in range(self.world_size) if ranks is None else ranks:
            fields: dict[str, Any] = {"step": step, "loss": 2.0, "grad_norm": 1.0,
                                      "samples": [(step - 1) * G, step * G],
                                      "local_samples": local_slice(step, rank, self.world_size)}
            if skipped:
                fields["skipped"] = True
            else:
                fields["step_time_s"] = step_time_s
            self.emit(t + 0.001 * rank, "step", rank, **fields)

    def steps(self, t0: float, first: int, last: int, dt: float = 1.0, **kw: Any) -> None:
        """Steps first..last, step ``s`` at ``t0 + (s - first) * dt``."""
        for s in range(first, last + 1):
            self.step(t0 + (s - first) * dt, s, **kw)

    def save(self, t: float, step: int) -> None:
        for rank in range(self.world_size):
            self.emit(t, "checkpoint_saved", rank, step=step, path=f"ckpt/step_{step}",
                      seconds=0.05, stall_s=0.05, bytes=1000, **{"async": False})

    def rollback(self, t: float, step: int) -> None:
        for rank in range(self.world_size):
            self.emit(t, "checkpoint_loaded", rank, step=step, path=f"ckpt/step_{step}",
                      fell_back_from=[], rng="restored")

    def anomaly(self, t: float, what: str, action: str, ranks: list[int] | None = None,
                **fields: Any) -> None:
        for rank in range(self.world_size) if ranks is None else ranks:
            self.emit(t, "anomaly", rank, what=what, action=action, **fields)

    def exit(self, t: float, reason: str, ranks: list[int] | None = None) -> None:
        code = {"completed": 0, "stopped": 0, "error": 1, "watchdog": 3}.get(reason, 1)
        for rank in range(self.world_size) if ranks is None else ranks:
            self.emit(t + 0.01 * rank, "exit", rank, reason=reason, code=code)

    def finish(self, t: float, step: int, digest: str = "d" * 64) -> None:
        self.emit(t, "final_digest", 0, step=step, digest=digest, tensors={})
        self.exit(t + 0.1, "completed")


def fault(t: float, fid: str = "f1", type_: str = "rank_kill") -> FaultRecord:
    return FaultRecord(id=fid, type=type_,
                       capabilities=declared(type_), injected_t=t, target="rank 1")


def assert_json_safe(m: Metrics) -> None:
    json.dumps(m.to_dict(), allow_nan=False)


# --- scenarios -------------------------------------------------------------------------------

def clean_run() -> Job:
    job = Job()
    job.launch(100.0, 2)  # start at 100.2
    job.steps(101.0, 1, 10)  # step s at 100 + s
    job.save(105.1, 5)
    job.save(110.1, 10)
    job.finish(110.5, 10)  # exits at 110.6 and 110.61
    return job


def test_fault_free_run() -> None:
    m = compute_metrics(clean_run().records, [])
    assert m.completes and m.final_digest == "d" * 64
    assert (m.restarts, m.max_step, m.steps_committed, m.world_sizes) == (0, 10, 10, [2])
    assert m.wall_s == pytest.approx(110.61 - 100.2)
    assert m.goodput == pytest.approx(10 * 0.5 / (110.61 - 100.2))
    assert m.samples_exactly_once is True
    assert (m.detection_latency_s, m.resume_time_s, m.recovery_time_s) == (None, None, None)
    assert m.lost_steps == 0 and m.faults == []
    assert_json_safe(m)


def rank_kill_run() -> Job:
    job = Job()
    job.launch(100.0, 2)
    job.steps(101.0, 1, 12)  # step 12 at 112
    job.save(110.1, 10)
    # SIGKILL rank 1 at 112.5: it writes nothing more; its peer's collective fails at 113.5.
    job.exit(113.5, "error", ranks=[0])
    job.launch(115.0, 2, resumed_from=10)  # new pids load step 10 at 115.0, start at 115.2
    job.steps(116.0, 11, 15)  # 11 at 116 (first step back), 12 at 117 (recovered), 15 at 120
    job.save(120.1, 15)
    job.finish(120.5, 15)
    return job


def test_rank_kill_restart_resumes_from_last_checkpoint() -> None:
    m = compute_metrics(rank_kill_run().records, [fault(112.5)])
    (f,) = m.faults
    assert f.high_water_step == 12
    assert f.detection_t == 113.5 and f.detected_by == "exit:error (rank 0)"
    assert f.detection_source == "error_exit"  # the survivor's failed collective, before the
    assert f.detection_latency_s == pytest.approx(1.0)  # launcher spawned anything (113.5)
    assert f.came_back_t == 115.0 and f.resumed_from_step == 10
    assert f.resume_time_s == pytest.approx(116.0 - 112.5)
    assert f.recovery_time_s == pytest.approx(117.0 - 112.5)
    assert f.lost_steps == 2 and f.went_down
    assert (m.detection_latency_s, m.resume_time_s, m.recovery_time_s, m.lost_steps) == (
        f.detection_latency_s, f.resume_time_s, f.recovery_time_s, 2)
    assert m.restarts == 1 and m.completes and m.max_step == 15
    # Steps 11 and 12 ran twice; the replays are the committed ones, counted once.
    assert m.steps_committed == 15 and m.samples_exactly_once is True
    assert m.goodput == pytest.approx(15 * 0.5 / (120.61 - 100.2))
    assert_json_safe(m)


def test_a_level2_trainer_under_the_bootstrap_is_not_restarted_twice() -> None:
    """A level-2 trainer given as target.command: the level-0 observer writes a start at
    ``import torch`` in every process, before the trainer's own. It is one process, one start."""
    job = rank_kill_run()
    expected = compute_metrics(job.records, [fault(112.5)])
    observer_starts = [{**r, "t": r["t"] - 0.3, "level": 0, "resumed_from_step": None}
                       for r in job.records if r["kind"] == "start"]
    m = compute_metrics(job.records + observer_starts, [fault(112.5)])
    assert m.restarts == 1 and m == expected
    level0_only = [r for r in job.records if r["kind"] != "start"] + observer_starts
    assert compute_metrics(level0_only, [fault(112.5)]).restarts == 1  # level 0: its starts count


def test_input_order_does_not_matter() -> None:
    records = rank_kill_run().records
    expected = compute_metrics(records, [fault(112.5)])
    shuffled = records[:]
    random.Random(0).shuffle(shuffled)
    assert compute_metrics(shuffled, [fault(112.5)]) == expected


def test_no_survivor_detected_when_the_launcher_spawned_the_new_worker() -> None:
    """No rank survives to report an error (one rank, or every rank killed): the first sign is
    the launcher creating the new worker, long before that worker writes its first record."""
    job = rank_kill_run()
    job.records = [r for r in job.records if r["kind"] != "exit" or r["t"] > 120]
    (f,) = compute_metrics(job.records, [fault(112.5)]).faults
    assert f.detection_source == "launcher_respawn"
    assert f.detected_by == "process_spawned (rank 0, pid 1002)"
    assert f.detection_t == 115.0 - 1.5 and f.detection_latency_s == pytest.approx(1.0)
    # the rest is measured from the records, as before: the first came-back record is the load
    assert f.came_back_t == 115.0 and f.resumed_from_step == 10 and f.lost_steps == 2


def test_restart_detected_by_new_pid_when_nothing_else_was_written() -> None:
    job = rank_kill_run()
    job.records = [r for r in job.records if r["kind"] != "exit" or r["t"] > 120]
    job.records = [r for r in job.records if r["kind"] != "checkpoint_loaded"]
    for r in job.records:
        r.pop("t_process_created", None)  # a trainer that does not say when it was created
    (f,) = compute_metrics(job.records, [fault(112.5)]).faults
    assert f.detected_by == "start (rank 0)" and f.detection_t == 115.2
    assert f.detection_source == "restart_record"
    assert f.came_back_t == 115.2 and f.resumed_from_step == 10 and f.lost_steps == 2


def test_a_creation_time_at_or_before_the_fault_is_no_reaction() -> None:
    """A process created before the fault (still starting up when it struck) did not react."""
    job = rank_kill_run()
    job.records = [r for r in job.records if r["kind"] != "exit" or r["t"] > 120]
    for r in job.records:
        if r["kind"] == "start" and r["pid"] in (1002, 1003):  # the restarted group's pids
            r["t_process_created"] = 112.5
    (f,) = compute_metrics(job.records, [fault(112.5)]).faults
    assert f.detection_source == "restart_record" and f.detected_by == "checkpoint_loaded (rank 0)"


def node_loss_run() -> Job:
    job = Job()
    job.launch(100.0, 3)
    job.steps(101.0, 1, 10)
    job.save(110.1, 10)
    job.step(111.0, 11, ranks=[0, 1])  # node2 dies at 111.2 as it finishes step 11
    job.exit(112.0, "error", ranks=[0, 1])
    job.launch(114.0, 2, resumed_from=10)  # 3 -> 2: loads at 114.0, starts at 114.2
    job.steps(115.0, 11, 16)
    job.finish(120.5, 16)
    return job


def test_node_loss_world_size_change_keeps_samples_exactly_once() -> None:
    m = compute_metrics(node_loss_run().records, [fault(111.2, type_="node_kill")])
    (f,) = m.faults
    assert m.world_sizes == [3, 2] and m.restarts == 1 and m.completes
    assert f.high_water_step == 11 and f.resumed_from_step == 10 and f.lost_steps == 1
    assert f.detection_latency_s == pytest.approx(0.8)
    assert f.resume_time_s == pytest.approx(115.0 - 111.2)
    assert f.recovery_time_s == pytest.approx(115.0 - 111.2)  # step 11 again: back at H
    # The 3-rank step 11 (4 samples per rank) was replaced by the 2-rank one (6 per rank).
    assert m.samples_exactly_once is True


def _edit(job: Job, step: int, rank: int, world_size: int, **fields: Any) -> None:
    for r in reversed(job.records):
        if (r["kind"], r["step"] if r["kind"] == "step" else None, r["rank"],
                r["world_size"]) == ("step", step, rank, world_size):
            r.update(fields)
            return
    raise AssertionError("no such record")


@pytest.mark.parametrize("broken", ["repeated_samples", "overlapping_slices", "gap",
                                    "slice_outside_step", "short_union", "step_missing"])
def test_broken_sample_accounting_is_caught(broken: str) -> None:
    job = node_loss_run()
    if broken == "repeated_samples":  # step 13 trained on step 12's samples again
        _edit(job, 13, 0, 2, samples=[11 * G, 12 * G])
    elif broken == "overlapping_slices":  # rank 1 took one of rank 0's samples
        _edit(job, 14, 1, 2, local_samples=[13 * G + 5, 14 * G])
    elif broken == "gap":
        _edit(job, 13, 0, 2, samples=[12 * G + 1, 13 * G])
    elif broken == "slice_outside_step":
        _edit(job, 14, 1, 2, local_samples=[13 * G + 6, 14 * G + 1])
    elif broken == "short_union":  # both slices disjoint, but a sample was never trained on
        _edit(job, 14, 1, 2, local_samples=[13 * G + 7, 14 * G])
    else:  # no rank-0 record of step 12 at all
        job.records = [r for r in job.records if not (r["kind"] == "step" and r["step"] == 12
                                                      and r["rank"] == 0)]
    assert compute_metrics(job.records, []).samples_exactly_once is False


def test_a_rank_line_lost_to_sigkill_is_not_held_against_the_step() -> None:
    job = node_loss_run()
    job.records = [r for r in job.records if not (r["kind"] == "step" and r["step"] == 14
                                                  and r["rank"] == 1)]
    assert compute_metrics(job.records, []).samples_exactly_once is True


def test_samples_not_measured_without_samples() -> None:
    job = clean_run()
    for r in job.records:
        r.pop("samples", None)
    assert compute_metrics(job.records, []).samples_exactly_once is None
    for r in job.records:
        r.pop("local_samples", None)
    assert compute_metrics(job.records, []).samples_exactly_once is None


def test_local_samples_are_optional() -> None:
    job = node_loss_run()
    for r in job.records:
        r.pop("local_samples", None)
    assert compute_metrics(job.records, []).samples_exactly_once is True


def rollback_run() -> Job:
    job = Job()
    job.launch(100.0, 2)
    job.steps(101.0, 1, 13)  # step 13 at 113
    job.save(110.1, 10)
    # NaN injected at 113.2; step 14 sees it at 113.5, both ranks roll back in-process.
    job.anomaly(113.5, "nonfinite_loss", "rollback", step=14)
    job.rollback(114.0, 10)
    job.steps(114.5, 11, 16)  # 11 at 114.5, 13 at 116.5 (recovered), 16 at 119.5
    job.finish(120.0, 16)
    return job


def test_in_process_rollback_comes_back_without_a_restart() -> None:
    m = compute_metrics(rollback_run().records, [fault(113.2, type_="grad_nan")])
    (f,) = m.faults
    assert f.detected_by == "anomaly:nonfinite_loss (rank 0)"
    assert f.detection_latency_s == pytest.approx(0.3)
    assert f.came_back_t == 114.0 and f.resumed_from_step == 10 and f.lost_steps == 3
    assert f.resume_time_s == pytest.approx(114.5 - 113.2)
    assert f.recovery_time_s == pytest.approx(116.5 - 113.2)
    assert m.restarts == 0 and m.completes and m.samples_exactly_once is True


def test_hang_detected_by_the_watchdog() -> None:
    job = Job()
    job.launch(100.0, 2)
    job.steps(101.0, 1, 8)
    job.save(105.1, 5)
    # Rank 1 SIGSTOPped at 108.4; rank 0 blocks in a collective until its 5 s watchdog fires.
    job.anomaly(113.0, "watchdog", "exit", ranks=[0], step=8, idle_s=5.0)
    job.exit(113.0, "watchdog", ranks=[0])
    job.launch(115.0, 2, resumed_from=5)
    job.steps(116.0, 6, 10)
    job.finish(120.5, 10)
    m = compute_metrics(job.records, [fault(108.4, type_="rank_hang")])
    (f,) = m.faults
    assert f.detected_by == "anomaly:watchdog (rank 0)"
    assert f.detection_latency_s == pytest.approx(113.0 - 108.4)
    assert f.came_back_t == 115.0 and f.resumed_from_step == 5 and f.lost_steps == 3
    assert f.resume_time_s == pytest.approx(116.0 - 108.4)
    assert f.recovery_time_s == pytest.approx(118.0 - 108.4)  # step 8 again
    assert m.restarts == 1 and m.completes


def test_fault_nobody_noticed() -> None:
    m = compute_metrics(clean_run().records, [fault(104.5, type_="collective_delay")])
    (f,) = m.faults
    assert f.high_water_step == 4 and not f.went_down
    assert (f.detection_t, f.came_back_t, f.resumed_from_step) == (None, None, None)
    assert (f.detection_latency_s, f.resume_time_s, f.recovery_time_s) == (None, None, None)
    assert f.lost_steps == 0
    assert (m.detection_latency_s, m.resume_time_s, m.recovery_time_s, m.lost_steps) == (
        None, None, None, 0)
    assert m.completes


def test_noticed_but_trained_through_is_not_down() -> None:
    job = Job()
    job.launch(100.0, 2)
    job.steps(101.0, 1, 4)
    job.anomaly(105.0, "nonfinite_loss", "skip", step=5)
    job.step(105.0, 5, skipped=True)
    job.steps(106.0, 6, 8)
    job.finish(108.5, 8)
    m = compute_metrics(job.records, [fault(104.5, type_="grad_nan")])
    (f,) = m.faults
    assert f.detection_latency_s == pytest.approx(0.5) and not f.went_down
    assert (f.resume_time_s, f.recovery_time_s, f.lost_steps) == (None, None, 0)
    assert (m.resume_time_s, m.lost_steps) == (None, 0)
    assert m.samples_exactly_once is True  # the skipped batch counts as consumed
    assert m.goodput == pytest.approx(7 * 0.5 / (108.61 - 100.2))  # step 5 counts 0


def test_missing_final_digest_does_not_complete() -> None:
    job = clean_run()
    job.records = [r for r in job.records if r["kind"] != "final_digest"]
    m = compute_metrics(job.records, [])
    assert not m.completes and m.final_digest is None and m.max_step == 10
    assert "without a final_digest" in completion(job.records)[1]


@pytest.mark.parametrize("level", [0, 1])
def test_a_level0_job_that_finished_completes_without_a_checkpoint(level: int) -> None:
    """A torchft trainer that keeps no checkpoint: both groups trained every step and exited
    completed with code 0, and faultlab's agent wrote their exits; no final state to read
    back. A job that finished is complete; the bitwise verdict says what it cannot judge."""
    job = clean_run()
    job.records = [r for r in job.records if r["kind"] != "final_digest"]
    for r in job.records:
        if r["kind"] == "exit":
            r["level"] = level
    m = compute_metrics(job.records, [])
    assert m.completes and m.final_digest is None
    assert completion(job.records) == (True, "")


def test_completes_false_always_says_why() -> None:
    job = clean_run()
    no_exit = [r for r in job.records if r["kind"] != "exit"]
    assert "wrote no exit record" in completion(no_exit)[1]
    failed = [dict(r, reason="error", error="RuntimeError: boom\nmore") if r["kind"] == "exit"
              and r["rank"] == 0 else r for r in job.records]
    assert completion(failed)[1] == "rank 0 last exited error (RuntimeError: boom)"
    restarted = [*job.records, {**job.records[0], "t": job.records[-1]["t"] + 1, "pid": 999}]
    assert "a process started after that" in completion(restarted)[1]


@pytest.mark.parametrize("ending", ["no_exit", "rank1_error_after_complete", "rank0_error"])
def test_a_run_whose_last_exits_are_not_clean_does_not_complete(ending: str) -> None:
    job = clean_run()
    if ending == "no_exit":
        job.records = [r for r in job.records if r["kind"] != "exit"]
    elif ending == "rank1_error_after_complete":
        job.records[-1].update(reason="error", code=1)
    else:
        job.exit(111.0, "error", ranks=[0])
    assert not compute_metrics(job.records, []).completes


def test_a_rank_left_out_of_the_final_world_may_exit_with_an_error_after_it_finished() -> None:
    """A partitioned node's rank (2 of 3) outlives the group that restarted without it, and
    exits with an error when the survivors' sockets close, after they completed: the final
    incarnation (ranks 0 and 1, world 2) still completed. A rank of the final world that
    exits with an error after the last start is still unclean."""
    job = Job()
    job.launch(100.0, 3)
    job.steps(101.0, 1, 5)
    stale = job.pids[2]
    job.exit(106.0, "watchdog", ranks=[0, 1])
    job.launch(110.0, 2, resumed_from=5)
    job.steps(111.0, 6, 10)
    job.finish(115.5, 10)
    late = {"t": 127.0, "kind": "exit", "rank": 2, "world_size": 3, "pid": stale,
            "restart": 0, "node": "node2", "reason": "error", "code": 1,
            "error": "RuntimeError: Connection closed by peer"}
    assert completion([*job.records, late]) == (True, "")
    survivor = {**late, "rank": 1, "world_size": 2, "pid": job.pids[1], "restart": 1}
    assert "rank 1 of the final incarnation exited error" in completion(
        [*job.records, survivor])[1]


def test_the_old_rank_0_of_a_node_left_out_may_exit_after_the_final_rank_0_completed() -> None:
    """The partitioned node held rank 0: its process outlives the group that restarted without
    it and writes its error exit after the new rank 0 completed. The newest rank-0 exit is the
    old incarnation's, not the final one's: the job still completed."""
    job = Job()
    job.launch(100.0, 3)
    job.steps(101.0, 1, 5)
    stale = job.pids[0]
    job.exit(106.0, "watchdog", ranks=[1, 2])
    job.launch(110.0, 2, resumed_from=5)
    job.steps(111.0, 6, 10)
    job.finish(115.5, 10)
    late = {"t": 127.0, "kind": "exit", "rank": 0, "world_size": 3, "pid": stale,
            "restart": 0, "node": "node0", "reason": "error", "code": 1,
            "error": "RuntimeError: Connection closed by peer"}
    assert completion([*job.records, late]) == (True, "")


def test_run_killed_before_any_step() -> None:
    job = Job()
    job.launch(100.0, 2)  # start at 100.2
    job.exit(101.0, "error")
    m = compute_metrics(job.records, [fault(100.5)])
    (f,) = m.faults
    assert f.high_water_step == 0 and f.went_down and f.detection_latency_s == pytest.approx(0.5)
    assert (f.came_back_t, f.resume_time_s, f.recovery_time_s, f.lost_steps) == (
        None, None, None, None)
    # It went down and never came back: unmeasurable, not "zero".
    assert (m.resume_time_s, m.recovery_time_s, m.lost_steps) == (None, None, None)
    assert m.detection_latency_s == pytest.approx(0.5)
    assert (m.completes, m.max_step, m.steps_committed, m.samples_exactly_once) == (
        False, 0, 0, None)
    assert m.goodput is None  # a run that never finished has no goodput to speak of
    assert_json_safe(m)


def test_fault_during_start_up_is_not_mistaken_for_a_restart() -> None:
    # The processes are in main at 99.5 and write their first record (start) at 100.2: a
    # fault at 99.8 came before that, but they were running already, not restarted for it.
    job = Job()
    job.launch(100.0, 2)
    job.steps(101.0, 1, 3)
    job.finish(103.5, 3)
    (f,) = compute_metrics(job.records, [fault(99.8)]).faults
    assert f.detection_t is None and f.came_back_t is None and not f.went_down
    # Without t_main nothing says they existed before the fault: taken as restarted for it.
    for r in job.records:
        r.pop("t_main", None)
    (f,) = compute_metrics(job.records, [fault(99.8)]).faults
    assert f.came_back_t == pytest.approx(100.2) and f.lost_steps == 0


def test_fault_before_first_step_on_a_restarted_job() -> None:
    job = Job()
    job.launch(100.0, 2)  # start at 100.2, never steps
    job.exit(101.0, "error", ranks=[0])
    job.launch(103.0, 2)  # no checkpoint: resumes from 0
    job.steps(104.0, 1, 3)
    job.finish(106.5, 3)
    (f,) = compute_metrics(job.records, [fault(100.5)]).faults
    assert (f.high_water_step, f.resumed_from_step, f.lost_steps) == (0, 0, 0)
    assert f.came_back_t == pytest.approx(103.2)
    assert f.resume_time_s == pytest.approx(3.5) and f.recovery_time_s == pytest.approx(3.5)


def test_resumed_at_the_last_step_recovers_at_its_clean_exit() -> None:
    job = Job()
    job.launch(100.0, 1)
    job.steps(101.0, 1, 4)
    job.save(104.1, 4)
    job.exit(105.0, "error")  # killed while writing the digest
    job.launch(106.0, 1, resumed_from=4)
    job.finish(107.0, 4)
    (f,) = compute_metrics(job.records, [fault(104.5)]).faults
    assert f.lost_steps == 0
    assert f.resume_time_s == pytest.approx(107.1 - 104.5)
    assert f.recovery_time_s == pytest.approx(107.1 - 104.5)


def test_two_faults_report_the_worst() -> None:
    job = rank_kill_run()  # fault 1 at 112.5: detect 1.0, resume 3.5, recover 4.5, lost 2
    job.records = [r for r in job.records if r["t"] < 120.1]  # drop the save and finish
    job.anomaly(120.3, "nonfinite_loss", "rollback", step=16)  # fault 2 at 120.2
    job.rollback(120.5, 15)
    job.steps(121.0, 16, 17)  # resume 0.8 and recovery 0.8 after fault 2, 0 lost
    job.finish(122.5, 17)
    m = compute_metrics(job.records, [fault(120.2, "nan", "grad_nan"), fault(112.5)])
    assert [f.fault_id for f in m.faults] == ["f1", "nan"]  # by injection time
    nan = m.faults[1]
    assert nan.detection_latency_s == pytest.approx(0.1) and nan.lost_steps == 0
    assert nan.resume_time_s == pytest.approx(0.8) and nan.recovery_time_s == pytest.approx(0.8)
    assert m.detection_latency_s == pytest.approx(1.0)
    assert m.resume_time_s == pytest.approx(3.5)
    assert m.recovery_time_s == pytest.approx(4.5)
    assert m.lost_steps == 2


def test_one_unrecovered_fault_makes_the_run_level_times_unmeasured() -> None:
    job = rank_kill_run()
    job.records = [r for r in job.records if r["t"] < 120.1]
    job.exit(121.0, "error")  # second fault at 120.5: the job dies for good
    m = compute_metrics(job.records, [fault(112.5), fault(120.5, "f2")])
    assert m.faults[1].went_down and m.faults[1].resume_time_s is None
    assert (m.resume_time_s, m.recovery_time_s, m.lost_steps) == (None, None, None)
    assert m.detection_latency_s == pytest.approx(1.0)
    assert not m.completes


def test_goodput_with_skipped_steps_and_a_replay() -> None:
    job = Job()
    job.launch(100.0, 1)  # start at 100.2
    job.steps(101.0, 1, 6, step_time_s=0.5)
    job.save(104.1, 4)
    job.anomaly(106.5, "nonfinite_loss", "rollback", step=7)
    job.rollback(106.6, 4)
    job.steps(107.0, 5, 6, step_time_s=0.25)  # the replay replaces steps 5 and 6
    job.step(109.0, 7, skipped=True)
    job.step(110.0, 8, step_time_s=0.5)
    job.finish(110.5, 8)
    m = compute_metrics(job.records, [])
    useful = 4 * 0.5 + 2 * 0.25 + 0 + 0.5
    assert m.steps_committed == 8 and m.max_step == 8
    assert m.wall_s == pytest.approx(110.6 - 100.2)
    assert m.goodput == pytest.approx(useful / (110.6 - 100.2))
    assert m.samples_exactly_once is True


def test_steps_rolled_back_and_never_redone_are_not_committed() -> None:
    job = Job()
    job.launch(100.0, 1)
    job.steps(101.0, 1, 6)
    job.rollback(106.5, 4)
    job.step(107.0, 5)
    job.finish(107.5, 5)
    m = compute_metrics(job.records, [])
    assert m.steps_committed == 5 and m.max_step == 6
    assert m.goodput == pytest.approx(5 * 0.5 / (107.6 - 100.2))


def test_missing_optional_fields_and_garbage_never_crash() -> None:
    stripped = [{"t": r["t"], "kind": r["kind"]} for r in rank_kill_run().records]
    garbage: list[Any] = [{"kind": "step", "step": 3}, {"t": "soon", "kind": "exit"},
                          {"t": float("nan"), "kind": "start"}, {"t": 105.0}, "not a record",
                          {"t": 106.0, "kind": "step", "step": "7", "samples": "all",
                           "step_time_s": float("inf")},
                          {"t": 107.0, "kind": "start", "resumed_from_step": None, "pid": None},
                          {"t": 113.0, "kind": "exit", "reason": ["error"], "pid": [1], "rank": {}},
                          {"t": 114.0, "kind": "checkpoint_loaded", "pid": {"a": 1}, "step": []},
                          {"t": 115.0, "kind": "step", "step": 1, "rank": 0, "pid": [2],
                           "samples": [0, 12], "local_samples": [0, 12], "world_size": 1}]
    m = compute_metrics(stripped + garbage, [fault(112.5)])
    # step 1 alone is a tiling, but the run never finished: not "exactly once" for a run
    assert m.max_step == 1 and not m.completes and m.samples_exactly_once is None
    assert_json_safe(m)


def test_empty_stream() -> None:
    m = compute_metrics([], [fault(1.0)])
    assert (m.completes, m.final_digest, m.restarts, m.max_step, m.wall_s, m.goodput) == (
        False, None, 0, 0, 0.0, None)
    # nothing happened after the fault: what it cost is unknown, not 0
    assert m.faults[0].detection_t is None and m.lost_steps is None
    assert m.to_dict()["faults"][0]["fault_id"] == "f1"


def test_to_dict_is_json_safe_and_complete() -> None:
    m = compute_metrics(rank_kill_run().records, [fault(112.5)])
    d = json.loads(json.dumps(m.to_dict(), allow_nan=False))
    assert d["lost_steps"] == 2 and d["faults"][0]["resumed_from_step"] == 10
    assert set(d) >= {"completes", "final_digest", "restarts", "max_step", "goodput",
                      "samples_exactly_once", "world_sizes", "steps_committed", "wall_s",
                      "detection_latency_s", "resume_time_s", "recovery_time_s"}
    rec = FaultRecord(id="x", type="t", injected_t=1.0, details={"pids": (1, 2), "x": 1e999})
    assert rec.to_dict()["details"] == {"pids": [1, 2], "x": None}
    assert FaultRecord(id="a", type="t", injected_t=0).details == {}


def test_public_names() -> None:
    import faultlab.observe as observe

    public = {n for n, v in vars(observe).items()
              if not n.startswith("_") and not isinstance(v, ModuleType)}
    assert sorted(observe.__all__) == sorted(public) == [
        "EventStream", "FaultMetrics", "FaultRecord", "Metrics", "compute_metrics"]


# --- property: nothing a job can write makes the metrics crash or go negative ----------------

ACTIONS = ["step", "step", "step", "save", "kill", "restart", "rollback", "anomaly",
           "skip", "exit_error", "finish", "world_change"]


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[FaultRecord]]:
    job = Job()
    t = 100.0
    job.launch(t, draw(st.integers(1, 3)))
    step = saved = 0
    for action in draw(st.lists(st.sampled_from(ACTIONS), max_size=40)):
        t += draw(st.sampled_from([0.0, 0.001, 0.1, 0.5, 1.0, 3.0]))
        if action in ("step", "skip"):
            step += 1
            job.step(t, step, skipped=action == "skip")
        elif action == "save":
            job.save(t, step)
            saved = step
        elif action == "kill":
            job.exit(t, "error", ranks=[0])
        elif action in ("restart", "world_change"):
            ws = draw(st.integers(1, 3)) if action == "world_change" else job.world_size
            job.launch(t, ws, resumed_from=saved)
            step = saved
        elif action == "rollback":
            job.rollback(t, saved)
            step = saved
        elif action == "anomaly":
            job.anomaly(t, "nonfinite_loss", "rollback", step=step + 1)
        elif action == "exit_error":
            job.exit(t, "error")
        else:
            job.finish(t, step)
    records = job.records
    # Damage: drop fields, garble some, drop records, shuffle.
    optional = ["pid", "rank", "world_size", "step", "samples", "local_samples", "reason",
                "resumed_from_step", "t_main", "step_time_s"]
    junk: st.SearchStrategy[Any] = st.sampled_from(
        [None, "x", [1], {}, [5, 1], float("nan"), -1, 2.5, True])
    for r in records:
        for key in draw(st.sets(st.sampled_from(optional), max_size=2)):
            r.pop(key, None)
        if draw(st.integers(0, 9)) == 0:  # now and then a field of the wrong type
            r[draw(st.sampled_from(optional))] = draw(junk)
    keep = draw(st.lists(st.booleans(), min_size=len(records), max_size=len(records)))
    records = [r for r, k in zip(records, keep, strict=True) if k or r["kind"] == "step"]
    records = draw(st.permutations(records))
    times = st.floats(95.0, t + 5.0, allow_nan=False)
    faults = [FaultRecord(id=f"f{i}", type="rank_kill", injected_t=x)
              for i, x in enumerate(draw(st.lists(times, max_size=3)))]
    return list(records), faults


@settings(max_examples=150, deadline=None)
@given(streams())
def test_metrics_never_raise_and_latencies_are_non_negative(
        case: tuple[list[dict[str, Any]], list[FaultRecord]]) -> None:
    records, faults = case
    m = compute_metrics(records, faults)
    both: list[FaultMetrics | Metrics] = [*m.faults, m]
    for f in both:
        for name in ("detection_latency_s", "resume_time_s", "recovery_time_s"):
            value = getattr(f, name)
            assert value is None or value >= 0, (name, value)
        assert f.lost_steps is None or f.lost_steps >= 0
    for f in m.faults:
        if f.resume_time_s is not None:
            assert f.detection_latency_s is not None
            assert f.detection_latency_s <= f.resume_time_s
        if f.recovery_time_s is not None:
            assert f.resume_time_s is not None and f.resume_time_s <= f.recovery_time_s
        if not f.went_down:
            assert (f.resume_time_s, f.recovery_time_s) == (None, None)
            assert f.lost_steps in (0, None)
    assert m.goodput is None or m.goodput >= 0
    assert_json_safe(m)


def test_faults_may_come_as_a_generator_and_pids_garbled() -> None:
    """Found while splitting the module: the faults were read twice (a generator came back
    empty for the corrupt-checkpoint check) and an unhashable pid raised in the step times."""
    ckpt = "/run/checkpoints/step_00000010"
    fault = FaultRecord(id="f", type="ckpt_bitflip", injected_t=5.0,
                        details={"checkpoints": [ckpt]})
    events = [{"t": 1.0, "kind": "start", "rank": 0, "pid": [1], "world_size": 1},
              *({"t": 1.0 + s, "kind": "step", "rank": 0, "pid": [1], "step": s,
                 "step_time_s": 0.1} for s in range(1, 6)),
              {"t": 7.0, "kind": "checkpoint_loaded", "rank": 0, "pid": 9, "step": 10,
               "path": ckpt}]
    as_list = compute_metrics(events, [fault])
    assert as_list.corrupt_checkpoint_never_loaded is False
    assert compute_metrics(events, iter([fault])).to_dict() == as_list.to_dict()
    slow = FaultRecord(id="s", type="collective_delay", capabilities=("slows_job",), injected_t=4.5)
    compute_metrics(events, [slow])  # must not raise on the list-valued pid


def test_slowdown_of_a_step_window_compares_the_window_not_the_rest_of_the_run() -> None:
    """collective_delay with num_steps is in force for its window only: "during" is steps
    5-7 (3 s each), not every step after the injection (steps 8-10 are back at 1 s). Taken
    over all of them the median was 1 s: the 1.163 that collective_delay_straggler reported."""
    job = Job()
    job.launch(100.0, 2)
    job.steps(101.0, 1, 4, step_time_s=1.0)
    job.steps(105.0, 5, 7, dt=3.0, step_time_s=3.0)
    job.steps(111.0, 8, 12, step_time_s=1.0)
    job.finish(112.5, 12)
    windowed = FaultRecord(id="slow", type="collective_delay",
                           capabilities=("slows_job",), injected_t=104.5,
                           target="rank 1", details={"ranks": [1], "window_steps": [5, 7]})
    assert compute_metrics(job.records, [windowed]).slowdown == 3.0
    unbounded = FaultRecord(id="slow", type="collective_delay",
                            capabilities=("slows_job",), injected_t=104.5,
                            target="rank 1", details={"ranks": [1]})
    assert compute_metrics(job.records, [unbounded]).slowdown == 1.0
    garbled = dataclasses.replace(windowed, details={"window_steps": ["x", None]})
    assert compute_metrics(job.records, [garbled]).slowdown == 1.0
