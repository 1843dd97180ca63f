"""No SLA passes on evidence the run did not leave (issue 53), one table per kind of gap.

For every built-in SLA, on synthetic records (no job runs here):

- **no records**: the job left nothing at all (it never started, or its events were lost);
- **NaN**: what it measured is NaN (``bool(nan)`` is True and NaN compares False both ways:
  a comparison written the wrong way round passes it);
- **missing record**: a run that completed, without the one record the SLA reads;
- a run that **ended early** is ``test_unfinished_runs.py``'s table.

Each row says what the SLA must conclude: ``fail``, or ``inconclusive`` for a correctness SLA
(``Sla.correctness``) whose reference, not the run, is what is missing. Never ``pass``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from faultlab.judge.slas import SLAS
from faultlab.judge.verdict import judge, verdict_of
from faultlab.observe import FaultRecord, compute_metrics
from faultlab.observe.metrics import withhold_unfinished
from faultlab.sla import Sla
from faultlab.spec import experiment_from_dict
from tests.unit.test_unfinished_runs import (
    DELAY,
    KILLED,
    SDC,
    SPOT,
    STICKY,
    T,
    _storage,
    ev,
    slowing,
)

BUILTIN = [name for name, sla in SLAS.items() if type(sla).__module__.startswith("faultlab.")]
LOSSES = {s: 2.0 - s / 20 for s in range(1, 21)}


class Golden:
    """A golden run with two fault-free runs that agree (the trainer is reproducible)."""

    digest = "d" * 64
    tensors: dict[str, str] = {}
    not_measured: str | None = None
    losses = LOSSES
    final_checkpoint = None
    run_dir = "/golden"
    second: dict[str, Any] | None = {"digest": "d" * 64, "losses": {
        s: v + 1e-4 * (s % 3) for s, v in LOSSES.items()}}


def finished(drop: Callable[[dict[str, Any]], bool] = lambda r: False,
             extra: tuple[dict[str, Any], ...] = ()) -> list[dict[str, Any]]:
    """Two ranks, steps 1..20 (a loss, samples, a step digest each), checkpoints at 10 and
    20, a final digest, both exit completed: everything every SLA reads, less ``drop``."""
    out = [ev(1000.0, "start", r, resumed_from_step=0) for r in (0, 1)]
    for step in range(1, 21):
        for r in (0, 1):
            out.append(ev(1000.0 + step, "step", r, step=step, step_time_s=0.9,
                          loss=LOSSES[step], param_digest=f"p{step}",
                          samples=[(step - 1) * 8, step * 8],
                          local_samples=[(step - 1) * 8 + r * 4, (step - 1) * 8 + r * 4 + 4]))
    for step in (10, 20):
        out.append(ev(1000.2 + step, "checkpoint_saved", 0, step=step,
                      path=f"/run/checkpoints/step_{step}"))
    out += [ev(1020.5, "final_digest", 0, digest="d" * 64),
            *(ev(1020.6, "exit", r, reason="completed", code=0) for r in (0, 1))]
    return sorted([r for r in out if not drop(r)] + list(extra), key=lambda r: r["t"])


@dataclass
class Row:
    bound: Any
    fault: FaultRecord = KILLED
    events: list[dict[str, Any]] = field(default_factory=finished)
    golden: Any = field(default_factory=Golden)
    expected: str = "fail"


def _kind(name: str) -> Callable[[dict[str, Any]], bool]:
    return lambda r: r.get("kind") == name


AFTER_T = FaultRecord(id="late", type="rank_kill", injected_t=1030.0, target="rank 1",
                      details={"signal": "SIGKILL", "pids_by_rank": {"1": 101}})
"""A fault after the job's last record: nothing shows what it did."""


class NoReference(Golden):
    digest = None
    not_measured = "the job saved no final checkpoint"
    second = None


class Unreproducible(Golden):
    second = {"digest": "e" * 64, "losses": Golden.second["losses"]}  # type: ignore[index]


MISSING: dict[str, Row] = {
    # no exit record: nothing says it finished
    "completes": Row(True, events=finished(_kind("exit"))),
    # no start record: 0 restarts of nothing is no count
    "max_restarts": Row(1, events=finished(_kind("start"))),
    "detection_latency_s": Row(5.0, fault=AFTER_T),
    "resume_time_s": Row(30.0, fault=AFTER_T),
    "recovery_time_s": Row(30.0, fault=AFTER_T),
    "lost_steps": Row(10, fault=AFTER_T),
    # no step says how long it took: no useful time, not a guess
    "goodput": Row(0.1, events=[{k: v for k, v in r.items() if k != "step_time_s"}
                                for r in finished()]),
    # the reference left no final state: the run's cannot be judged (it completed)
    "bitwise_equal_to_golden": Row(True, golden=NoReference(), expected="inconclusive"),
    # the run's steps carry no loss: no step to set against the golden runs'
    "matches_golden_within_noise": Row(10.0, expected="inconclusive", events=[
        {k: v for k, v in r.items() if k != "loss"} for r in finished()]),
    "samples_exactly_once": Row(True, events=[
        {k: v for k, v in r.items() if k != "samples"} for r in finished()]),
    # the damage is known, the run completed, and never loaded it: that is evidence; with no
    # damaged path recorded there is none
    "corrupt_checkpoint_never_loaded": Row(True, fault=FaultRecord(
        id="flip", type="ckpt_bitflip", injected_t=T, target="all", details={})),
    "emergency_checkpoint_before_deadline": Row(True, fault=SPOT),
    "emergency_checkpoint_s": Row(5.0, fault=SPOT),
    # the engine read no checkpoint back (set by it, None here)
    "checkpoints_all_finite": Row(True),
    "requeue_latency_s": Row(60.0),
    "straggler_detected_within_s": Row(5.0, fault=DELAY),
    # slowed over steps that never ran (the fault after the last record)
    "max_slowdown": Row(3.0, fault=FaultRecord(id="slow", type="collective_delay",
                                                capabilities=("slows_job",),
                                                injected_t=1030.0, target="rank 1")),
    "save_failure_detected": Row(True, fault=_storage("disk_full")),
    "failed_save_never_loaded": Row(True, fault=_storage("disk_full"), events=finished(
        extra=(ev(T + 0.5, "anomaly", 0, what="checkpoint_save_failed", step=12,
                  path="/run/checkpoints/step_12"),
               ev(T + 1.0, "checkpoint_loaded", 0, step=12,
                  path="/run/checkpoints/step_12")))),
    "training_continued_through_save_failure": Row(True, fault=_storage("io_error"),
                                                   events=finished(lambda r: r["t"] > T)),
    "save_hang_detected_within_s": Row(10.0, fault=_storage("io_hang")),
    "faulty_node_excluded": Row(True, fault=STICKY),
    "restarts_until_excluded": Row(1, fault=STICKY),
    # every rank struck: no survivor to count restarts or lost steps of
    "survivor_restarts": Row(0, fault=FaultRecord(
        id="all", type="rank_kill", injected_t=T, target="all",
        details={"pids_by_rank": {"0": 100, "1": 101}})),
    "survivor_lost_steps": Row(0, fault=FaultRecord(
        id="all", type="rank_kill", injected_t=T, target="all",
        details={"pids_by_rank": {"0": 100, "1": 101}})),
    "healed_by_step": Row(14, fault=AFTER_T),
    "heal_time_s": Row(5.0, fault=AFTER_T),
    # no step digest: whether the healed rank's weights equal a peer's is not known
    "healed_state_matches_peer": Row(True, expected="inconclusive", events=[
        {k: v for k, v in r.items() if k != "param_digest"} for r in finished()]),
    # a silent fault struck, and no signal noticed (none declared, no anomaly written)
    "detected_within_steps": Row(5, fault=SDC),
    "detected_within_s": Row(5.0, fault=SDC),
    "detection_attributed": Row(True, fault=SDC),
    # no golden run scanned: no count of alarms without a fault
    "false_alarms": Row(0),
    # the silent fault's injection failed: it never struck, nothing to count from
    "contaminated_checkpoints": Row(5, expected="inconclusive", fault=FaultRecord(
        id="sdc-1", type="sdc", injected_t=T, target="rank 1",
        capabilities=("corrupts_silently",), details={"error": "no such module"})),
    # struck, and the job never resumed: nothing shows it resumed clean
    "resumed_from_clean_state": Row(True, fault=SDC),
    # no restart: nobody resumed from anything
    "same_resume_point": Row(True),
}


def _judge(name: str, row: Row, events: list[dict[str, Any]] | None = None,
           nan: bool = False) -> Any:
    events = row.events if events is None else events
    metrics = compute_metrics(events, [row.fault])
    sla = SLAS[name]
    if nan:
        setattr(metrics, sla.metric or "", float("nan"))
    withhold_unfinished(metrics)
    exp = experiment_from_dict({"name": "gap", "run": {"steps": 20},
                                "topology": {"nodes": 2}, "expect": {name: row.bound},
                                **slowing(name)})
    results = judge(exp, metrics, row.golden, timed_out=False, faults=[row.fault],
                    events=events, losses=None)
    (result,) = [r for r in results if r.name == name]
    return result, results


@pytest.mark.parametrize("name", BUILTIN)
def test_a_completed_run_without_the_record_an_sla_reads_never_passes(name: str) -> None:
    row = MISSING[name]
    result, results = _judge(name, row)
    assert result.result == row.expected, result.describe()
    if result.measured is None:
        assert result.note, result.describe()  # and says why
    assert verdict_of(results) in ("fail", "inconclusive")


@pytest.mark.parametrize("name", BUILTIN)
def test_a_job_that_left_no_records_passes_no_sla(name: str) -> None:
    result, results = _judge(name, MISSING[name], events=[])
    # nothing ran: not even a correctness SLA is merely inconclusive
    assert result.result == "fail", result.describe()
    assert verdict_of(results) == "fail"


@pytest.mark.parametrize("name", [n for n in BUILTIN if SLAS[n].metric and n not in (
    "bitwise_equal_to_golden", "matches_golden_within_noise")])
def test_a_nan_metric_passes_no_sla(name: str) -> None:
    """A metric that came out NaN (set by the engine, or computed) reads as not measured: a
    fail, or for a correctness SLA inconclusive. The two golden comparisons measure themselves
    (their NaN cases: test_noise.py)."""
    result, _ = _judge(name, MISSING[name], events=finished(), nan=True)
    assert result.measured is None and not result.passed, result.describe()
    assert result.result == ("inconclusive" if SLAS[name].correctness else "fail")


@pytest.mark.parametrize("kind", ["max", "min", "bool"])
def test_a_nan_that_a_declaration_measures_itself_fails_every_comparison(kind: str) -> None:
    """``bool(nan)`` is True and NaN compares False both ways: a team's SLA that measures NaN
    must fail whichever way its bound points."""
    sla = Sla(key="nan_sla", value=float, kind=kind, unit="x", description="d", doc="d")  # type: ignore[arg-type]
    assert not sla.holds(float("nan"), True if kind == "bool" else 1.0)
    assert sla.holds(1.0, True if kind == "bool" else 1.0)  # the same bound, a number: holds


def test_every_sla_has_its_rows() -> None:
    assert set(MISSING) == set(BUILTIN)


def test_the_correctness_slas_are_the_golden_comparisons_and_the_healed_state() -> None:
    assert {n for n in BUILTIN if SLAS[n].correctness} == {
        "bitwise_equal_to_golden", "matches_golden_within_noise", "healed_state_matches_peer"}


def test_a_completed_run_with_every_record_passes_them_all() -> None:
    """The table's run is a good one: each row fails for the gap it names, not for a flaw of
    the run every row shares (a kill that struck rank 1 and healed at step 13 from its peer
    is what the healing SLAs read)."""
    healed = finished(lambda r: r.get("rank") == 1 and T < r["t"] < 1013.0)
    passing = {"completes": True, "max_restarts": 0, "goodput": 0.5,
               "bitwise_equal_to_golden": True, "matches_golden_within_noise": 10.0,
               "samples_exactly_once": True, "survivor_restarts": 0,
               "survivor_lost_steps": 0, "healed_by_step": 14,
               "healed_state_matches_peer": True}
    for name, bound in passing.items():
        result, _ = _judge(name, Row(bound, events=healed))
        assert result.result == "pass", result.describe()


def test_an_unreproducible_reference_makes_bitwise_inconclusive_not_failed() -> None:
    result, results = _judge("bitwise_equal_to_golden",
                             Row(True, golden=Unreproducible()))
    assert (result.result, verdict_of(results)) == ("inconclusive", "inconclusive")
