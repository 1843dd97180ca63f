"""What the agent keeps on disk: its own event file and the fire-once markers (who the process
is: ``faultlab.runtime.identity``).

The markers are why a numeric fault strikes at most once per (fault id, rank, step) for the
whole job: the in-memory set covers an in-process rollback, and a marker file under
``RUN_DIR/runtime/fired/`` covers a restarted process (a new pid, the same rank), which would
otherwise replay the faulted step and meet the fault again, forever. File names are the fault id
made filesystem-safe plus a hash of the exact id, the rank, and ``step{n}`` or ``once``; a
*shared* marker (``sdc``'s ``node-<name>``, which every rank reads) has ``job`` for the rank.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from pathlib import Path

from faultlab.runtime.events import EventLog
from faultlab.runtime.identity import Identity

__all__ = ["EventFile", "FiredMarkers"]


class EventFile(EventLog):
    """The agent's own event file when the trainer gives no emitter (opened on first use)."""

    def __init__(self, ident: Identity) -> None:
        super().__init__(ident.run_dir / "events", rank=ident.rank,
                         world_size=ident.world_size, node=ident.node, restart=ident.restart,
                         suffix="-runtime")
        self.base["pid"] = ident.pid


class FiredMarkers:
    """Fire-once keys (fault id, rank, step-or-"once"): memory first, then marker files."""

    def __init__(self, root: Path, rank: int) -> None:
        self.root, self.rank = root, rank
        self.mine: set[tuple[str, str]] = set()

    def _path(self, fid: str, when: str, shared: bool = False) -> Path:
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", fid)[:60]
        digest = hashlib.sha256(fid.encode()).hexdigest()[:10]
        who = "job" if shared else f"rank{self.rank}"
        return self.root / f"{slug}-{digest}-{who}-{re.sub(r'[^A-Za-z0-9._-]+', '_', when)}"

    def seen(self, fid: str, when: str, *, shared: bool = False) -> bool:
        return (fid, when) in self.mine or self._path(fid, when, shared).exists()

    def elsewhere(self, fid: str, when: str) -> bool:
        return (fid, when) not in self.mine and self._path(fid, when).exists()

    def mark(self, fid: str, when: str, *, shared: bool = False) -> None:
        self.mine.add((fid, when))
        path = self._path(fid, when, shared)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{time.time()} pid {os.getpid()}\n", encoding="utf-8")
