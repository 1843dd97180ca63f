"""Healing metrics: what a stack that recovers per step (torchft) promises, read from events.

torchft does not restart the job when a replica group fails: the other groups leave it out of
the next quorum and go on, and the group that comes back (a restarted process, or one that
was frozen) *heals*: it fetches the live model and optimizer state from a peer and joins the
next committed step. A bitwise match against a fault-free golden run is not one of its
promises (the quorum changes the effective batch while a group is out, so the weights differ
from an uninterrupted run); these are.

Definitions (records sorted by ``t``; a fault at ``T``, undone at ``U`` if it was undone):

struck ranks
    The ranks a fault hit: ``rank_kill``'s ``pids_by_rank``; for a fault on a node (its
    details name the ``node``), the ranks whose latest ``start`` at or before ``T`` was on that
    node. A fault on no rank (``service_kill`` of torchft's lighthouse) strikes none.
survivors
    The ranks with a ``start`` at or before ``T`` that the fault did not strike.
survivor_restarts
    ``start`` records of survivors after the first fault's ``T``, over the run: a survivor
    that kept its process adds none. None with no fault, or with no survivor (every rank
    struck, or none had started): 0 restarts of nobody is no evidence.
survivor_lost_steps
    The worst, over faults and survivors, of ``max(0, H_r + 1 − s_r)``, where ``H_r`` is the
    survivor's highest step at or before ``T`` and ``s_r`` its first step after ``T``: 0 when it
    went straight on. None if a survivor made no step after ``T`` (the job stalled or was
    lost: what it cost is unknown, not 0), or if there was no survivor.
healed_at_step, heal_time_s
    For each fault that struck ranks, the first step record of a struck rank after ``U`` (``T``
    for a fault that is not undone): its ``step``, and its ``t − T``, if that step is past the
    struck ranks' highest step at ``T`` (a heal takes the peers' step; a rank that starts again
    below where it was did not heal: it started over, with nobody to heal from). Run level: the
    worst (highest step, longest time); None if some struck group never stepped again, or
    started over.
healed_state_matches_peer
    ``param_digest`` (``observe.step_digest``) of that healed step record against a survivor's
    step record of the same step number, and so on for every later step both recorded: True
    if all are equal, False at the first that differs. None without digests, or with no step
    both recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from faultlab.observe.records import FaultRecord, Record, _int, _step

__all__ = ["Healing", "healing_metrics"]


@dataclass(slots=True)
class Healing:
    survivor_restarts: int | None = None
    survivor_lost_steps: int | None = None
    healed_at_step: int | None = None
    heal_time_s: float | None = None
    healed_state_matches_peer: bool | None = None
    note: str = ""
    """What was seen, in words, for the verdict's notes (which rank healed at which step, the
    first step whose digests differ, which survivor stalled)."""


def _struck(fault: FaultRecord, records: Sequence[Record]) -> set[int]:
    by_rank = fault.details.get("pids_by_rank")
    if isinstance(by_rank, dict):
        return {int(r) for r in by_rank if str(r).isdigit()}
    node = fault.details.get("node")
    if not isinstance(node, str):
        return set()
    latest: dict[int, str] = {}
    for r in records:
        if r.get("kind") == "start" and r["t"] <= fault.injected_t and \
                (rank := _int(r.get("rank"))) is not None:
            latest[rank] = str(r.get("node"))
    return {rank for rank, n in latest.items() if n == node}


def healing_metrics(records: Sequence[Record], faults: Sequence[FaultRecord]) -> Healing:
    """The healing metrics of one run (module docstring)."""
    faults = sorted(faults, key=lambda f: f.injected_t)
    if not faults:
        return Healing()
    out = Healing()
    notes: list[str] = []
    steps = [r for r in records if r.get("kind") == "step" and _step(r) is not None
             and _int(r.get("rank")) is not None]
    starts = [r for r in records if r.get("kind") == "start" and _int(r.get("rank")) is not None]
    t_first = faults[0].injected_t
    survivors_ever: set[int] = set()
    lost: list[int | None] = []
    heals: list[tuple[int, float] | None] = []
    matches: list[bool | None] = []
    for fault in faults:
        T = fault.injected_t
        struck = _struck(fault, records)
        survivors = {int(r["rank"]) for r in starts if r["t"] <= T} - struck
        survivors_ever |= survivors
        for rank in sorted(survivors):
            before = [_step(r) for r in steps if r["rank"] == rank and r["t"] <= T]
            after = [_step(r) for r in steps if r["rank"] == rank and r["t"] > T]
            if not after:
                lost.append(None)
                notes.append(f"{fault.id}: rank {rank} (not struck) made no step after the "
                             f"fault")
                continue
            high = max((s for s in before if s is not None), default=0)
            lost.append(max(0, high + 1 - (after[0] or 0)))
        if not struck:
            continue
        since = fault.undone_t if fault.undone_t is not None else T
        healed = next((r for r in steps if r["rank"] in struck and r["t"] > since), None)
        if healed is None:
            heals.append(None)
            notes.append(f"{fault.id}: rank(s) {', '.join(map(str, sorted(struck)))} never "
                         f"stepped again")
            continue
        step = _step(healed)
        assert step is not None
        was = max((_step(r) or 0 for r in steps if r["rank"] in struck and r["t"] <= T),
                  default=0)
        if step <= was:
            heals.append(None)
            notes.append(f"{fault.id}: rank {healed['rank']} stepped again at step {step}, not "
                         f"past its step {was} before the fault: it started over instead of "
                         f"healing from a peer")
            continue
        heals.append((step, float(healed["t"]) - T))
        notes.append(f"{fault.id}: rank {healed['rank']} healed at step {step}, "
                     f"{float(healed['t']) - T:.2f} s after the fault")
        matches.append(_matches(healed, steps, survivors, notes, fault.id))
    restarted = [int(r["rank"]) for r in starts if r["t"] > t_first
                 and int(r["rank"]) in survivors_ever]
    if not survivors_ever:
        notes.insert(0, "no rank outlived the faults (every rank was struck, or none had "
                        "started): nothing shows how survivors fare")
    out.survivor_restarts = len(restarted) if survivors_ever else None
    if restarted:  # the guarantee broken: name who paid for the struck ranks' fault
        notes.insert(0, f"rank(s) {', '.join(map(str, sorted(set(restarted))))} (not struck) "
                        f"restarted {len(restarted)} time(s) after the fault")
    out.survivor_lost_steps = None if None in lost or not lost else max(
        n for n in lost if n is not None)
    if heals:
        known = [h for h in heals if h is not None]
        if None not in heals:
            out.healed_at_step = max(h[0] for h in known)
            out.heal_time_s = max(h[1] for h in known)
    if matches:
        out.healed_state_matches_peer = None if None in matches else all(matches)
    out.note = "; ".join(notes)
    return out


def _matches(healed: Record, steps: Sequence[Record], survivors: set[int], notes: list[str],
             fault_id: str) -> bool | None:
    """Compare the healed rank's digests from its heal step on with the survivors'."""
    rank = healed["rank"]
    mine = {_step(r): r.get("param_digest") for r in steps
            if r["rank"] == rank and r["t"] >= healed["t"]}
    theirs = {_step(r): r.get("param_digest") for r in steps if r["rank"] in survivors}
    both = sorted(s for s in mine if s is not None and isinstance(mine[s], str)
                  and isinstance(theirs.get(s), str))
    if not both:
        notes.append(f"{fault_id}: no step digest to compare (observe.step_digest: true "
                     f"records one per step)")
        return None
    for s in both:
        if mine[s] != theirs[s]:
            notes.append(f"{fault_id}: rank {rank}'s weights differ from its peer's at step "
                         f"{s}")
            return False
    notes.append(f"{fault_id}: rank {rank}'s weights equal its peer's at steps "
                 f"{both[0]}..{both[-1]}")
    return True
