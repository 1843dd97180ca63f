"""Every SLA on a run that ended early: none reports True from evidence the run never produced.

The run: 2 ranks, a checkpoint at step 10, the fault at step 12, rank 0 left with an error
at step 15 of 40 and nothing started again (as the reference job that lost its only GPU left
with exit 7 at step 15 of 40 on an H100 and was reported ``samples_exactly_once``). For each
SLA the table says what the run did show: a time of something that happened stands, a count of
what it did stands, and whatever rests on the run having finished is "not measured". A new SLA
must get its row here (the last test).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from faultlab.judge.slas import SLAS
from faultlab.judge.verdict import judge
from faultlab.observe import FaultRecord, compute_metrics
from faultlab.observe.metrics import withhold_unfinished
from faultlab.spec import experiment_from_dict
from faultlab.spec._detection import ASKS_FOR_FAULT
from tests.fault_records import declared

T = 1012.0  # the fault, just after step 12
G = 8  # global batch
NOT_MEASURED = None


def ev(t: float, kind: str, rank: int = 0, **fields: Any) -> dict[str, Any]:
    return {"t": t, "kind": kind, "rank": rank, "pid": 100 + rank, "world_size": 2,
            "node": f"node{rank}", **fields}


def early_end(extra: list[dict[str, Any]] = ()) -> list[dict[str, Any]]:  # type: ignore[assignment]
    """Steps 1..15 on both ranks, every sample once so far, a checkpoint at 10, then rank 0
    left with an error; ``extra`` adds records by time."""
    out = [ev(1000.0, "start", r, resumed_from_step=0, t_process_created=998.0,
              t_main=999.0) for r in (0, 1)]
    for step in range(1, 16):
        for r in (0, 1):
            out.append(ev(1000.0 + step, "step", r, step=step, step_time_s=0.9,
                          samples=[(step - 1) * G, step * G],
                          local_samples=[(step - 1) * G + r * 4, (step - 1) * G + r * 4 + 4]))
    out.append(ev(1010.2, "checkpoint_saved", 0, step=10, path="/run/checkpoints/step_10",
                  seconds=0.1))
    out.append(ev(1015.5, "exit", 0, reason="error", code=7, step=15,
                  error="GpuLostError: Xid 79"))
    return sorted([*out, *extra], key=lambda r: r["t"])


class _Golden:
    digest = "d" * 64
    tensors: dict[str, str] = {}
    not_measured = None


@dataclass
class Case:
    bound: Any
    """The experiment's bound for the SLA."""
    expected: Any
    """What the SLA must measure on the early-ended run (None: not measured)."""
    fault: FaultRecord = field(default_factory=lambda: FaultRecord(
        id="kill", type="rank_kill", injected_t=T, target="rank 1"))
    records: list[dict[str, Any]] = field(default_factory=list)
    timed_out: bool = False
    metrics: dict[str, Any] = field(default_factory=dict)
    """Set on the metrics the way the engine does (read back or from the scheduler)."""


def _storage(type_: str, **details: Any) -> FaultRecord:
    return FaultRecord(id=type_, type=type_,
                       capabilities=declared(type_), injected_t=T, undone_t=T + 2, target="all",
                       details={"undo": {"ops_hit": {"write": 2}, "num_ops_hit": 2},
                                **details})


SPOT = FaultRecord(id="spot", type="spot_preemption",
                   capabilities=("loses_node",), injected_t=T, target="node 0",
                   details={"deadline_t": T + 3})
DELAY = FaultRecord(id="slow", type="collective_delay",
                    capabilities=("slows_job",), injected_t=1006.5, undone_t=1016.0,
                    target="rank 1")
STICKY = FaultRecord(id="gpu", type="gpu_error", injected_t=T, target="node 0",
                     details={"sticky": True, "node": "node0"})
KILLED = FaultRecord(id="kill", type="rank_kill", injected_t=T, target="rank 1",
                     details={"signal": "SIGKILL", "pids_by_rank": {"1": 101}})
SDC = FaultRecord(id="sdc-1", type="sdc", injected_t=T, target="rank 1",
                  capabilities=("corrupts_silently",))
BITFLIP = FaultRecord(id="flip", type="ckpt_bitflip", injected_t=T, target="all",
                      details={"checkpoints": ["/run/checkpoints/step_10"]})

CASES: dict[str, Case] = {
    "completes": Case(True, False),
    # the job ended by itself: its restart count is final ...
    "max_restarts": Case(1, 0),
    "detection_latency_s": Case(5.0, pytest.approx(3.5)),
    # never came back: no resume, no recovery, and what the fault cost is unknown
    "resume_time_s": Case(30.0, NOT_MEASURED),
    "recovery_time_s": Case(30.0, NOT_MEASURED),
    "lost_steps": Case(10, NOT_MEASURED),
    "goodput": Case(0.1, NOT_MEASURED),
    # a final digest of the last checkpoint equal to the golden run's is not a final state
    "bitwise_equal_to_golden": Case(True, NOT_MEASURED, records=[
        ev(1015.6, "final_digest", 0, digest="d" * 64)]),
    # ... nor is the distance of a run that stopped at step 15 to a fault-free run's end
    "matches_golden_within_noise": Case(10.0, NOT_MEASURED),
    "samples_exactly_once": Case(True, NOT_MEASURED),
    "corrupt_checkpoint_never_loaded": Case(True, NOT_MEASURED, fault=BITFLIP),
    # the emergency checkpoint was committed before the deadline: that happened
    "emergency_checkpoint_before_deadline": Case(True, True, fault=SPOT, records=[
        ev(T + 1.5, "checkpoint_saved", 0, step=12, path="/run/checkpoints/step_12",
           emergency=True)]),
    "emergency_checkpoint_s": Case(5.0, pytest.approx(1.5), fault=SPOT, records=[
        ev(T + 1.5, "checkpoint_saved", 0, step=12, path="/run/checkpoints/step_12",
           emergency=True)]),
    "checkpoints_all_finite": Case(True, NOT_MEASURED,
                                   metrics={"checkpoints_all_finite": True}),
    "requeue_latency_s": Case(60.0, pytest.approx(20.0), metrics={"requeue_latency_s": 20.0}),
    "straggler_detected_within_s": Case(5.0, pytest.approx(2.5), fault=DELAY, records=[
        ev(1009.0, "anomaly", 0, what="straggler", straggler_rank=1, step=9)]),
    "max_slowdown": Case(3.0, pytest.approx(1.0), fault=DELAY),
    # the job noticed the failed save (it died of it): that happened
    "save_failure_detected": Case(True, True, fault=_storage("disk_full")),
    "failed_save_never_loaded": Case(True, NOT_MEASURED, fault=_storage("disk_full")),
    "training_continued_through_save_failure": Case(True, False, fault=_storage("io_error")),
    "save_hang_detected_within_s": Case(10.0, pytest.approx(3.5), fault=_storage("io_hang")),
    "faulty_node_excluded": Case(True, False, fault=STICKY),
    "restarts_until_excluded": Case(1, NOT_MEASURED, fault=STICKY),
    # the healing SLAs count and time what happened before the end: rank 0 stepped on after
    # the fault without a restart, rank 1 stepped again at step 13, 1 s after it; with no
    # step digest recorded, whether its weights matched is not measured
    "survivor_restarts": Case(0, 0, fault=KILLED),
    "survivor_lost_steps": Case(0, 0, fault=KILLED),
    "healed_by_step": Case(14, 13, fault=KILLED),
    "heal_time_s": Case(5.0, pytest.approx(1.0), fault=KILLED),
    "healed_state_matches_peer": Case(True, NOT_MEASURED, fault=KILLED),
    # a silent fault struck and nothing noticed before the end: not measured; a detection
    # before it (a time), a wrong name (a finding) and the checkpoints saved stand
    "detected_within_steps": Case(5, NOT_MEASURED, fault=SDC),
    "detected_within_s": Case(5.0, pytest.approx(1.0), fault=SDC, records=[
        ev(T + 1.0, "anomaly", 0, what="sdc_suspected", suspect_rank=1, step=13)]),
    "detection_attributed": Case(True, False, fault=SDC, records=[
        ev(T + 1.0, "anomaly", 0, what="sdc_suspected", suspect_rank=0, step=13)]),
    "false_alarms": Case(0, NOT_MEASURED),  # no golden run was scanned
    "contaminated_checkpoints": Case(5, 0, fault=SDC),
    "resumed_from_clean_state": Case(True, NOT_MEASURED, fault=SDC),
    # the ranks of the restart loaded different checkpoints before the end: that happened
    "same_resume_point": Case(True, False, records=[
        {**ev(1015.6, "checkpoint_loaded", 0, step=10), "pid": 300},
        {**ev(1015.7, "checkpoint_loaded", 1, step=5), "pid": 301}]),
}


SLOWING = {"type": "collective_delay", "target": {"rank": 1}, "trigger": {"at_step": 12},
           "duration_s": 5}
"""A fault the detection SLAs may ask about (validation refuses them without one)."""


def slowing(name: str) -> dict[str, Any]:
    return {"faults": [SLOWING]} if name in ASKS_FOR_FAULT else {}


def _judged(name: str, case: Case) -> Any:
    events = early_end(extra=case.records)
    metrics = compute_metrics(events, [case.fault])
    for key, value in case.metrics.items():
        setattr(metrics, key, value)
    withhold_unfinished(metrics)  # as the engine does after reading the checkpoints back
    exp = experiment_from_dict({"name": "early", "run": {"steps": 40},
                                "expect": {name: case.bound}, **slowing(name)})
    (result,) = [r for r in judge(exp, metrics, _Golden(), timed_out=case.timed_out,
                                  faults=[case.fault], events=events) if r.name == name]
    return result


@pytest.mark.parametrize("name", list(CASES))
def test_an_sla_on_a_run_that_ended_early(name: str) -> None:
    case = CASES[name]
    result = _judged(name, case)
    assert result.measured == case.expected, result.describe()
    if case.expected is NOT_MEASURED:
        assert not result.passed
        assert result.note, result.describe()  # and says why
    if SLAS[name].kind == "bool" and result.measured is True:
        # a True stands only on evidence of something that happened (the table says which)
        assert name in ("emergency_checkpoint_before_deadline", "save_failure_detected")


def test_a_not_measured_sla_says_the_run_did_not_finish() -> None:
    result = _judged("samples_exactly_once", CASES["samples_exactly_once"])
    assert result.note == ("not measured: the run did not complete (it stopped at step 15); "
                           "the samples of the steps it never reached were trained on zero "
                           "times")
    saves = _judged("failed_save_never_loaded", CASES["failed_save_never_loaded"])
    assert saves.note.endswith("no process got as far as loading a checkpoint after the "
                               "failed save (a restart that hung before its load shows "
                               "nothing): the job never tried to load one")


@pytest.mark.parametrize(("after", "expected"), [
    # the restart hung in init_process_group: level 0 wrote its start, the trainer never ran
    ([ev(1016.0, "start", 1, pid=301, level=0, resumed_from_step=None)], NOT_MEASURED),
    # ... the same restart went on to train: it went past its load, and loaded no damage
    ([ev(1016.0, "start", 1, pid=301, level=0, resumed_from_step=None),
      ev(1020.0, "step", 1, pid=301, step=11)], True),
    # a level-2 trainer writes its start after its load
    ([ev(1016.0, "start", 1, pid=301, resumed_from_step=10)], True),
    ([ev(1016.0, "checkpoint_loaded", 1, pid=301, step=5, path="/run/checkpoints/step_5")],
     True),
    # it tried, and the torn file raised (Lightning's last.ckpt after a full disk): not loaded
    ([ev(1016.0, "start", 1, pid=301, level=0, resumed_from_step=None),
      ev(1017.0, "checkpoint_load_failed", 1, pid=301, path="/run/checkpoints/last.ckpt",
         error="RuntimeError: PytorchStreamReader failed reading zip archive")], True),
])
def test_a_restart_that_never_reached_its_load_shows_nothing(after, expected) -> None:
    """Under plain torchrun, a restart after a bit flip hung in init_process_group until the
    timeout: the process started, but never got as far as a checkpoint."""
    events = early_end(extra=after)
    metrics = compute_metrics(events, [BITFLIP])
    assert metrics.corrupt_checkpoint_never_loaded == expected


def test_restarts_within_the_bound_when_faultlab_stopped_the_job_are_not_measured() -> None:
    """A job stopped at the timeout might have restarted again: within the bound is unknown;
    over it is a finding."""
    within = _judged("max_restarts", Case(1, None, timed_out=True))
    assert within.measured is None and not within.passed
    assert within.note == "0 restart(s) before faultlab stopped the job at step 15 (timeout)"
    over = _judged("max_restarts", Case(0, None, timed_out=True, records=[
        ev(1017.0, "start", 0, resumed_from_step=10, pid=300)]))
    assert over.measured == 1 and not over.passed


def test_a_sample_trained_twice_is_a_finding_however_the_run_ended() -> None:
    twice = early_end([ev(1015.1, "step", 0, step=15, step_time_s=0.9,
                          samples=[13 * G, 15 * G])])
    assert compute_metrics(twice, []).samples_exactly_once is False


def test_every_sla_has_its_row() -> None:
    """Every SLA faultlab ships; one a team's package installs (make installs examples/plugin)
    is that package's to test."""
    assert set(CASES) == {name for name, sla in SLAS.items()
                          if type(sla).__module__.startswith("faultlab.")}


def test_a_golden_run_that_needed_a_restart_is_a_finding() -> None:
    """A fault-free run that restarted (an abort at exit, a flaky rendezvous) fails the verdict
    with what ended its process, whatever the experiment's own SLAs say."""
    class Restarted(_Golden):
        restarts = 1
        failures = ("rank 0 exited signal (SIGABRT: terminate called without an active "
                    "exception)",)

    exp = experiment_from_dict({"name": "g", "expect": {"completes": True}})
    events = early_end()
    results = judge(exp, compute_metrics(events, []), Restarted(), timed_out=False, faults=[],
                    events=events)
    finding = next(r for r in results if r.name == "golden_run_fault_free")
    assert (finding.measured, finding.passed) == (1, False)
    assert finding.note.startswith("the fault-free golden run needed 1 restart(s): rank 0 "
                                   "exited signal (SIGABRT")
    assert not any(r.name == "golden_run_fault_free" for r in judge(
        exp, compute_metrics(events, []), _Golden(), timed_out=False, faults=[], events=events))
