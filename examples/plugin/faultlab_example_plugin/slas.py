"""faultlab's side, too: the package's SLA, ``peers_released_within_s``.

When ``optimizer_exception`` makes one rank raise, its peers are left in their next collective.
They must not stay there: the transport fails them, the job's watchdog ends them, or the
launcher stops them to restart the group. This SLA is the bound on how long that takes.

It is one declaration of ``faultlab.sla.Sla``, registered under the ``faultlab.slas`` entry
point, and it reads the run's event records as the built-ins do. It imports ``faultlab.sla``
only (the registry is read while ``faultlab.spec`` is imported: no spec, judge or engine here).

What it measures, per ``optimizer_exception`` that struck (its ``fault_injected`` record, at
``T``, written by the victim rank just before it raised):

- the *peers* are the other processes of the victim's incarnation: for every other rank, the
  newest process whose ``start`` record is at or before ``T``, unless it wrote its ``exit`` by
  then;
- a peer was *released* at its first ``exit`` record after ``T`` (the process wrote it as it
  left: its collective failed, its watchdog fired). A peer without one (the launcher stopped
  it with a signal, which leaves no record) was released at the latest when the launcher
  created the next incarnation's first process (the ``t_process_created`` of a ``start``
  record after ``T`` by a process unseen before it, else that record's ``t``; on the peer's
  node if there is one): torchrun stops every worker of the group before it spawns the next;
- the measured value is the last release − ``T``, the largest over the faults.

Not measured (the SLA fails, its note says why) when no ``optimizer_exception`` struck, when
the victim had no peer, or when a peer left neither an exit record nor a restart after ``T``
(a job that faultlab had to stop, or whose launcher gave up without a record): what cannot be
seen is never passed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from faultlab.sla import Evidence, Sla

__all__ = ["PEERS_RELEASED_WITHIN_S", "PeersReleased", "Release", "releases"]

FAULT_TYPES = ("optimizer_exception",)


@dataclass(frozen=True)
class Release:
    """What one struck fault's peers did: each peer's rank, how and when it was released (None:
    no record shows it), or why nothing can be said (``missing``)."""

    fault_id: str
    rank: int | None
    step: int | None
    peers: tuple[tuple[int | None, str, float | None], ...] = ()
    """(rank, how, seconds after the victim raised) per peer, slowest first."""
    missing: str = ""

    @property
    def seconds(self) -> float | None:
        if self.missing or not self.peers or any(s is None for _, _, s in self.peers):
            return None
        return max(s for _, _, s in self.peers if s is not None)


def _t(record: Mapping[str, Any], key: str = "t") -> float | None:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def releases(events: Sequence[Mapping[str, Any]], faults: Sequence[Any],
             types: Sequence[str] = FAULT_TYPES) -> list[Release]:
    """One :class:`Release` per fault of ``types`` that struck (module docstring)."""
    records = sorted((r for r in events if _t(r) is not None), key=lambda r: _t(r) or 0.0)
    out = []
    for fault in faults:
        if fault.type not in types or fault.details.get("error"):
            continue
        strike = next((r for r in records if r.get("kind") == "fault_injected"
                       and r.get("fault_id") == fault.id.split("#")[0]), None)
        if strike is None:
            out.append(Release(fault.id, fault.details.get("rank"), fault.details.get("step"),
                               missing="the victim's fault_injected record is missing"))
            continue
        out.append(_release(records, fault.id, strike))
    return out


def _release(records: list[Mapping[str, Any]], fault_id: str,
             strike: Mapping[str, Any]) -> Release:
    T = _t(strike) or 0.0
    victim = strike.get("rank")
    before = [r for r in records if (_t(r) or 0.0) <= T]
    gone = {r.get("pid") for r in before if r.get("kind") == "exit"}
    latest: dict[Any, Mapping[str, Any]] = {}  # rank -> its newest process's start by T
    for r in before:
        if r.get("kind") == "start" and r.get("pid") is not None and r.get("rank") != victim:
            latest[r.get("rank")] = r
    peers = {r["pid"]: r for r in latest.values() if r["pid"] not in gone}
    if not peers:
        return Release(fault_id, victim, strike.get("step"),
                       missing=f"rank {victim} had no peer running when it raised")
    seen = {r.get("pid") for r in before}
    respawned = [r for r in records if r.get("kind") == "start" and (_t(r) or 0.0) > T
                 and r.get("pid") not in seen]
    found = []
    for pid, first in peers.items():
        exit_ = next((r for r in records if r.get("kind") == "exit" and r.get("pid") == pid
                      and (_t(r) or 0.0) > T), None)
        if exit_ is not None:
            how, t = f"by its exit ({exit_.get('reason', '?')})", _t(exit_)
        else:
            mine = [r for r in respawned if r.get("node") == first.get("node")] or respawned
            created = [c for r in mine if (c := _t(r, "t_process_created") or _t(r)) is not None]
            how, t = "stopped by the launcher (gone by its restart)", min(created, default=None)
            if t is None:
                how = "left no exit record, and no restart followed"
        found.append((first.get("rank"), how, None if t is None else max(0.0, t - T)))
    found.sort(key=lambda p: -math.inf if p[2] is None else -p[2])
    return Release(fault_id, victim, strike.get("step"), tuple(found))


@dataclass(frozen=True, kw_only=True)
class PeersReleased(Sla):
    """Seconds from the victim's raise to the last of its peers leaving (module docstring)."""

    def measure(self, ev: Evidence) -> float | None:
        found = releases(ev.events, ev.faults)
        if not found or any(r.seconds is None for r in found):
            return None
        return max(r.seconds for r in found if r.seconds is not None)

    def explain(self, ev: Evidence, measured: Any, bound: Any) -> tuple[Any, str]:
        found = releases(ev.events, ev.faults)
        if not found:
            return measured, (f"not measured: no {' or '.join(FAULT_TYPES)} struck (no "
                              f"fault_injected record of one)")
        notes = []
        for r in found:
            if r.missing:
                notes.append(f"not measured: {r.fault_id}: {r.missing}")
                continue
            peers = ", ".join(f"rank {rank} {how}" + ("" if s is None else f" after {s:.2f} s")
                              for rank, how, s in r.peers)
            if r.seconds is None:
                notes.append(f"not measured: {r.fault_id}: a peer of rank {r.rank} left no "
                             f"record of leaving after it raised at step {r.step} ({peers})")
            else:
                notes.append(f"peers released {r.seconds:.2f} s after rank {r.rank} raised at "
                             f"step {r.step} (bound {bound:g} s): {peers}")
        return measured, "; ".join(notes)


PEERS_RELEASED_WITHIN_S = PeersReleased(
    key="peers_released_within_s", value=float, gt=0, kind="max", unit="s",
    description="seconds from an optimizer_exception's victim raising to the last other rank "
                "of its incarnation leaving its collective (its exit record, else the "
                "launcher's restart)",
    doc="""Upper bound, in seconds, on how long the victim's peers stay in their collective
    after an optimizer_exception raised: from the victim's fault_injected record to each
    peer's exit record (or, for a peer the launcher stopped without one, the next
    incarnation's first process). Not measured when no optimizer_exception struck or a peer
    left no record of leaving. From the faultlab-example-plugin package.""")
