"""Saves that fail while the job writes: what the job did about storage faults (issue 23).

The faults that can make a save fail are those whose class declares ``fails_saves``
(``faultlab.faults.Fault``; their records carry it: ``FaultRecord.declares``), the built-in
``io_error``, ``disk_full`` and ``io_hang`` (``io_latency`` only slows a save down:
``max_slowdown`` and the other timing SLAs judge it). Such a fault *struck* if its undo
counted at least one operation it hit (``details["undo"]["num_ops_hit"] > 0``); when no
count was recorded (the run ended before the undo could ask the passthrough) it is taken as
struck.

A *save-failure sign* is a record with ``t > T`` (``T``: the fault's injection) of:
an ``anomaly`` whose ``what`` is in ``SAVE_FAILURE_ANOMALIES`` (the trainer reported the
failed or hung save, or its watchdog fired), or an ``exit`` with a reason other than
completed/stopped (an error surfaced in a rank and ended it: a plain trainer's way of
noticing). Records of other kinds (a straggler, a NaN) are not signs of a failed save.

save_failure_detected
    None if no save-failing fault struck. Otherwise True iff every struck one was followed by
    a save-failure sign. False means the job carried on as if the save had worked: it
    reported it saved, or reported nothing.
save_hang_detected_s (per fault that ``hangs_saves``), save_hang_detected_within_s (run level)
    ``t`` of the first save-failure sign after ``T`` − ``T``: the ``detection_latency_s`` of
    ``metrics`` with the reactions narrowed to signs of a failed save (a hang is noticed by a
    watchdog or a save deadline, never by an error from the kernel). Run level: the worst
    (max) over the ``hangs_saves`` faults that struck; None if there is none or one was
    never noticed.
training_continued_through_save_failure
    None if no save-failing fault struck and the trainer reported no failed save. Otherwise
    True iff, after the first save-failure sign following each struck fault (the strike
    itself if the job never noticed) and after each ``checkpoint_save_failed`` anomaly, a
    process that was already training at that moment (its pid had a record before it)
    reported a step higher than any step before it: the same processes trained on, with no
    restart. A job that noticed, crashed and resumed did recover, but did not continue; the
    steps it took between the strike and the save that failed do not count.
failed_save_never_loaded
    Extends ``corrupt_checkpoint_never_loaded`` to checkpoints whose save failed or was cut
    short. None if no save failed (no save-failing fault struck, no failure reported) and no
    checkpoint was damaged. The checkpoints of failed saves are the ``path`` of every
    ``checkpoint_save_failed``/``checkpoint_save_hung`` anomaly; the damaged ones those of
    ``corrupt_checkpoint_never_loaded``. False iff a ``checkpoint_loaded`` record after the
    failure (or the damage) names such a path — the same path, or a directory inside or
    around it — before the job wrote a fresh checkpoint to it (a ``checkpoint_saved`` with
    that path). A trainer that reports neither its failed saves nor its loads cannot be
    judged by this rule beyond the damaged checkpoints; it is then True when nothing it
    reported matches, which the journal's fault details (the operations hit) put in context.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from faultlab.observe.records import CLEAN_EXITS, FaultRecord, Record, _float, _int, _key

__all__ = ["FAILED_SAVE_ANOMALIES", "SAVE_FAILURE_ANOMALIES",
           "SaveFailureMetrics", "save_failure_metrics"]

SAVE_FAILURE_ANOMALIES = frozenset({"checkpoint_save_failed", "checkpoint_save_hung",
                                    "watchdog"})
"""``anomaly.what`` values that show a trainer noticed a failed or hung save."""

FAILED_SAVE_ANOMALIES = frozenset({"checkpoint_save_failed", "checkpoint_save_hung"})
"""``anomaly.what`` values a trainer reports for one save of its own that failed or hung."""


@dataclass(slots=True)
class SaveFailureMetrics:
    """Run-level results (definitions: module docstring); None means not measured."""

    save_failure_detected: bool | None = None
    save_hang_detected_within_s: float | None = None
    training_continued_through_save_failure: bool | None = None
    failed_save_never_loaded: bool | None = None
    per_fault_detected_s: dict[str, float | None] | None = None
    """Fault id → seconds to the first save-failure sign, for every save-failing fault that
    struck (None: never noticed)."""


def struck(fault: FaultRecord) -> bool:
    """A save-failing fault that hit at least one operation (or whose count is unknown)."""
    if not fault.declares("fails_saves") or fault.details.get("error"):
        return False
    undo = fault.details.get("undo")
    hits = _int(undo.get("num_ops_hit")) if isinstance(undo, dict) else None
    return hits is None or hits > 0


def _is_sign(r: Record) -> bool:
    kind = r.get("kind")
    if kind == "anomaly":
        return _key(r.get("what")) in SAVE_FAILURE_ANOMALIES
    return kind == "exit" and _key(r.get("reason")) not in CLEAN_EXITS


def _first_sign_t(records: Sequence[Record], t: float) -> float | None:
    return next((float(r["t"]) for r in records if r["t"] > t and _is_sign(r)), None)


def _continued(records: Sequence[Record], t: float) -> bool:
    """A process training before ``t`` reported a step above every step before ``t``."""
    before = [r for r in records if r["t"] <= t]
    pids = {_key(r.get("pid")) for r in before} - {None}
    high = max((s for r in before if r.get("kind") == "step"
                and (s := _int(r.get("step"))) is not None), default=0)
    return any(r.get("kind") == "step" and r["t"] > t and _key(r.get("pid")) in pids
               and (_int(r.get("step")) or 0) > high for r in records)


def _related(a: str, b: str) -> bool:
    """The same checkpoint: equal paths, or one a directory holding the other."""
    a, b = a.rstrip("/"), b.rstrip("/")
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def _never_loaded(records: Sequence[Record], bad: Iterable[tuple[str, float]]) -> bool:
    for path, since_t in bad:
        rewritten_t = min((r["t"] for r in records if r.get("kind") == "checkpoint_saved"
                           and r.get("path") == path and r["t"] > since_t), default=math.inf)
        if any(r.get("kind") == "checkpoint_loaded" and isinstance(r.get("path"), str)
               and _related(r["path"], path) and since_t < r["t"] < rewritten_t
               for r in records):
            return False
    return True


def save_failure_metrics(records: Sequence[Record], faults: Sequence[FaultRecord],
                         damaged: Sequence[tuple[str, float]] = ()) -> SaveFailureMetrics:
    """``records`` sorted by ``t`` (every one with a finite ``t``); ``damaged``: the
    ``(path, struck_t)`` of checkpoints a storage fault damaged at rest."""
    hits = sorted((f for f in faults if struck(f)), key=lambda f: f.injected_t)
    reported = [r for r in records if r.get("kind") == "anomaly"
                and r.get("what") in FAILED_SAVE_ANOMALIES]
    out = SaveFailureMetrics()
    if hits:
        detected = {f.id: _first_sign_t(records, f.injected_t) for f in hits}
        out.per_fault_detected_s = {fid: (None if t is None else t - f.injected_t)
                                    for f in hits for fid, t in [(f.id, detected[f.id])]}
        out.save_failure_detected = all(t is not None for t in detected.values())
        hangs = [out.per_fault_detected_s[f.id] for f in hits if f.declares("hangs_saves")]
        if hangs and None not in hangs:
            out.save_hang_detected_within_s = max(h for h in hangs if h is not None)
    # From the moment the job noticed (or, if it never did, the strike): steps between the
    # strike and the failing save do not show that training survived it.
    moments = [_first_sign_t(records, f.injected_t) or f.injected_t for f in hits] + [
        float(r["t"]) for r in reported if r.get("what") == "checkpoint_save_failed"]
    if moments:
        out.training_continued_through_save_failure = all(
            _continued(records, t) for t in moments)
    failed = [(str(r["path"]), float(r["t"]) - 1e-9) for r in reported
              if isinstance(r.get("path"), str)]
    if hits or reported or damaged:
        out.failed_save_never_loaded = _never_loaded(records, [*failed, *damaged])
    return out


def sign_note(records: Sequence[Record], fault: FaultRecord) -> str:
    """What the job did after a save-failing fault, for the verdict's note."""
    t, end = fault.injected_t, fault.undone_t
    saved = [r for r in records if r.get("kind") == "checkpoint_saved"
             and (rt := _float(r.get("t"))) is not None and rt > t
             and (end is None or rt <= end)]
    undo = fault.details.get("undo") if isinstance(fault.details.get("undo"), dict) else {}
    ops = undo.get("ops_hit") if isinstance(undo, dict) else None
    hit = f"{fault.id} ({fault.type}) hit {ops}" if ops else f"{fault.id} ({fault.type})"
    if saved:
        steps = [r.get("step") for r in saved]
        return (f"{hit}; the job reported checkpoint(s) saved at step(s) {steps} while it "
                f"was in force, and no error, anomaly or failed exit")
    return f"{hit}; no error, anomaly or failed exit followed"
