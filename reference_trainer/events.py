"""The event protocol of DESIGN.md, written by each rank.

One append-only JSON-lines file per process under ``RUN_DIR/events/``, flushed per line, so a
reader tailing the directory sees every record the moment the rank wrote it and a SIGKILL loses
at most the line being written. Every record carries ``t``, ``kind``, ``rank``, ``world_size``,
``pid``, ``restart`` and ``node``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["EventLog", "read_events"]


class EventLog:
    def __init__(self, events_dir: Path, *, rank: int, world_size: int, node: str,
                 restart: int) -> None:
        events_dir.mkdir(parents=True, exist_ok=True)
        self.base = {"rank": rank, "world_size": world_size, "pid": os.getpid(),
                     "restart": restart, "node": node}
        self.path = events_dir / f"{node}-rank{rank}-restart{restart}-pid{os.getpid()}.jsonl"
        self._file = open(self.path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        # The watchdog and the async-checkpoint commit emit from other threads.
        self._lock = threading.Lock()

    def emit(self, kind: str, **fields: Any) -> None:
        record = {"t": time.time(), "kind": kind, **self.base, **fields}
        line = json.dumps(record, separators=(",", ":"), allow_nan=True) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_events(events_dir: Path) -> list[dict[str, Any]]:
    """Every record under ``events_dir``, ordered by time. A torn last line is ignored."""
    out: list[dict[str, Any]] = []
    for path in sorted(Path(events_dir).glob("*.jsonl")):
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.endswith("\n"):
                    break  # the writer died mid-line
                out.append(json.loads(line))
    out.sort(key=lambda r: r["t"])
    return out
