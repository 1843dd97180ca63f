"""Collective faults: what happens to an intercepted call before it is issued.

The rank-side actions (``faultlab.runtime.hooks``, hook ``before_collective``, ``strikes =
"window"``) of ``faultlab.faults.collective``.

``collective_delay``
    Sleeps ``delay_ms`` ± a seeded uniform ``jitter_ms`` (never below 0) before every matching
    call while active, plus, with ``bandwidth_gbps``, the call's payload (:func:`payload_bytes`)
    at that bandwidth. Window-based: a replayed window is delayed again.
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

import random
import time
from typing import Any

from faultlab.runtime.hooks import RankAction

__all__ = ["CollectiveAction", "Delay", "Error", "Hang", "Partition", "payload_bytes"]

_HANG_POLL_S = 0.1


def _dist_error(message: str) -> Exception:
    try:
        import torch.distributed as dist

        return dist.DistBackendError(message)
    except (ImportError, AttributeError):
        return RuntimeError(message)


class CollectiveAction(RankAction):
    """Base: a window action on matching collectives (``ops``), with counters."""

    strikes = "window"

    def __init__(self, entry: Any, rank: Any) -> None:
        super().__init__(entry, rank)
        self.num_matched = 0
        """Matching calls seen while active."""
        self.blocked_s = 0.0
        """Time calls spent blocked by this fault (including a call blocked right now)."""
        self._blocked_since: float | None = None

    def before_collective(self, call: Any) -> None:
        if self.released.is_set():
            return
        self.num_matched += 1
        self._before(call)

    def _before(self, call: Any) -> None:
        """Act on one matching call before it is issued: delay, block or raise."""

    def _strike(self, call: Any, **details: Any) -> None:
        self.rank.struck(op=call.op, backend=call.backend(), call_number=self.num_matched,
                         **details)

    def _block(self) -> None:
        self._blocked_since = t0 = time.monotonic()
        # A loop, not one wait(): stays interruptible and tolerant of clock changes.
        while not self.released.wait(_HANG_POLL_S):
            pass
        self._blocked_since = None
        self.blocked_s += time.monotonic() - t0

    def summary(self) -> dict[str, Any]:
        since = self._blocked_since
        blocked_s = self.blocked_s + (time.monotonic() - since if since is not None else 0.0)
        return {**super().summary(), "num_matched": self.num_matched,
                "blocked_s": round(blocked_s, 3)}


class Delay(CollectiveAction):
    """``collective_delay``."""

    def __init__(self, entry: Any, rank: Any) -> None:
        super().__init__(entry, rank)
        self._rng = random.Random(f"{self.params['seed']}/{entry.id}/{rank.rank}")
        self.total_delay_s = 0.0

    def _before(self, call: Any) -> None:
        p = self.params
        delay_ms = p["delay_ms"]
        if p["jitter_ms"]:
            delay_ms = max(0.0, delay_ms + self._rng.uniform(-p["jitter_ms"], p["jitter_ms"]))
        details: dict[str, Any] = {}
        if p.get("bandwidth_gbps"):
            nbytes = payload_bytes(call.args, call.kwargs)
            delay_ms += nbytes * 8 / (p["bandwidth_gbps"] * 1e9) * 1000
            details = {"bandwidth_gbps": p["bandwidth_gbps"], "bytes": nbytes}
        self._strike(call, delay_ms=p["delay_ms"], jitter_ms=p["jitter_ms"], **details)
        self.total_delay_s += delay_ms / 1000
        self.released.wait(delay_ms / 1000)  # an undo cuts a delay short

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "total_delay_s": round(self.total_delay_s, 4)}


def payload_bytes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """The bytes a collective moves, as a slow link sees them: its largest tensor argument
    (a list or tuple of tensors counts as their sum)."""
    def size(x: Any) -> int:
        if isinstance(x, (list, tuple)):
            return sum(size(y) for y in x)
        if hasattr(x, "numel") and hasattr(x, "element_size"):
            return int(x.numel()) * int(x.element_size())
        return 0
    return max((size(a) for a in (*args, *kwargs.values())), default=0)


class Hang(CollectiveAction):
    """``collective_hang``."""

    once_per_job = True

    def _before(self, call: Any) -> None:
        if self.num_matched != self.params["after_num_calls"]:
            return
        self._strike(call, blocks="until undone")
        self._block()


class Error(CollectiveAction):
    """``collective_error``."""

    once_per_job = True

    def _before(self, call: Any) -> None:
        p = self.params
        if self.num_matched < p["after_num_calls"] or self.num_struck >= p["num_calls"]:
            return
        self._strike(call, error="DistBackendError")
        raise _dist_error(f"faultlab collective_error: Connection reset by peer (injected into "
                          f"{call.op} on rank {self.rank.rank} at step "
                          f"{self.rank.step}, fault {self.entry.id!r})")


class Partition(CollectiveAction):
    """``collective_partition``."""

    once_per_job = True

    def __init__(self, entry: Any, rank: Any) -> None:
        super().__init__(entry, rank)
        self._side = {r: i for i, g in enumerate(self.params["groups"]) for r in g}

    def _before(self, call: Any) -> None:
        participants = call.participants()
        sides = {self._side.get(r, ("alone", r)) for r in participants}
        if len(sides) < 2:
            return
        mode = self.params["mode"]
        self._strike(call, mode=mode, participants=participants)
        if mode == "error":
            raise _dist_error(f"faultlab collective_partition: Connection reset by peer "
                              f"({call.op} on rank {self.rank.rank} spans groups "
                              f"{self.params['groups']}, fault {self.entry.id!r})")
        self._block()
