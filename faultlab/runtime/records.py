"""What the agent knows about its process and keeps on disk: its identity, its own event file,
and the fire-once markers.

The markers are why a numeric fault strikes at most once per (fault id, rank, step) for the
whole job: the in-memory set covers an in-process rollback, and a marker file under
``RUN_DIR/runtime/fired/`` covers a restarted process (a new pid, the same rank), which would
otherwise replay the faulted step and meet the fault again, forever. File names are the fault id
made filesystem-safe plus a hash of the exact id, the rank, and ``step{n}`` or ``once``.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from faultlab.runtime.events import EventLog

__all__ = ["EventFile", "FiredMarkers", "Identity"]


@dataclass(frozen=True, slots=True)
class Identity:
    """Who this process is, from the environment torchrun and faultlab set."""

    run_dir: Path
    rank: int
    world_size: int
    restart: int
    node: str
    pid: int

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Identity:
        def num(name: str, default: int) -> int:
            raw = env.get(name) or str(default)
            try:
                return int(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not an integer") from None
        # Where every node is a torchrun world of its own (torchft's replica groups), each
        # world's ranks start at 0: faultlab's launcher gives each node its offset and the
        # job's size, so that a rank names one process across the job.
        return cls(run_dir=Path(env["FAULTLAB_RUN_DIR"]),
                   rank=num("FAULTLAB_RANK_OFFSET", 0) + num("RANK", 0),
                   world_size=num("FAULTLAB_WORLD_SIZE", 0) or num("WORLD_SIZE", 1),
                   restart=num("TORCHELASTIC_RESTART_COUNT", 0),
                   node=env.get("FAULTLAB_NODE") or socket.gethostname(), pid=os.getpid())


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

    def _path(self, fid: str, when: str) -> Path:
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", fid)[:60]
        digest = hashlib.sha256(fid.encode()).hexdigest()[:10]
        return self.root / f"{slug}-{digest}-rank{self.rank}-{when}"

    def seen(self, fid: str, when: str) -> bool:
        return (fid, when) in self.mine or self._path(fid, when).exists()

    def elsewhere(self, fid: str, when: str) -> bool:
        return (fid, when) not in self.mine and self._path(fid, when).exists()

    def mark(self, fid: str, when: str) -> None:
        self.mine.add((fid, when))
        path = self._path(fid, when)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{time.time()} pid {os.getpid()}\n", encoding="utf-8")
