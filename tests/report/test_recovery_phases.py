"""faultlab.observe.phases on synthetic event streams, against hand-computed phases."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic import T0, Timing, rank_kill_events

from faultlab.observe import FaultRecord
from faultlab.observe.phases import PHASES, recovery_breakdown
from tests.fault_records import declared

Records = list[dict[str, Any]]


def ev(t: float, kind: str, rank: int, pid: int, restart: int = 0, **fields: Any
       ) -> dict[str, Any]:
    return {"t": T0 + t, "kind": kind, "rank": rank, "world_size": 2, "pid": pid,
            "restart": restart, "node": f"node{rank}", **fields}


def started(t: float, rank: int, pid: int, restart: int, resumed: int, *, created: float | None,
            main: float | None, pg: float | None, ready: float | None) -> dict[str, Any]:
    times = {"t_process_created": created, "t_main": main, "t_pg_ready": pg, "t_ready": ready}
    return ev(t, "start", rank, pid, restart, resumed_from_step=resumed,
              **{k: T0 + v for k, v in times.items() if v is not None})


def steps(first: int, last: int, t: float, pids: tuple[int, int], restart: int = 0,
          dt: float = 0.2) -> Records:
    out = []
    for n, step in enumerate(range(first, last + 1)):
        for rank, pid in enumerate(pids):
            out.append(ev(t + n * dt, "step", rank, pid, restart, step=step, loss=1.0))
    return out


def fault(at: float, type_: str = "rank_kill") -> FaultRecord:
    return FaultRecord(id="f", type=type_, capabilities=declared(type_), injected_t=T0 + at)


def seconds(events: Records, f: FaultRecord) -> dict[str, float | None]:
    return {k: None if v is None else round(v, 6)
            for k, v in recovery_breakdown(events, f).seconds().items()}


def test_a_rank_kill_is_cut_into_its_seven_phases() -> None:
    # rank 1 SIGKILLed 0.01 s after step 15; rank 0 exits 0.05 s later; new workers are created
    # 0.42 s after that, import for 1.8 s, init the group in 0.02 s and load step 10 in 1.2 s;
    # steps 11..15 take 0.2 s each: back at step 15 one second after ready.
    events, injected_t = rank_kill_events(timing=Timing())
    b = recovery_breakdown(events, FaultRecord("kill", "rank_kill", injected_t))
    assert b.went_down and b.new_processes == 2
    assert seconds(events, FaultRecord("kill", "rank_kill", injected_t)) == {
        "detection": 0.05, "teardown": 0.0, "rendezvous": 0.42, "process_start": 1.8,
        "process_group_init": 0.02, "checkpoint_load": 1.2, "replay": 1.0}
    assert b.recovery_time_s == pytest.approx(4.49)
    assert b.restart_overhead_s == pytest.approx(3.49)
    assert list(b.seconds()) == list(PHASES)


def test_teardown_waits_for_the_last_old_process_to_exit() -> None:
    # A hang: rank 0's watchdog fires 5 s in; the frozen rank 1, continued, exits 0.5 s later.
    events = [started(-3, 0, 1, 0, 0, created=-6, main=-4, pg=-3.9, ready=-3),
              started(-3, 1, 2, 0, 0, created=-6, main=-4, pg=-3.9, ready=-3),
              *steps(1, 15, -2.8, (1, 2)),
              ev(5.0, "anomaly", 0, 1, what="watchdog", step=15),
              ev(5.01, "exit", 0, 1, reason="watchdog"),
              ev(5.5, "exit", 1, 2, reason="error"),
              ev(9.0, "checkpoint_loaded", 0, 3, 1, step=10),
              started(9.0, 0, 3, 1, 10, created=6.0, main=7.8, pg=7.85, ready=9.0),
              started(9.0, 1, 4, 1, 10, created=6.1, main=7.9, pg=7.85, ready=9.0),
              *steps(11, 20, 9.2, (3, 4), restart=1)]
    assert seconds(events, fault(0.0, "rank_hang")) == {
        "detection": 5.0, "teardown": 0.5, "rendezvous": 0.6,  # the latest created: 6.1
        "process_start": 1.8, "process_group_init": 0.0,  # clamped: pg 7.85 < main 7.9
        "checkpoint_load": 1.1, "replay": 1.0}  # step 15 at 9.2 + 4 × 0.2 = 10.0


def test_a_trainer_without_startup_times_still_adds_up() -> None:
    # Its start records carry no t_process_created / t_main / t_pg_ready / t_ready: those
    # phases are not measured, and checkpoint_load absorbs them (from teardown to its start).
    events = [ev(-1, "start", 0, 1, resumed_from_step=0), ev(-1, "start", 1, 2,
                                                              resumed_from_step=0),
              *steps(1, 5, -0.9, (1, 2)),
              ev(0.1, "exit", 0, 1, reason="error"),
              ev(3.0, "start", 0, 3, 1, resumed_from_step=0),
              ev(3.0, "start", 1, 4, 1, resumed_from_step=0),
              *steps(1, 6, 3.5, (3, 4), restart=1)]
    b = recovery_breakdown(events, fault(0.0))
    assert seconds(events, fault(0.0)) == {
        "detection": 0.1, "teardown": 0.0, "rendezvous": None, "process_start": None,
        "process_group_init": None, "checkpoint_load": 2.9, "replay": 1.3}
    assert sum(v for v in b.seconds().values() if v is not None) == \
        pytest.approx(b.recovery_time_s)


def test_boundaries_never_go_backwards() -> None:
    # The kernel's process creation time is read off another clock: here it lies 0.2 s
    # before the old process's exit. The rendezvous phase is 0, not negative.
    events = [started(-2, 0, 1, 0, 0, created=-5, main=-3, pg=-2.5, ready=-2),
              *steps(1, 10, -1.9, (1, 1)),
              ev(0.3, "exit", 0, 1, reason="error"),
              started(2.0, 0, 3, 1, 10, created=0.1, main=1.5, pg=1.6, ready=2.0),
              *steps(11, 12, 2.2, (3, 3), restart=1)]
    s = seconds(events, fault(0.0))
    assert s["rendezvous"] == 0.0 and s["process_start"] == 1.2
    assert all(v is None or v >= 0 for v in s.values())


def test_a_fault_the_job_trained_through_has_only_a_detection() -> None:
    events = [ev(-1, "start", 0, 1, resumed_from_step=0), *steps(1, 5, -0.9, (1, 1)),
              ev(0.25, "anomaly", 0, 1, what="nonfinite_loss", step=6, action="skip"),
              *steps(6, 10, 0.3, (1, 1))]
    b = recovery_breakdown(events, fault(0.2, "grad_nan"))
    assert not b.went_down
    assert seconds(events, fault(0.2, "grad_nan")) == {
        "detection": 0.05, **{p: None for p in PHASES[1:]}}
    assert b.restart_overhead_s is None and b.recovery_time_s is None


def test_an_in_process_rollback_has_no_restart_phases() -> None:
    # Steps 1..12 end at -0.8; a NaN at step 13 rolls back to step 10 in the same process.
    events = [ev(-3.5, "start", 0, 1, resumed_from_step=0), *steps(1, 12, -3.0, (1, 1)),
              ev(0.3, "anomaly", 0, 1, what="nonfinite_loss", step=13, action="rollback"),
              ev(0.8, "checkpoint_loaded", 0, 1, step=10),
              *steps(11, 14, 1.0, (1, 1))]
    assert seconds(events, fault(0.2)) == {
        "detection": 0.1, "teardown": None, "rendezvous": None, "process_start": None,
        "process_group_init": None, "checkpoint_load": 0.5, "replay": 0.4}  # step 12 at 1.2


def test_a_job_that_never_came_back_has_no_replay() -> None:
    events = [ev(-1, "start", 0, 1, resumed_from_step=0), *steps(1, 5, -0.9, (1, 1)),
              ev(0.05, "exit", 0, 1, reason="error")]
    b = recovery_breakdown(events, fault(0.0))
    assert b.went_down and b.recovery_time_s is None and b.restart_overhead_s is None
    assert seconds(events, fault(0.0)) == {"detection": 0.05, "teardown": 0.0,
                                           **{p: None for p in PHASES[2:]}}


def test_only_the_incarnation_that_trained_counts() -> None:
    # Restart 1 dies while loading; restart 2 trains: the startup times are restart 2's.
    events = [started(-2, 0, 1, 0, 0, created=-5, main=-3, pg=-2.5, ready=-2),
              *steps(1, 10, -1.9, (1, 1)),
              ev(0.1, "exit", 0, 1, reason="error"),
              started(2.0, 0, 3, 1, 10, created=0.5, main=1.5, pg=1.6, ready=2.0),
              ev(2.5, "exit", 0, 3, 1, reason="error"),
              started(6.0, 0, 4, 2, 10, created=3.0, main=4.8, pg=4.9, ready=6.0),
              *steps(11, 11, 6.2, (4, 4), restart=2)]
    b = recovery_breakdown(events, fault(0.0))
    assert b.new_processes == 1
    assert b.boundaries["spawned_t"] == pytest.approx(T0 + 3.0)
    assert b.boundaries["ready_t"] == pytest.approx(T0 + 6.0)


timings = st.builds(Timing, **{name: st.floats(0.005, 5.0) for name in (
    "detect_s", "teardown_s", "spawn_s", "import_s", "pg_s", "load_s")},
    step_s=st.floats(0.01, 1.0))


@settings(max_examples=60, deadline=None)
@given(timings, st.integers(11, 39))
def test_phases_are_never_negative_and_add_up_to_the_recovery_time(
        timing: Timing, fault_step: int) -> None:
    events, injected_t = rank_kill_events(fault_step=fault_step, timing=timing)
    b = recovery_breakdown(events, FaultRecord("kill", "rank_kill", injected_t))
    values = [v for v in b.seconds().values() if v is not None]
    assert len(values) == len(PHASES) and all(v >= 0 for v in values)
    assert b.recovery_time_s is not None
    assert sum(values) == pytest.approx(b.recovery_time_s, abs=1e-6)
