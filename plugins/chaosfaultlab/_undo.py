"""Undoing reversible faults: what the ``undo_faults`` rollback (and a fault's ``duration_s``
timer) do for each journaled fault that is still active.

This module owns the faults this ``chaos`` process injected and can still undo with the very
object that injected them (kept by ``chaosfaultlab._inject``), and, for a fault injected by
another process, the undoing from the journal alone (``chaosfaultlab._state``): a runtime
fault by its fault id, a process fault by continuing the stopped pids that still belong to the
job. Every undo is journaled, and one lock keeps a rollback and a timer from undoing a fault
twice.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from signal import SIGCONT

from chaosfaultlab import _jobs
from chaosfaultlab._state import ActionLog, InjectionState
from faultlab.errors import FaultError, FaultlabError
from faultlab.faults import Fault, fault_types
from faultlab.faults.runtime_base import RuntimeFault
from faultlab.targets.base import JobContext

__all__ = ["remember", "undo_by_id", "undo_from_journal"]


@dataclass
class _Live:
    fault: Fault
    ctx: JobContext


# Reversible faults injected by this process, with the object that knows how to undo them.
_LIVE: dict[tuple[Path, str], _Live] = {}
_UNDO_LOCK = threading.RLock()


def remember(run_dir: Path, fid: str, fault: Fault, ctx: JobContext) -> None:
    """Keep a reversible fault this process injected, to undo it with its own object."""
    with _UNDO_LOCK:
        _LIVE[(run_dir, fid)] = _Live(fault, ctx)


def undo_by_id(run_dir: Path, fid: str) -> dict | None:
    """Undo one journaled fault if it is still active; None if it was not."""
    log = ActionLog(run_dir)
    with _UNDO_LOCK:
        state = next((f for f in log.active() if f.id == fid), None)
        if state is None:
            return None
        live = _LIVE.pop((run_dir, fid), None)
        try:
            details = live.fault.undo(live.ctx) if live else undo_from_journal(run_dir, state)
        except FaultlabError as e:
            details = {"undo_error": str(e)}
        log.undone(fid, time.time(), details)
        return details


def undo_from_journal(run_dir: Path, state: InjectionState) -> dict:
    """Undo a fault injected by another process: only what the journal says can be undone."""
    cls = fault_types().get(state.type)
    if cls is not None and issubclass(cls, RuntimeFault):  # the agents undo by the fault's id
        ctx = _jobs.job_context(run_dir)
        fault_id, ranks = state.details.get("fault_id"), state.details.get("ranks")
        if not isinstance(fault_id, str) or not isinstance(ranks, list):
            raise FaultError(f"{state.id} ({state.type}): the journal lacks its fault id or "
                             f"ranks (the injector died mid-way); restart the job to clear it")
        fault = cls(cls.Params())
        fault.fault_id, fault._sent = fault_id, [int(r) for r in ranks]
        return fault.undo(ctx)
    if cls is None or cls.family != "process":
        raise FaultError(f"{state.id} ({state.type}) was injected by another process and "
                         f"only that process could undo it; restart the job to clear it")
    ctx = _jobs.job_context(run_dir)
    pids = state.details.get("pids")
    if not isinstance(pids, list):  # the injector died before journaling its pids
        ctx.continue_all()
        return {"continued": "every process of the job"}
    owned = ctx.pids()
    continued = []
    for pid in pids:
        if pid in owned:  # never signal a pid that has since left the job (or was reused)
            try:
                os.kill(pid, SIGCONT)
                continued.append(pid)
            except ProcessLookupError:
                pass
    return {"continued": continued}
