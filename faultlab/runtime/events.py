"""The event protocol (integration level 2): the public emitter a trainer writes events with.

One append-only JSON-lines file per process under ``RUN_DIR/events/`` (``FAULTLAB_RUN_DIR``),
flushed per line, so a reader tailing the directory sees every record the moment the rank wrote
it and a SIGKILL loses at most the line being written. Under faultlab's engine
(``FAULTLAB_CHANNEL`` set) the same records go instead to the node's relay over a node-local
socket (``faultlab.runtime.uplink``; the relay is ``faultlab.runtime.relay``), which writes one
file per node and pushes it to the engine: no rank touches the shared filesystem for its events.
If the relay cannot be reached, the emitter falls back to its own file, so no record is lost.

Every record carries ``t`` (wall clock, seconds), ``kind``, ``rank``, ``world_size``, ``pid``,
``restart`` (``TORCHELASTIC_RESTART_COUNT``) and ``node`` (``FAULTLAB_NODE``)::

    from faultlab.runtime.events import EventLog

    events = EventLog.from_env()          # None outside faultlab (no FAULTLAB_RUN_DIR)
    events.emit("start", resumed_from_step=0)
    events.emit("step", step=1, loss=2.31, samples=[0, 12], step_time_s=0.41)

``RECORD_KINDS`` lists the kinds faultlab reads and their fields; the reference trainer writes
every one of them through this module, as any trainer would. Levels 0 and 1 (the runtime agent
bootstrapped into an unchanged trainer, or ``faultlab.runtime.attach``) write the same records,
so everything downstream has one code path.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from faultlab.runtime.identity import Identity
from faultlab.runtime.site import site
from faultlab.runtime.uplink import RelayDown, uplink_for

__all__ = ["RECORD_KINDS", "EventLog", "read_events"]

RECORD_KINDS: dict[str, str] = {
    "start": "a rank process began training: resumed_from_step (0 from scratch); optional "
             "t_main, t_pg_ready, t_ready for the start-up breakdown; rank 0's carries site "
             "(faultlab.runtime.site: accelerator and count, driver, torch, CUDA, NCCL, world "
             "size), added by EventLog",
    "step": "a step completed: step, loss, grad_norm, samples ([start, stop) of the global "
            "batch), local_samples, step_time_s, skipped",
    "checkpoint_saved": "a checkpoint is committed: step, path, seconds, stall_s, bytes, async, "
                        "emergency",
    "checkpoint_loaded": "a checkpoint was loaded: step, path, fell_back_from (newer ones found "
                         "invalid)",
    "checkpoint_load_failed": "a load raised (written by level 0's wrappers: the trainer reached "
                              "its load and it failed, e.g. on a torn file): path, error",
    "anomaly": "the trainer noticed something: what (nonfinite, straggler, ...), step, action",
    "preemption_notice": "a spot/preemption notice: provider, deadline, step",
    "fault_injected": "the runtime agent struck (written by faultlab's agent): fault, step",
    "fault_struck": "a silent fault (sdc) struck in one step, one record per fault, rank and "
                    "step (written by faultlab's agent): fault_id, type, step, surface, op, "
                    "num_elements, changed, magnitude, where",
    "final_digest": "rank 0, at the end: digest (SHA-256 over every tensor's hash of the full "
                    "model and optimizer state) and tensors",
    "exit": "the process is leaving: reason (completed, stopped, error, ...), code, step",
}
"""Every record kind faultlab reads, with its fields (besides the common ones)."""


class EventLog:
    """One process's event file. ``emit`` is thread-safe (a watchdog or an async-checkpoint
    commit may emit from another thread); the file is opened on the first record."""

    def __init__(self, events_dir: Path, *, rank: int, world_size: int, node: str,
                 restart: int, suffix: str = "") -> None:
        self.base = {"rank": rank, "world_size": world_size, "pid": os.getpid(),
                     "restart": restart, "node": node}
        self._world_size = world_size
        self.path = Path(events_dir) / (
            f"{node}-rank{rank}-restart{restart}-pid{os.getpid()}{suffix}.jsonl")
        self._file: Any = None
        self._lock = threading.Lock()
        self._uplink = uplink_for(Path(events_dir).parent) \
            if Path(events_dir).name == "events" else None

    @classmethod
    def from_env(cls, suffix: str = "") -> EventLog | None:
        """The emitter of this rank from the environment faultlab and torchrun set; None when
        faultlab did not launch the process (no ``FAULTLAB_RUN_DIR``)."""
        if not os.environ.get("FAULTLAB_RUN_DIR"):
            return None
        ident = Identity.from_env(os.environ)
        return cls(ident.run_dir / "events", rank=ident.rank, world_size=ident.world_size,
                   node=ident.node, restart=ident.restart, suffix=suffix)

    def emit(self, kind: str, **fields: Any) -> None:
        if kind == "start" and self.base["rank"] == 0 and "site" not in fields:
            # where rank 0 computes, once per process: what the golden run's reference is
            # keyed and checked by (faultlab.runtime.site; /proc, no device is touched)
            fields["site"] = site(self._world_size)
        record = {"t": time.time(), "kind": kind, **self.base, **fields}
        line = json.dumps(record, separators=(",", ":"), allow_nan=True, default=str) + "\n"
        if self._uplink is not None and not self._uplink.down:
            try:
                self._uplink.emit_line(line)
                return
            except RelayDown as e:  # the record goes to this process's own file instead
                print(f"faultlab: {e}; rank {self.base['rank']} writes {self.path}",
                      file=sys.stderr, flush=True)
        with self._lock:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


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
