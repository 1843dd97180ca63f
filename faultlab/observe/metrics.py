"""The experiment metrics (docs/concepts.md, SLA), computed from event records and fault records.

Pure functions: :func:`compute_metrics` takes the records of a job's event stream (any order,
any subset of optional fields) and what faultlab injected, and never raises on what a killed
or broken job leaves behind. ``None`` always means *not measured*; why is stated per metric.

Records, step records and the per-fault metrics (``slowdown``, run level included) are defined
in :mod:`faultlab.observe.timeline`; the run-level metrics are defined here.

Run-level:

completes
    The last rank-0 ``exit`` has reason completed, and, counting only records since the latest
    ``start`` record of any rank (the final incarnation; all records if there is none), that
    exit is among them, every ``exit`` among them is completed or stopped, and, for a trainer
    that writes the event protocol itself (level 2: an exit without a ``level``), a
    ``final_digest`` is among them. A level-0 or level-1 trainer's clean exit is its finish,
    checkpoint or not (``completion`` gives the reason when it is False). Where every node is
    a world of its own (a ``start`` with ``own_world``: torchft's replica groups), rank 0 is
    one group among others, and the job completes when any group finishes: the last ``exit``
    of any rank stands for rank 0's (a group 0 whose machine was lost for good leaves none,
    and group 1 finished the job). The judge then asks of the nodes what these records cannot
    show (:mod:`faultlab.observe.node_exits`): the final incarnation's ``world_size`` is the
    topology's (an elastic job's may be smaller by the nodes a fault struck, not below
    ``min_nodes``), and every node no fault struck exited 0; a note names the node and its
    exit code, or the world size against the topology's.
final_digest
    ``digest`` of the last ``final_digest`` record; None if there is none.
restarts
    Number of rank-0 ``start`` records − 1 (0 if none). Only a new process emits ``start``; an
    in-process rollback is not a restart. ``max_restarts`` judges it as not measured when no
    ``start`` record exists (0 restarts of nothing is no count), and when faultlab stopped an
    unfinished job (timeout) within the bound (the restarts still to come are unknown).
max_step
    Highest ``step`` of any step record; 0 if none.
committed trajectory
    For each step number up to the step of the last rank-0 step record, the last rank-0 step
    record with that number (what the final timeline's rank 0 actually kept; replayed steps
    replace the originals, and steps beyond the last one, rolled back and never redone, drop
    out). ``steps_committed`` is its length (skipped steps included).
goodput
    Sum of ``step_time_s`` over the committed trajectory (a skipped step, or one without
    ``step_time_s``, counts 0) ÷ ``wall_s``; None if ``wall_s`` is 0, or if the run did not
    complete (the share of a run that never finished says nothing of the job's goodput).
wall_s
    ``t`` of the last record − ``t`` of the first record; 0.0 for fewer than two records.
samples_exactly_once
    None if there is no committed step or a committed record lacks a valid ``samples``
    ``[start, stop)``. Otherwise True iff (1) the committed steps are exactly 1..N, (2) their
    ``samples`` ranges, sorted by start, tile ``[first start, last stop)`` with neither gap nor
    overlap, and (3) for each committed step with world size ``W``, taking the last record per
    rank of that step with world size ``W``, the ``local_samples`` slices present lie inside
    the step's range and are pairwise disjoint, and when ranks ``0..W-1`` all have one their
    union is the whole range. (A rank without a record or without ``local_samples`` is not
    held against the step: a SIGKILL can lose a rank's last line.) True needs the run to
    complete: the samples of steps it never reached were trained on zero times (None then;
    False, a sample seen twice, stands).
corrupt_checkpoint_never_loaded
    None unless some fault's details list the checkpoint directories it damaged
    (``details["checkpoints"]``: the storage faults). Otherwise False iff a ``checkpoint_loaded``
    record names one of those paths after the fault struck and before the job wrote a fresh
    checkpoint to the same path (a ``checkpoint_saved`` with that path) — a replayed run may
    legitimately save and later load a new checkpoint under the old name. True needs evidence
    that the job would have loaded one: it completed, or after the last damage a process got
    as far as its load (``reached_load``: its resume path ran); a job that died after the
    damage and never started again, or whose restart hung before it could load (a level-0
    ``start`` is written as the process starts, before the trainer's own code runs), loaded
    nothing because it loaded nothing at all (None).
same_resume_point
    None if no fault's came-back records carry a step. Otherwise False iff, for some fault,
    they carry more than one (``FaultMetrics.resumed_from_steps``): the ranks of one restart
    loaded different checkpoints.
world_sizes
    The world sizes of the ``start`` records in time order, consecutive repeats collapsed
    (e.g. ``[3, 2]`` after a node loss); from all records if there are no start records.
emergency_checkpoint_s, emergency_checkpoint_before_deadline (run level)
    The worst over the faults with a deadline (max seconds; False if any was False); None if
    no fault had a deadline.
straggler_detected_within_s (run level)
    The worst (max) ``straggler_detected_s`` over the slowing faults (their class declares
    ``slows_job``); None if there is none or any of them was never named.
save_failure_detected, save_hang_detected_within_s, training_continued_through_save_failure,
failed_save_never_loaded
    Saves that fail or hang under a fault that declares ``fails_saves`` (``io_error``,
    ``disk_full``, ``io_hang``): defined in :mod:`faultlab.observe.save_failures`.
    ``failed_save_never_loaded`` True needs the same evidence as
    ``corrupt_checkpoint_never_loaded`` (completed, or a start or a load after the last
    failure or strike).
faulty_node_excluded, restarts_until_excluded (run level)
    Defined in :mod:`faultlab.observe.exclusion` (a GPU that stays failed: did the job go on
    without its node, after how many restarts).
survivor_restarts, survivor_lost_steps, healed_at_step, heal_time_s, healed_state_matches_peer
    Defined in :mod:`faultlab.observe.healing` (a stack that recovers per step: did the
    others step on, when did the struck ranks heal, do their weights equal a peer's).
bitwise_equal_to_golden (judged, not computed here)
    The run's ``final_digest`` (its own record, or its final checkpoint read back and hashed:
    :mod:`faultlab.observe.final_state`) equals the fault-free golden run's. Not measured
    without a golden run, without a final state on either side (no record, and no checkpoint
    saved at or after the last step), or when the run did not complete.
    Not measured when two fault-free runs (``golden: {runs: 2}``) differ: the trainer is not
    bitwise reproducible on its target (inconclusive, never failed nor passed; covered by a
    measured matches_golden_within_noise).
matches_golden_within_noise (judged, not computed here)
    The run's largest distance to the golden run in units of the trainer's own run-to-run
    noise: at each step, its loss's distance to the golden run's over the largest loss
    difference of two fault-free runs up to that step; and its final weights' relative L2
    distance over theirs (:mod:`faultlab.judge.noise`). Infinite (failed) at the first NaN or
    Inf of the run's losses, and when its final weights lack a tensor of the golden run's,
    hold one in another shape or hold a NaN or Inf (named). Not measured without a second
    fault-free run, with a NaN in the golden runs, with no step shared with them, or when the
    run did not complete.
checkpoints_all_finite (set by the engine)
    Every committed checkpoint the job left, read back after the run
    (:mod:`faultlab.engine.checkpoints`), holds only finite floating-point values; False at the
    first NaN or Inf. Not measured when no checkpoint could be read, or when the run did not
    complete.
requeue_latency_s (set by the engine, Slurm)
    The last requeue's ``running_again_t`` (the scheduler shows the job running again) − the
    first fault's injection time, when the scheduler requeued the job; not measured if the job
    was never requeued or one requeue never ran again.
detection_latency_s, resume_time_s, recovery_time_s, lost_steps
    The worst (max) over the faults. For resume and recovery the result is None if any fault
    went down and its value is None (unmeasurable); faults that did not go down are left out.
    For lost steps it is None if any fault's value is None (one that went down and never came
    back, or one after which the job never made progress: timeline module); with no fault, 0.
    With no measured time: None.

A run that did not complete
    Its evidence stops where it stopped. The metrics that describe the whole run say "not
    measured" rather than judge what never ran: goodput, samples_exactly_once (True),
    corrupt_checkpoint_never_loaded and failed_save_never_loaded (True without a start or a
    load after the damage), checkpoints_all_finite (True: set by the engine through
    :func:`withhold_unfinished`). The bitwise verdict needs a completed run too (the judge).
    Times of what did happen (detection, resume, recovery, emergency checkpoint, straggler
    named, requeue) stand.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from faultlab.observe.exclusion import faulty_node_excluded, restarts_until_excluded
from faultlab.observe.healing import healing_metrics
from faultlab.observe.records import (
    FaultRecord,
    Record,
    _float,
    _int,
    _is_clean_exit,
    _json_safe,
    _key,
    _range,
    _step,
)
from faultlab.observe.save_failures import (
    FAILED_SAVE_ANOMALIES,
    save_failure_metrics,
)
from faultlab.observe.timeline import FaultMetrics, _Timeline

__all__ = ["FaultMetrics", "FaultRecord", "Metrics", "UNFINISHED_RUN", "completion",
           "compute_metrics", "reached_load", "withhold_unfinished"]

UNFINISHED_RUN = {
    "goodput": "goodput is a whole run's",
    "samples_exactly_once": "the samples of the steps it never reached were trained on zero "
                            "times",
    "corrupt_checkpoint_never_loaded": "no process got as far as loading a checkpoint after "
                                       "the damage (a restart that hung before its load shows "
                                       "nothing): the job never tried to load one",
    "failed_save_never_loaded": "no process got as far as loading a checkpoint after the "
                                "failed save (a restart that hung before its load shows "
                                "nothing): the job never tried to load one",
    "checkpoints_all_finite": "the checkpoints after the one it stopped at were never written",
}
"""Metric → why a run that did not complete cannot show it (``withhold_unfinished`` says which
values are then withheld)."""


@dataclass(slots=True)
class Metrics:
    """Run-level metrics (definitions: module docstring). ``None`` means not measured."""

    completes: bool
    final_digest: str | None
    restarts: int
    max_step: int
    steps_committed: int
    wall_s: float
    goodput: float | None
    samples_exactly_once: bool | None
    world_sizes: list[int]
    corrupt_checkpoint_never_loaded: bool | None
    detection_latency_s: float | None
    resume_time_s: float | None
    recovery_time_s: float | None
    lost_steps: int | None
    emergency_checkpoint_s: float | None = None
    emergency_checkpoint_before_deadline: bool | None = None
    straggler_detected_within_s: float | None = None
    slowdown: float | None = None
    faulty_node_excluded: bool | None = None
    restarts_until_excluded: int | None = None
    checkpoints_all_finite: bool | None = None
    """Not from events: set by the engine when it read the checkpoints back after the run."""
    queue_time_s: float | None = None
    """Not from events (a scheduler's job, ``topology.launcher: slurm``): submitted → first
    running."""
    requeue_latency_s: float | None = None
    """Not from events: the first fault → the job running again after a requeue (the worst of
    the run's requeues); None if the job was never requeued."""
    requeues: int | None = None
    """Not from events: how many times the scheduler requeued the job."""
    save_failure_detected: bool | None = None
    save_hang_detected_within_s: float | None = None
    training_continued_through_save_failure: bool | None = None
    failed_save_never_loaded: bool | None = None
    survivor_restarts: int | None = None
    survivor_lost_steps: int | None = None
    healed_at_step: int | None = None
    heal_time_s: float | None = None
    healed_state_matches_peer: bool | None = None
    same_resume_point: bool | None = None
    healing_note: str = ""
    """What the healing metrics saw, in words (which rank healed when; faultlab.observe.healing)."""
    faults: list[FaultMetrics] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return _json_safe(asdict(self))


# --- run level -------------------------------------------------------------------------------

def _committed(records: list[Record]) -> dict[int, Record]:
    """The committed trajectory: step number -> the rank-0 step record that stands."""
    trajectory: dict[int, Record] = {}
    last = 0
    for r in records:
        step = _step(r)
        if step is None or r.get("rank") != 0:
            continue
        trajectory[step] = r
        last = step
    return {s: r for s, r in sorted(trajectory.items()) if s <= last}


def _damaged(faults: list[FaultRecord]) -> list[tuple[str, float]]:
    return [(str(path), f.injected_t) for f in faults
            for path in (f.details.get("checkpoints") or []) if isinstance(path, str)]


def _corrupt_never_loaded(records: list[Record], faults: list[FaultRecord]) -> bool | None:
    damaged = _damaged(faults)
    if not damaged:
        return None
    for path, struck_t in damaged:
        rewritten_t = min((r["t"] for r in records if r.get("kind") == "checkpoint_saved"
                           and r.get("path") == path and r["t"] > struck_t), default=math.inf)
        if any(r.get("kind") == "checkpoint_loaded" and r.get("path") == path
               and struck_t < r["t"] < rewritten_t for r in records):
            return False
    return True


def _samples_exactly_once(records: list[Record], committed: dict[int, Record]) -> bool | None:
    if not committed:
        return None
    ranges: dict[int, tuple[int, int]] = {}
    for step, r in committed.items():
        rng = _range(r.get("samples"))
        if rng is None:
            return None
        ranges[step] = rng
    if list(committed) != list(range(1, len(committed) + 1)):
        return False
    spans = sorted(ranges.values())
    for (_, stop), (start, _) in zip(spans, spans[1:], strict=False):
        if start != stop:
            return False  # a gap, or a sample counted twice

    # Every rank's slice of every committed step, from the incarnation that committed it.
    slices: dict[int, dict[Any, Record]] = {s: {} for s in committed}
    for r in records:
        n = _step(r)
        if n in slices and r.get("world_size") == committed[n].get("world_size"):
            slices[n][_key(r.get("rank"))] = r  # sorted by t: the last record per rank wins
    for n, by_rank in slices.items():
        lo, hi = ranges[n]
        world_size = _int(committed[n].get("world_size"))
        parts = {rank: _range(r.get("local_samples")) for rank, r in by_rank.items()}
        present = sorted(p for p in parts.values() if p is not None)
        if not present:
            continue
        if present[0][0] < lo or max(stop for _, stop in present) > hi:
            return False
        if any(b[0] < a[1] for a, b in zip(present, present[1:], strict=False)):
            return False  # two ranks trained on the same sample
        complete = world_size is not None and all(
            parts.get(rank) is not None for rank in range(world_size))
        if complete and sum(b - a for a, b in present) != hi - lo:
            return False
    return True


def _world_sizes(records: list[Record]) -> list[int]:
    starts = [r for r in records if r.get("kind") == "start"] or records
    sizes: list[int] = []
    for r in starts:
        ws = _int(r.get("world_size"))
        if ws is not None and (not sizes or sizes[-1] != ws):
            sizes.append(ws)
    return sizes


def completion(records: list[Record]) -> tuple[bool, str]:
    """``completes`` (module docstring) and, when it is False, why, in words for the verdict.

    A ``final_digest`` is required only of a trainer that writes the event protocol itself
    (level 2: its ``exit`` records carry no ``level``), for which the digest is the last thing
    it does. A level-0 or level-1 trainer's exits are written by faultlab's runtime agent
    (``level`` 0 or 1) and say how the process ended: its clean exit is the finish, and a job
    that keeps no checkpoint (torchft heals from a live peer, many of its trainers never save)
    still finished; what needs the final state says so in its own verdict (the bitwise one)."""
    own_worlds = any(r.get("kind") == "start" and r.get("own_world") is True for r in records)
    earlier = _earlier_incarnations(records) if not own_worlds else set()
    rank0_exits = [r for r in records if r.get("kind") == "exit"
                   and (own_worlds or r.get("rank") == 0)]
    who = "no rank" if own_worlds else "rank 0"
    if not rank0_exits:
        return False, f"{who} wrote no exit record (killed, or stopped before its end)"
    # the newest exit of the final incarnation's rank 0: an old rank 0 the job left out (a cut
    # node's) may write its error exit after the final one completed
    last = next((r for r in reversed(rank0_exits) if _int_pid(r.get("pid")) not in earlier),
                rank0_exits[-1])
    if last.get("reason") != "completed":
        return False, f"{who} last exited {last.get('reason')!s}" + (
            f" ({str(last.get('error')).splitlines()[0][:160]})" if last.get("error") else "")
    last_start_t = max((r["t"] for r in records if r.get("kind") == "start"), default=None)
    final = records if last_start_t is None else [r for r in records if r["t"] >= last_start_t]
    if last_start_t is not None and last["t"] < last_start_t:
        return False, (f"{who} completed, but a process started after that and did not finish "
                       f"(the last start, at t={last_start_t:.2f}, has no clean exit after it)")
    unclean = [r for r in final if r.get("kind") == "exit" and not _is_clean_exit(r)
               and _int_pid(r.get("pid")) not in earlier]
    if unclean:
        bad = unclean[-1]
        return False, (f"rank {bad.get('rank')} of the final incarnation exited "
                       f"{bad.get('reason')!s}")
    own_protocol = last.get("level") not in (0, 1)
    if own_protocol and not any(r.get("kind") == "final_digest" for r in final):
        return False, (f"{who} exited completed without a final_digest record after the last "
                       f"start (a trainer that writes the event protocol writes its digest "
                       f"last: it did not get there)")
    return True, ""


def _int_pid(pid: object) -> int | None:
    """A record's pid where it is one (a garbled record's is compared as None)."""
    return pid if isinstance(pid, int) else None


def _earlier_incarnations(records: list[Record]) -> set[int]:
    """The pids of processes a later incarnation replaced or left out: every started process
    but, for each rank of the last start's world, that rank's newest one. A rank of a node the
    job shrank away from (a partitioned node whose peers restarted without it) may still exit
    with an error after the final incarnation finished, when its peers' sockets close: that
    exit is the old incarnation's end, not the final one's (seen on the netns target, where the
    cut node's rank wrote it 12 s after the two survivors completed)."""
    starts = [r for r in records if r.get("kind") == "start" and isinstance(r.get("pid"), int)
              and isinstance(r.get("rank"), int)]
    if not starts:
        return set()
    world = starts[-1].get("world_size")
    if not isinstance(world, int):
        return set()
    newest: dict[object, int] = {}
    for r in starts:  # records are in time order: the last start of a rank wins
        newest[r.get("rank")] = r["pid"]
    final = {pid for rank, pid in newest.items() if isinstance(rank, int) and rank < world}
    return {r["pid"] for r in starts} - final


def withhold_unfinished(metrics: Metrics, records: list[Record] | None = None,
                        bad_since_t: float | None = None) -> None:
    """Withhold what a run that did not complete cannot show (module docstring, "A run that
    did not complete"): goodput always; a True of samples_exactly_once and
    checkpoints_all_finite; a True of the two never-loaded checks unless a process got as far
    as its load after ``bad_since_t`` (the last damage or failure) in ``records``
    (:func:`reached_load`): the job's resume path ran. False stays: a sample
    trained twice or a damaged checkpoint loaded is a finding however the run ended."""
    if metrics.completes:
        return
    metrics.goodput = None
    for name in ("samples_exactly_once", "checkpoints_all_finite"):
        if getattr(metrics, name) is True:
            setattr(metrics, name, None)
    if records is None:
        return  # the engine's second call, for checkpoints_all_finite alone
    resumed = bad_since_t is not None and reached_load(records, bad_since_t)
    for name in ("corrupt_checkpoint_never_loaded", "failed_save_never_loaded"):
        if getattr(metrics, name) is True and not resumed:
            setattr(metrics, name, None)


def reached_load(records: list[Record], since_t: float) -> bool:
    """Did a process get as far as loading a checkpoint (or deciding there was none to load)
    after ``since_t``? A ``checkpoint_loaded`` or ``checkpoint_load_failed`` (it tried: a
    torn file that raised was not loaded); a ``start`` the trainer writes itself (level 2,
    after its load); or a step of a process that started after
    ``since_t`` (it went past its load to train). A level-0 ``start`` is not enough: the
    bootstrap writes it as the process starts, and a restart that hangs in
    ``init_process_group`` never reaches the trainer's load."""
    new_pids = {_key(r.get("pid")) for r in records
                if r.get("kind") == "start" and r["t"] > since_t}
    return any(r["t"] > since_t and (
        r.get("kind") in ("checkpoint_loaded", "checkpoint_load_failed")
        or (r.get("kind") == "start" and r.get("level") != 0)
        or (r.get("kind") == "step" and _key(r.get("pid")) in new_pids)) for r in records)


def _same_resume_point(per_fault: list[FaultMetrics]) -> bool | None:
    steps = [f.resumed_from_steps for f in per_fault if f.resumed_from_steps]
    return all(len(s) == 1 for s in steps) if steps else None


def _worst(values: list[Any], unmeasurable: bool) -> Any:
    if unmeasurable:
        return None
    known = [v for v in values if v is not None]
    return max(known) if known else None


def compute_metrics(events: Iterable[Record], faults: Iterable[FaultRecord]) -> Metrics:
    """The metrics of one run from its event records and the faults injected into it."""
    faults = list(faults)  # used twice below: a generator must not come back empty
    timeline = _Timeline(events)
    records = timeline.records
    per_fault = [timeline.analyse(f) for f in sorted(faults, key=lambda f: f.injected_t)]

    committed = _committed(records)
    useful_s = sum(_float(r.get("step_time_s")) or 0.0 for r in committed.values()
                   if not r.get("skipped"))
    wall_s = timeline.ts[-1] - timeline.ts[0] if records else 0.0
    digests = [r for r in records if r.get("kind") == "final_digest"]
    digest = digests[-1].get("digest") if digests else None
    rank0_starts = sum(1 for r in records if r.get("kind") == "start" and r.get("rank") == 0)

    def worst(name: str) -> Any:
        down = [f for f in per_fault if f.went_down]
        unmeasurable = any(getattr(f, name) is None for f in down)
        return _worst([getattr(f, name) for f in down], unmeasurable)

    lost_values = [f.lost_steps for f in per_fault]
    lost = _worst(lost_values, None in lost_values)
    with_deadline = [f for f in per_fault if f.emergency_checkpoint_before_deadline is not None]
    slows = {f.id for f in faults if f.declares("slows_job")}
    slowing = [f.straggler_detected_s for f in per_fault if f.fault_id in slows]
    slowdowns = [f.slowdown for f in per_fault if f.fault_id in slows]
    emergency_s = [f.emergency_checkpoint_s for f in with_deadline]
    completes = completion(records)[0]
    saves = save_failure_metrics(records, faults, _damaged(faults))
    healing = healing_metrics(records, faults)
    metrics = Metrics(
        completes=completes,
        final_digest=digest if isinstance(digest, str) else None,
        restarts=max(0, rank0_starts - 1),
        max_step=max((s for s in map(_step, records) if s is not None), default=0),
        steps_committed=len(committed),
        wall_s=wall_s,
        goodput=useful_s / wall_s if wall_s > 0 else None,
        samples_exactly_once=_samples_exactly_once(records, committed),
        world_sizes=_world_sizes(records),
        corrupt_checkpoint_never_loaded=_corrupt_never_loaded(records, faults),
        detection_latency_s=_worst([f.detection_latency_s for f in per_fault], False),
        resume_time_s=worst("resume_time_s"),
        recovery_time_s=worst("recovery_time_s"),
        lost_steps=0 if not per_fault else lost,
        emergency_checkpoint_s=_worst(emergency_s, None in emergency_s),
        emergency_checkpoint_before_deadline=(
            all(f.emergency_checkpoint_before_deadline for f in with_deadline)
            if with_deadline else None),
        straggler_detected_within_s=_worst(slowing, None in slowing),
        slowdown=_worst(slowdowns, None in slowdowns) if slowdowns else None,
        save_failure_detected=saves.save_failure_detected,
        save_hang_detected_within_s=saves.save_hang_detected_within_s,
        training_continued_through_save_failure=saves.training_continued_through_save_failure,
        failed_save_never_loaded=saves.failed_save_never_loaded,
        same_resume_point=_same_resume_point(per_fault),
        faulty_node_excluded=faulty_node_excluded(records, faults, completes),
        restarts_until_excluded=restarts_until_excluded(records, faults),
        survivor_restarts=healing.survivor_restarts,
        survivor_lost_steps=healing.survivor_lost_steps,
        healed_at_step=healing.healed_at_step,
        heal_time_s=healing.heal_time_s,
        healed_state_matches_peer=healing.healed_state_matches_peer,
        healing_note=healing.note,
        faults=per_fault,
    )
    withhold_unfinished(metrics, records, _last_bad_t(records, faults))
    return metrics


def _last_bad_t(records: list[Record], faults: list[FaultRecord]) -> float | None:
    """When the last checkpoint went bad: a storage fault struck (damage at rest, or a save
    made to fail) or the job reported a failed save; None if none did."""
    times = [f.injected_t for f in faults
             if f.details.get("checkpoints") or f.declares("fails_saves")]
    times += [float(r["t"]) for r in records if r.get("kind") == "anomaly"
              and r.get("what") in FAILED_SAVE_ANOMALIES]
    return max(times, default=None)
