"""What the extension injected into a job, kept in the job's run directory.

``RUN_DIR/faultlab-actions/faults.jsonl`` is an append-only journal, one JSON object a line:

- ``{"event": "injecting", "id", "type", "target", "t", "reversible", "by_pid"}`` — written
  *before* the fault is injected, so that a ``chaos`` process killed half-way still leaves a
  trace a later rollback can act on;
- ``{"event": "injected", "id", "type", "target", "injected_t", "reversible", "details"}`` —
  after it, with what ``Fault.inject`` returned (pids, signal) or ``details.error``;
- ``{"event": "undone", "id", "undone_t", "details"}`` — after a rollback.

A reversible fault is *active* from its ``injecting`` line until its ``undone`` line. Since the
journal lives beside the job, not in the ``chaos`` process, a rollback run by another process
(the staging case: ``chaos run`` again, with only the run directory in hand) still finds every
stopped pid. Appends are serialized with ``flock`` (several activities may run in background).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ActionLog", "InjectionState", "STATE_DIR"]

STATE_DIR = "faultlab-actions"
_JOURNAL = "faults.jsonl"


@dataclass(slots=True)
class InjectionState:
    """One fault as the journal tells it (the last word on each id wins)."""

    id: str
    type: str
    target: str
    reversible: bool
    injected_t: float | None = None
    """None while only the ``injecting`` line exists (the injection never finished)."""
    details: dict[str, Any] = field(default_factory=dict)
    undone_t: float | None = None

    @property
    def failed(self) -> bool:
        return bool(self.details.get("error"))

    @property
    def active(self) -> bool:
        """A reversible fault that may still be in effect."""
        return self.reversible and self.undone_t is None and not self.failed


class ActionLog:
    """The fault journal of one run directory."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(run_dir) / STATE_DIR
        self.path = self.dir / _JOURNAL

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _append(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, default=str, sort_keys=True) + "\n").encode()
        with open(self.path, "a+b") as f:
            if f.seek(0, os.SEEK_END) > 0:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":  # a writer killed mid-line: never glue onto its torn end
                    line = b"\n" + line
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def records(self) -> list[dict[str, Any]]:
        """Every journal line; a torn or garbled line (a killed writer) is skipped."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        out = []
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("id"), str):
                out.append(record)
        return out

    def begin(self, fault_type: str, target: str, reversible: bool, t: float) -> str:
        """Journal an injection about to happen; return its new id (``<type>-<n>``)."""
        with self._locked():
            n = sum(1 for r in self.records() if r.get("event") == "injecting") + 1
            fid = f"{fault_type}-{n}"
            self._append({"event": "injecting", "id": fid, "type": fault_type,
                          "target": target, "t": t, "reversible": reversible,
                          "by_pid": os.getpid()})
        return fid

    def injected(self, fid: str, fault_type: str, target: str, reversible: bool,
                 injected_t: float, details: dict[str, Any]) -> None:
        with self._locked():
            self._append({"event": "injected", "id": fid, "type": fault_type, "target": target,
                          "injected_t": injected_t, "reversible": reversible,
                          "details": details})

    def undone(self, fid: str, undone_t: float, details: dict[str, Any]) -> None:
        with self._locked():
            self._append({"event": "undone", "id": fid, "undone_t": undone_t,
                          "details": details})

    def faults(self) -> list[InjectionState]:
        """Every fault of the journal, in injection order."""
        by_id: dict[str, InjectionState] = {}
        for r in self.records():
            event, fid = r.get("event"), r["id"]
            if event == "injecting":
                by_id[fid] = InjectionState(id=fid, type=str(r.get("type")),
                                            target=str(r.get("target")),
                                            reversible=bool(r.get("reversible")))
            elif fid in by_id and event == "injected":
                state = by_id[fid]
                state.injected_t = r.get("injected_t")
                state.details = dict(r.get("details") or {})
            elif fid in by_id and event == "undone":
                by_id[fid].undone_t = r.get("undone_t")
        return list(by_id.values())

    def active(self) -> list[InjectionState]:
        return [f for f in self.faults() if f.active]

    def last_injected(self) -> InjectionState | None:
        """The most recent fault that was injected without error."""
        done = [f for f in self.faults() if f.injected_t is not None and not f.failed]
        return max(done, key=lambda f: f.injected_t or 0.0, default=None)
