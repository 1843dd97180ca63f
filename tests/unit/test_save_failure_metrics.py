"""The save-failure SLAs, measured on recorded event streams (faultlab.observe.save_failures).

Each stream is what a kind of trainer writes when a storage fault strikes its save at ``T``:
the reference trainer (reports, quarantines, trains on), a plain DCP trainer (crashes,
restarts, resumes from an older checkpoint), one that takes the failed save for saved, one
that loads what it failed to save, and a save hung until the watchdog notices.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from typing import Any

from faultlab.judge.slas import SLAS
from faultlab.judge.verdict import judge
from faultlab.observe import FaultRecord, compute_metrics
from faultlab.spec import experiment_from_dict
from tests.fault_records import declared

T = 1000.0
CKPT = "/run/checkpoints"


def ev(t: float, kind: str, pid: int = 10, rank: int = 0, **fields: Any) -> dict[str, Any]:
    return {"t": t, "kind": kind, "pid": pid, "rank": rank, "world_size": 2, **fields}


def steps(first: int, last: int, t0: float, pid: int = 10) -> list[dict[str, Any]]:
    return [ev(t0 + 0.1 * i, "step", pid, step=s) for i, s in enumerate(range(first, last + 1))]


def fault(type_: str = "disk_full", hits: int | None = 3, undone: float | None = T + 5,
          **details: Any) -> FaultRecord:
    undo = {} if hits is None else {"ops_hit": {"write": hits}, "num_ops_hit": hits}
    return FaultRecord(id=f"{type_}#1", type=type_,
                       capabilities=declared(type_), injected_t=T, undone_t=undone,
                       target="all", details={**details, "undo": undo})


def started(pid: int = 10, t: float = T - 10) -> list[dict[str, Any]]:
    return [ev(t, "start", pid, resumed_from_step=0, t_main=t - 1)]


def test_the_reference_trainer_reports_quarantines_and_trains_on() -> None:
    events = [*started(), *steps(1, 12, T - 2),
              ev(T + 0.5, "anomaly", what="checkpoint_save_failed", step=20,
                 path=f"{CKPT}/.tmp-step_00000020-abc", action="retry_next_interval"),
              *steps(13, 40, T + 1), ev(T + 8, "checkpoint_saved", step=30,
                                        path=f"{CKPT}/step_00000030"),
              ev(T + 9, "final_digest", digest="d" * 64), ev(T + 9.1, "exit", reason="completed")]
    m = compute_metrics(events, [fault()])
    assert m.save_failure_detected is True
    assert m.training_continued_through_save_failure is True
    assert m.failed_save_never_loaded is True
    assert m.save_hang_detected_within_s is None  # no io_hang


def test_a_plain_dcp_trainer_notices_by_crashing_and_resumes_from_an_older_save() -> None:
    events = [*started(), *steps(1, 10, T - 2),
              *steps(11, 12, T + 0.1),  # trained on until the save at step 12 failed
              ev(T + 0.3, "exit", reason="error", code=1, error="CheckpointException"),
              ev(T + 4, "checkpoint_loaded", 20, step=10, path=f"{CKPT}/step_10"),
              ev(T + 4.1, "start", 20, resumed_from_step=10), *steps(11, 40, T + 5, pid=20)]
    m = compute_metrics(events, [fault()])
    assert m.save_failure_detected is True
    assert m.training_continued_through_save_failure is False  # recovered, not continued
    assert m.failed_save_never_loaded is True


def test_a_save_taken_for_saved_is_not_detected_and_the_verdict_says_what_it_did() -> None:
    events = [*started(), *steps(1, 12, T - 2),
              ev(T + 0.5, "checkpoint_saved", step=20, path=f"{CKPT}/step_20"),
              *steps(13, 40, T + 1)]
    flt = fault("io_error", hits=2)
    m = compute_metrics(events, [flt])
    assert m.save_failure_detected is False
    assert m.training_continued_through_save_failure is True  # nothing stopped it
    exp = experiment_from_dict({
        "name": "x", "target": {"trainer": "reference"},
        "faults": [{"type": "io_error", "target": "all", "trigger": {"at_step": 12},
                    "duration_s": 5}],
        "expect": {"save_failure_detected": True}})
    result = next(r for r in judge(exp, m, None, timed_out=False, faults=[flt], events=events)
                  if r.name == "save_failure_detected")
    assert not result.passed
    assert "reported checkpoint(s) saved at step(s) [20] while it was in force" in result.note
    assert "{'write': 2}" in result.note


def test_loading_a_failed_save_fails_unless_it_was_saved_afresh() -> None:
    failed = ev(T + 0.5, "anomaly", what="checkpoint_save_failed", step=8,
                path=f"{CKPT}/step_8", action="continue")
    load = ev(T + 6, "checkpoint_loaded", 20, step=8, path=f"{CKPT}/step_8")
    base = [*started(), *steps(1, 8, T - 1), failed]
    assert compute_metrics([*base, load], [fault()]).failed_save_never_loaded is False
    # a file inside the failed save's directory is the same checkpoint
    inside = dict(load, path=f"{CKPT}/step_8/__0_0.distcp")
    assert compute_metrics([*base, inside], [fault()]).failed_save_never_loaded is False
    resaved = ev(T + 3, "checkpoint_saved", step=8, path=f"{CKPT}/step_8")
    assert compute_metrics([*base, resaved, load], [fault()]).failed_save_never_loaded is True
    # the verdict names the load and the report it ignored
    exp = experiment_from_dict({
        "name": "x", "target": {"trainer": "reference"},
        "faults": [{"type": "disk_full", "target": "all", "trigger": {"at_step": 8},
                    "duration_s": 5}],
        "expect": {"failed_save_never_loaded": True}})
    events = [*base, load]
    result = next(r for r in judge(exp, compute_metrics(events, [fault()]), None,
                                   timed_out=False, faults=[fault()], events=events)
                  if r.name == "failed_save_never_loaded")
    assert not result.passed
    assert result.note == (f"rank 0 loaded {CKPT}/step_8 (step 8) after its save was reported "
                           f"checkpoint_save_failed at step 8")


def test_it_extends_corrupt_checkpoint_never_loaded() -> None:
    flip = FaultRecord(id="rot", type="ckpt_bitflip", injected_t=T,
                       details={"checkpoints": [f"{CKPT}/step_10"]})
    events = [*started(), *steps(1, 12, T - 2),
              ev(T + 2, "checkpoint_loaded", 20, step=10, path=f"{CKPT}/step_10")]
    m = compute_metrics(events, [flip])
    assert m.corrupt_checkpoint_never_loaded is False
    assert m.failed_save_never_loaded is False
    assert m.save_failure_detected is None  # a bit flip at rest fails no save


def test_a_hung_save_noticed_by_the_watchdog_gives_the_detection_latency() -> None:
    events = [*started(), *steps(1, 20, T - 3),
              ev(T + 5.4, "anomaly", what="checkpoint_save_hung", step=20,
                 path=f"{CKPT}/.tmp-step_00000020-x", seconds=5.0, action="exit"),
              ev(T + 5.5, "exit", reason="watchdog", code=3),
              # noise before it must not count: a straggler is not a sign of a failed save
              ev(T + 1, "anomaly", what="straggler", straggler_rank=1)]
    m = compute_metrics(events, [fault("io_hang", hits=1, undone=T + 6)])
    assert m.save_failure_detected is True
    assert m.save_hang_detected_within_s is not None
    assert abs(m.save_hang_detected_within_s - 5.4) < 1e-6
    assert m.training_continued_through_save_failure is False
    never = compute_metrics(events[:-3], [fault("io_hang", hits=1)])
    assert never.save_failure_detected is False
    assert never.save_hang_detected_within_s is None


def test_a_fault_that_hit_nothing_measures_nothing() -> None:
    events = [*started(), *steps(1, 40, T - 2)]
    m = compute_metrics(events, [fault(hits=0)])
    assert (m.save_failure_detected, m.training_continued_through_save_failure,
            m.failed_save_never_loaded, m.save_hang_detected_within_s) == (None,) * 4
    # a slow disk fails no save
    assert compute_metrics(events, [fault("io_latency")]).save_failure_detected is None
    # an unknown count (the run ended before the undo could ask) is taken as struck
    assert compute_metrics(events, [fault(hits=None)]).save_failure_detected is False


def test_faultlab_list_slas_describes_every_sla() -> None:
    out = subprocess.run([sys.executable, "-m", "faultlab.cli", "list", "slas"],
                         capture_output=True, text=True, check=True).stdout
    for key, sla in SLAS.items():
        assert key in out and sla.description[:40] in out.replace("\n    ", " ")


def test_a_storage_fault_that_struck_no_operation_was_not_injected() -> None:
    """Its rule was in force, yet the job never touched the served directory (a trainer that
    checkpoints elsewhere): the experiment proved nothing, and fault_injected says why."""
    exp = experiment_from_dict({
        "name": "x", "target": {"trainer": "reference"},
        "faults": [{"id": "full", "type": "disk_full", "target": "all",
                    "trigger": {"at_step": 12}, "duration_s": 5}],
        "expect": {"completes": True}})
    events = [*started(), *steps(1, 40, T - 2)]

    def injected(flt: FaultRecord) -> Any:
        flt = dataclasses.replace(flt, id="full#1",
                                  details={**flt.details, "storage": "/run/checkpoints"})
        return judge(exp, compute_metrics(events, [flt]), None, timed_out=False, faults=[flt],
                     events=events)[0]

    idle = injected(fault("disk_full", hits=0))
    assert idle.name == "fault_injected[full]" and idle.measured is False and not idle.passed
    assert idle.note == ("set on /run/checkpoints, but it struck no operation in the whole "
                         "run: the job did no matching write there while it was in force; if "
                         "its checkpoints go elsewhere, name that directory as "
                         "target.checkpoint_dir")
    assert injected(fault("disk_full", hits=3)).passed
    assert injected(fault("disk_full", hits=None)).passed  # no count: not held against it


def test_a_node_view_that_answered_nothing_was_not_injected() -> None:
    """stale_shared_fs's view was in force, yet no process of its node looked at the
    checkpoints: nothing was asked of the stale caches, and fault_injected says so."""
    exp = experiment_from_dict({
        "name": "x", "target": {"trainer": "reference"},
        "topology": {"nodes": 2, "min_nodes": 1},
        "faults": [{"id": "nfs", "type": "stale_shared_fs", "target": {"node": 1},
                    "trigger": {"at_step": 12}, "duration_s": 5}],
        "expect": {"completes": True}})
    events = [*started(), *steps(1, 40, T - 2)]

    def injected(answered: int) -> Any:
        flt = FaultRecord(id="nfs#1", type="stale_shared_fs",
                          capabilities=("mounts_storage", "needs_exact_mount"), injected_t=T,
                          undone_t=T + 5,
                          target="node 1", details={
                              "storage": "/run/checkpoints", "node": "node1",
                              "nfs": {"acdirmin": 30},
                              "undo": {"ops_answered": {"getattr": answered},
                                       "num_ops_answered": answered}})
        return judge(exp, compute_metrics(events, [flt]), None, timed_out=False, faults=[flt],
                     events=events)[0]

    idle = injected(0)
    assert idle.name == "fault_injected[nfs]" and not idle.passed
    assert idle.note.startswith("node1's view of /run/checkpoints answered no operation")
    assert injected(7).passed
