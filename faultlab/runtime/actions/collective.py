"""Collective faults: what happens to an intercepted call before it is issued.

``collective_delay``
    Sleeps ``delay_ms`` ± a seeded uniform ``jitter_ms`` (never below 0) before every matching
    call while active. Window-based: a replayed window is delayed again.
``collective_hang``
    The ``after_num_calls``-th matching call never completes: the calling thread blocks (waiting
    on an event that ``undo`` sets) before issuing it. Peers block inside the collective.
``collective_error``
    From the ``after_num_calls``-th matching call on, ``num_calls`` calls raise
    ``torch.distributed.DistBackendError`` ("Connection reset by peer"), without being issued.
``collective_partition``
    A call whose participants (the group's ranks; for point-to-point, the two ends) span more
    than one of ``groups`` hangs or raises on this rank; calls inside one group proceed. A rank
    listed in no group is a group of its own.

Hang, error and partition are one-shot events of the *job*: a planned one that struck in one
process does not strike again in a restarted process replaying the same steps (a marker under
``RUN_DIR/runtime/fired/`` says so) — otherwise a restart would meet the same fault forever.
The process in which it struck keeps it until its window ends or it is undone.
"""

from __future__ import annotations

import fnmatch
import random
import threading
import time
from abc import ABC, abstractmethod
from typing import Any, Protocol

from faultlab.runtime.interposer import Call
from faultlab.runtime.plan import FaultEntry

__all__ = ["CollectiveFault", "Host", "make_collective_fault"]

_HANG_POLL_S = 0.1


class Host(Protocol):
    """What a collective fault needs from its agent."""

    rank: int

    @property
    def current_step(self) -> int: ...

    def injected(self, entry: FaultEntry, **details: Any) -> None: ...

    def mark_once(self, entry: FaultEntry) -> None:
        """Record (in memory and on disk) that this job-once fault struck here."""


def _dist_error(message: str) -> Exception:
    try:
        import torch.distributed as dist

        return dist.DistBackendError(message)
    except (ImportError, AttributeError):
        return RuntimeError(message)


class CollectiveFault(ABC):
    """Base: op matching, counters, undo (``released``); a kind implements ``_before``."""

    def __init__(self, entry: FaultEntry, host: Host, *, live: bool) -> None:
        self.entry, self.host, self.live = entry, host, live
        self._ops: tuple[str, ...] | None = entry.params.get("ops")
        self._match: dict[str, bool] = {}
        self.released = threading.Event()
        self.num_matched = 0
        """Matching calls seen while active."""
        self.num_struck = 0
        """Calls this fault actually delayed, blocked or failed."""
        self.blocked_s = 0.0
        """Time calls spent blocked by this fault (including a call blocked right now)."""
        self._blocked_since: float | None = None

    def matches(self, op: str) -> bool:
        hit = self._match.get(op)
        if hit is None:
            hit = self._match[op] = self._ops is None or any(
                fnmatch.fnmatchcase(op, pattern) for pattern in self._ops)
        return hit

    def before(self, call: Call) -> None:
        if self.released.is_set():
            return
        self.num_matched += 1
        self._before(call)

    @abstractmethod
    def _before(self, call: Call) -> None:
        """Act on one matching call before it is issued: delay, block or raise."""

    def _strike(self, call: Call, **details: Any) -> None:
        self.num_struck += 1
        if self.num_struck == 1:
            if not self.live and self.entry.type != "collective_delay":
                self.host.mark_once(self.entry)
            self.host.injected(self.entry, op=call.op, backend=call.backend(),
                               call_number=self.num_matched, **details)

    def _block(self) -> None:
        self._blocked_since = t0 = time.monotonic()
        # A loop, not one wait(): stays interruptible and tolerant of clock changes.
        while not self.released.wait(_HANG_POLL_S):
            pass
        self._blocked_since = None
        self.blocked_s += time.monotonic() - t0

    def release(self) -> dict[str, Any]:
        """Undo: let blocked calls go, stop striking. Returns the counters for the event."""
        self.released.set()
        return self.summary()

    def summary(self) -> dict[str, Any]:
        since = self._blocked_since
        blocked_s = self.blocked_s + (time.monotonic() - since if since is not None else 0.0)
        return {"id": self.entry.id, "type": self.entry.type, "live": self.live,
                "num_matched": self.num_matched, "num_struck": self.num_struck,
                "blocked_s": round(blocked_s, 3), "released": self.released.is_set()}


class _Delay(CollectiveFault):
    def __init__(self, entry: FaultEntry, host: Host, *, live: bool) -> None:
        super().__init__(entry, host, live=live)
        p = entry.params
        self._rng = random.Random(f"{p['seed']}/{entry.id}/{host.rank}")
        self.total_delay_s = 0.0

    def _before(self, call: Call) -> None:
        p = self.entry.params
        delay_ms = p["delay_ms"]
        if p["jitter_ms"]:
            delay_ms = max(0.0, delay_ms + self._rng.uniform(-p["jitter_ms"], p["jitter_ms"]))
        self._strike(call, delay_ms=p["delay_ms"], jitter_ms=p["jitter_ms"])
        self.total_delay_s += delay_ms / 1000
        self.released.wait(delay_ms / 1000)  # an undo cuts a delay short

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "total_delay_s": round(self.total_delay_s, 4)}


class _Hang(CollectiveFault):
    def _before(self, call: Call) -> None:
        if self.num_matched != self.entry.params["after_num_calls"]:
            return
        self._strike(call, blocks="until undone")
        self._block()


class _Error(CollectiveFault):
    def _before(self, call: Call) -> None:
        p = self.entry.params
        if self.num_matched < p["after_num_calls"] or self.num_struck >= p["num_calls"]:
            return
        self._strike(call, error="DistBackendError")
        raise _dist_error(f"faultlab collective_error: Connection reset by peer (injected into "
                          f"{call.op} on rank {self.host.rank} at step "
                          f"{self.host.current_step}, fault {self.entry.id!r})")


class _Partition(CollectiveFault):
    def __init__(self, entry: FaultEntry, host: Host, *, live: bool) -> None:
        super().__init__(entry, host, live=live)
        self._side = {r: i for i, g in enumerate(entry.params["groups"]) for r in g}

    def _before(self, call: Call) -> None:
        participants = call.participants()
        sides = {self._side.get(r, ("alone", r)) for r in participants}
        if len(sides) < 2:
            return
        mode = self.entry.params["mode"]
        self._strike(call, mode=mode, participants=participants)
        if mode == "error":
            raise _dist_error(f"faultlab collective_partition: Connection reset by peer "
                              f"({call.op} on rank {self.host.rank} spans groups "
                              f"{self.entry.params['groups']}, fault {self.entry.id!r})")
        self._block()


_KINDS: dict[str, type[CollectiveFault]] = {
    "collective_delay": _Delay, "collective_hang": _Hang, "collective_error": _Error,
    "collective_partition": _Partition,
}


def make_collective_fault(entry: FaultEntry, host: Host, *, live: bool) -> CollectiveFault:
    return _KINDS[entry.type](entry, host, live=live)
