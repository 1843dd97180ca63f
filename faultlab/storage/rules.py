"""The rules a storage fault sets in the passthrough, and how one operation meets them.

A rule names the operations it hits (``ops``), the files (``path``, a glob relative to the
served directory, ``*`` crossing ``/``), how often (``percent``, drawn from a seeded generator)
and from when (``after_bytes``: only after that many bytes were written to matching files since
the rule was set); ``pids``, when given, limits it to the processes under those (one node's
agent: that node's view of the storage). What it does to a hit operation, in this order: wait
until the rule is removed (``hang``), sleep (``delay_ms``; for writes also ``bandwidth_mb_s``,
a shared pace), fail with ``errno``, or, for ``free_bytes``, fail writes with ENOSPC once that
much new data was written. Every hit is counted per operation: the journal's record of what the
fault did.

This module is pure Python (no FUSE): the server (``faultlab.storage.server``) calls
``RuleSet.gate`` at the top of each operation, in the FUSE worker thread serving it, so a hung
operation holds one worker thread while the caller sits in the kernel.
"""

from __future__ import annotations

import errno as errno_mod
import fnmatch
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ERRNOS", "OPS", "Rule", "RuleSet"]

OPS = ("write", "fsync", "create", "rename", "open", "read", "mkdir", "unlink")
"""The operations a rule can hit (issue 23): ``fsync`` includes a directory's fsync, ``unlink``
a directory's removal."""

ERRNOS = ("ENOSPC", "EIO", "EROFS", "EDQUOT", "ESTALE", "EACCES")
"""The errors ``io_error`` can return, by name."""


@dataclass(slots=True)
class Rule:
    """One fault's effect on the passthrough (see the module docstring)."""

    id: str
    ops: tuple[str, ...] = ("write",)
    path: str = "*"
    percent: float = 100.0
    after_bytes: int = 0
    errno: str | None = None
    delay_ms: float = 0.0
    bandwidth_mb_s: float | None = None
    hang: bool = False
    free_bytes: int | None = None
    pids: tuple[int, ...] = ()
    """Only operations of these processes and their descendants (empty: every process)."""
    seed: int = 0
    # state
    counts: dict[str, int] = field(default_factory=dict)
    seen_bytes: int = 0
    """Bytes written to matching files since the rule was set (``after_bytes``, ``free_bytes``)."""
    released: threading.Event = field(default_factory=threading.Event)
    _rng: random.Random = field(default_factory=random.Random)
    _pace_t: float = 0.0

    def __post_init__(self) -> None:
        bad = [op for op in self.ops if op not in OPS]
        if bad:
            raise ValueError(f"unknown op(s) {bad!r}; valid: {', '.join(OPS)}")
        if self.errno is not None and self.errno not in ERRNOS:
            raise ValueError(f"unknown errno {self.errno!r}; valid: {', '.join(ERRNOS)}")
        if not 0 <= self.percent <= 100:
            raise ValueError(f"percent must be within 0-100, got {self.percent!r}")
        self._rng = random.Random(f"{self.seed}/{self.id}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Rule:
        keys = ("id", "ops", "path", "percent", "after_bytes", "errno", "delay_ms",
                "bandwidth_mb_s", "hang", "free_bytes", "pids", "seed")
        unknown = set(d) - set(keys)
        if unknown:
            raise ValueError(f"unknown rule field(s) {sorted(unknown)}")
        d = {**d, "ops": tuple(d.get("ops", ("write",))), "pids": tuple(d.get("pids", ()))}
        return cls(**d)

    def summary(self) -> dict[str, Any]:
        return {"id": self.id, "counts": dict(self.counts), "bytes_seen": self.seen_bytes}


class RuleSet:
    """The rules in force, changed at run time by the control channel; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: dict[str, Rule] = {}
        self._removed: dict[str, dict[str, Any]] = {}

    def set(self, rule: Rule) -> None:
        with self._lock:
            old = self._rules.pop(rule.id, None)
            self._rules[rule.id] = rule
        if old is not None:
            old.released.set()

    def remove(self, rule_id: str) -> dict[str, Any]:
        """Remove a rule, releasing the operations it holds; returns its final counts."""
        with self._lock:
            rule = self._rules.pop(rule_id, None)
            if rule is None:
                return self._removed.get(rule_id, {"id": rule_id, "counts": {}})
            self._removed[rule_id] = rule.summary()
        rule.released.set()
        return rule.summary()

    def clear(self) -> list[dict[str, Any]]:
        """Remove every rule (hung operations go on); their final counts."""
        return [self.remove(rid) for rid in list(self._rules)]

    def counts(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r.summary() for r in self._rules.values()]

    def needs_caller(self) -> bool:
        """Does a rule in force depend on which process called (``pids``)?"""
        return any(r.pids for r in list(self._rules.values()))

    def gate(self, op: str, rel: str, nbytes: int = 0, caller: int | None = None) -> int:
        """Apply the rules to one operation on ``rel`` (relative to the served directory) by
        the process ``caller``; returns an errno to fail it with, 0 to let it through. Blocks
        while a ``hang`` rule holds it, sleeps for a latency rule."""
        rules = list(self._rules.values())  # a snapshot: set/remove may race, never block us
        if not rules:
            return 0
        for rule in rules:
            if op not in rule.ops and not (rule.free_bytes is not None and op == "write"):
                continue
            if not fnmatch.fnmatchcase(rel, rule.path):
                continue
            if rule.pids and (caller is None or not _under(caller, rule.pids)):
                continue
            fail = self._apply(rule, op, nbytes)
            if fail:
                return fail
        return 0

    def _apply(self, rule: Rule, op: str, nbytes: int) -> int:
        with self._lock:
            if rule.free_bytes is not None:  # disk_full: the volume has this much room left
                if op != "write":
                    return 0
                if rule.seen_bytes + nbytes > rule.free_bytes:
                    rule.counts[op] = rule.counts.get(op, 0) + 1
                    return errno_mod.ENOSPC
                rule.seen_bytes += nbytes
                return 0
            armed = rule.seen_bytes >= rule.after_bytes
            if op == "write":
                rule.seen_bytes += nbytes
            if not armed or rule._rng.random() * 100 >= rule.percent:
                return 0
            rule.counts[op] = rule.counts.get(op, 0) + 1
            pause_s = rule.delay_ms / 1000
            if rule.bandwidth_mb_s and op == "write":
                # one shared pace for every write the rule hits: the cap holds across threads
                now = time.monotonic()
                rule._pace_t = max(rule._pace_t, now) + nbytes / (rule.bandwidth_mb_s * 1e6)
                pause_s += rule._pace_t - now
        if rule.hang:
            rule.released.wait()
            return 0
        if pause_s > 0:
            rule.released.wait(pause_s)  # removing the rule cuts a long delay short
        return getattr(errno_mod, rule.errno) if rule.errno else 0


def _under(pid: int, roots: tuple[int, ...]) -> bool:
    """Is ``pid`` one of ``roots`` or a descendant of one (its parents in ``/proc``)?"""
    seen = 0
    while pid > 1 and seen < 64:
        if pid in roots:
            return True
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        seen += 1
    return False
