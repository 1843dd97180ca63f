"""The agent each rank runs: plan, fire-once bookkeeping, events, live control.

A trainer sees four calls (``attach``, ``step``, ``loss``, ``close``), and a fifth if it
writes its own step records (level 2): ``step_done(n)`` right after its record of step ``n``,
where a fault injected from outside at step ``n`` meets it (the step gate,
``faultlab.runtime.gates``). Behind them the agent

- reads its identity and its plan from the environment faultlab gives the job;
- arms the plan's numeric faults at the planned steps and activates its collective faults over
  their step windows (publishing them to the interposer);
- makes every numeric fault strike at most once per (fault id, rank, step) for the whole job:
  an in-memory set for in-process rollbacks, a marker file under ``RUN_DIR/runtime/fired/``
  for restarted processes — otherwise a rollback that replays step 5 meets the NaN of step 5
  again, forever;
- echoes every strike as a ``fault_injected`` event and every undo as ``fault_undone``, through
  the trainer's emitter or, without one, its own ``*-runtime.jsonl`` file in ``RUN_DIR/events``;
- serves the live control channel (``control.py``) when the run has a secret.

Everything is thread-safe against the control thread; the per-step cost with nothing planned is
one attribute check.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import threading
from collections.abc import Callable
from typing import Any

from faultlab.runtime import interposer
from faultlab.runtime.collective import CollectiveFault, make_collective_fault
from faultlab.runtime.control import ControlServer
from faultlab.runtime.gates import StepGates
from faultlab.runtime.identity import Identity
from faultlab.runtime.plan import FaultEntry, PlanError, parse_entry
from faultlab.runtime.records import EventFile, FiredMarkers
from faultlab.runtime.uplink import RelayDown, uplink_for

__all__ = ["Agent", "Emit", "Identity", "NullAgent"]

Emit = Callable[..., None]
_ONCE_TYPES = ("collective_hang", "collective_error", "collective_partition")


class NullAgent:
    """What ``attach`` returns outside faultlab: every call does nothing."""

    enabled = False

    def step(self, n: int) -> None:
        return None

    def loss(self, loss: Any) -> Any:
        return loss

    def step_done(self, n: int, beat: Callable[[], None] | None = None) -> float:
        return 0.0

    def status(self) -> dict[str, Any]:
        return {"enabled": False}

    def close(self) -> None:
        return None


class Agent(NullAgent):
    """The runtime agent of one rank process (see the module docstring)."""

    enabled = True

    def __init__(self, ident: Identity, *, model: Any = None, optimizer: Any = None,
                 emit: Emit | None = None, plan: list[FaultEntry] | None = None,
                 secret: str | None = None, host: str = "127.0.0.1",
                 gates: StepGates | None = None) -> None:
        self.ident, self.rank = ident, ident.rank
        self.gates = gates or StepGates(ident.run_dir, ())
        self.model, self.optimizer = model, optimizer
        self._events = None if emit is not None else EventFile(ident)
        self._emit: Emit = emit if emit is not None else self._events.emit  # type: ignore[union-attr]
        self._fired = FiredMarkers(ident.run_dir / "runtime" / "fired", ident.rank)
        self._lock = threading.RLock()
        self._step = 0
        self._numeric: list[tuple[FaultEntry, str]] = []  # (entry, source), source plan|live
        self._pending: list[FaultEntry] = []  # live numeric entries without steps: next step
        self._coll_entries: dict[str, tuple[FaultEntry, bool]] = {}  # id -> (entry, live)
        self._coll: dict[str, CollectiveFault] = {}  # the active ones
        self._retired: set[str] = set()
        self._grad: list[Any] = []  # GradCorruption armed for the current step
        self._loss_armed: list[FaultEntry] = []
        self._busy = False
        for entry in plan or []:
            if entry.applies_to(self.rank):
                self._add(entry, live=False)
        with self._lock:
            self._refresh_collective(0)
        self._server: ControlServer | None = None
        if secret:
            self._server = ControlServer(
                host=host, secret=secret, handler=self._handle,
                info_path=ident.run_dir / "runtime" / f"rank{ident.rank}.json",
                info={"rank": ident.rank, "restart": ident.restart})
            uplink = uplink_for(ident.run_dir)
            if uplink is not None:  # live faults then come through the node's relay
                with contextlib.suppress(RelayDown):
                    uplink.register_control(self._server.host, self._server.port)
        atexit.register(self.close)

    # --- the trainer's calls --------------------------------------------------------------

    @property
    def current_step(self) -> int:
        return self._step

    def step(self, n: int) -> None:
        self._step = n
        if not self._busy:
            return
        with self._lock:
            for g in self._grad:
                g.remove()
            self._grad, self._loss_armed = [], []
            for entry in self._pending:
                self._numeric.append((entry.at_step(n), "live"))
            self._pending = []
            for entry, source in self._numeric:
                if entry.id not in self._retired and entry.in_window(n) \
                        and not self._fired.seen(entry.id, f"step{n}"):
                    self._arm(entry, source, n)
            self._refresh_collective(n)
            self._update_busy()

    def loss(self, loss: Any) -> Any:
        if not self._loss_armed:
            return loss
        for entry in list(self._loss_armed):
            loss = loss * entry.params["scale"]
            if not self._fired.seen(entry.id, f"step{self._step}"):
                self._struck(entry, self._source(entry), scale=entry.params["scale"])
        return loss

    def step_done(self, n: int, beat: Callable[[], None] | None = None) -> float:
        """Step ``n`` is complete and its record written: if the engine injects a fault from
        outside at step ``n`` (a kill, a preemption, a rotten checkpoint), wait here until it
        has, so that the fault lands after step ``n`` and before step ``n + 1``, however fast
        or loaded the job is. Call it before the step's checkpoint, as the level-0 hook (after
        the optimizer step) does. ``beat`` is called every half second while waiting (the
        trainer's watchdog). Returns the seconds waited; 0.0 where no gate is set. A gate not
        opened within its timeout (faultlab died) is passed with one line on stderr."""
        waited = self.gates.wait(n, beat)
        if waited is None:
            return 0.0
        if not waited[1]:
            print(f"faultlab runtime: rank {self.rank}: step gate {n} not opened within "
                  f"{self.gates.timeout_s:g} s; going on", file=sys.stderr, flush=True)
        return waited[0]

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {"enabled": True, "rank": self.rank, "pid": self.ident.pid,
                    "restart": self.ident.restart, "step": self._step,
                    "active": [f.summary() for f in self._coll.values()],
                    "armed": [g.entry.id for g in self._grad] +
                             [e.id for e in self._loss_armed],
                    "numeric": [{**e.to_json(), "source": s} for e, s in self._numeric] +
                               [{**e.to_json(), "source": "live", "at": "next step"}
                                for e in self._pending],
                    "counts": interposer.counts(),
                    "fired": sorted(f"{fid}@{when}" for fid, when in self._fired.mine)}

    def close(self) -> None:
        atexit.unregister(self.close)
        if self._server is not None:
            self._server.close()
            self._server = None
        with self._lock:
            for fid in list(self._coll):
                self._deactivate(fid, "close")
            for g in self._grad:
                g.remove()
            self._grad, self._loss_armed, self._busy = [], [], False
            interposer.set_faults(())
        if self._events is not None:
            self._events.close()

    # --- Host (for collective faults) ------------------------------------------------------

    def injected(self, entry: FaultEntry, **details: Any) -> None:
        self._emit("fault_injected", fault_id=entry.id, type=entry.type, step=self._step,
                   rank=self.rank, source=self._source(entry), **details)

    def mark_once(self, entry: FaultEntry) -> None:
        self._fired.mark(entry.id, "once")

    # --- internals -------------------------------------------------------------------------

    def _source(self, entry: FaultEntry) -> str:
        held = self._coll_entries.get(entry.id)
        if held is not None:
            return "live" if held[1] else "plan"
        return next((s for e, s in self._numeric if e.id == entry.id), "live")

    def _add(self, entry: FaultEntry, *, live: bool) -> None:
        if entry.family == "collective":
            self._coll_entries[entry.id] = (entry, live)
        elif live and entry.steps is None and entry.from_step is None:
            self._pending.append(entry)
        else:
            self._numeric.append((entry, "live" if live else "plan"))
        self._busy = True

    def _update_busy(self) -> None:
        self._busy = bool(self._numeric or self._pending or self._coll_entries or self._grad
                          or self._loss_armed)

    def _struck(self, entry: FaultEntry, source: str, **details: Any) -> None:
        self._fired.mark(entry.id, f"step{self._step}")
        self._emit("fault_injected", fault_id=entry.id, type=entry.type, step=self._step,
                   rank=self.rank, source=source, **details)

    def _failed(self, entry: FaultEntry, error: str) -> None:
        self._emit("fault_failed", fault_id=entry.id, type=entry.type, step=self._step,
                   rank=self.rank, error=error)

    def _arm(self, entry: FaultEntry, source: str, n: int) -> None:
        if entry.type == "loss_spike":
            self._loss_armed.append(entry)
            return
        if self.model is None:
            self._failed(entry, f"{entry.type} needs the model: pass it to attach()")
            return
        from faultlab.runtime import numeric

        try:
            if entry.type == "weight_bitflip":
                self._struck(entry, source, flips=numeric.flip_bits(self.model, entry,
                                                                     self.rank, n))
            else:
                g = numeric.GradCorruption(
                    self.model, entry, lambda details: self._struck(entry, source, **details))
                self._grad.append(g)
        except numeric.NoParameterError as e:
            self._failed(entry, str(e))

    def _refresh_collective(self, n: int) -> None:
        """Activate the collective faults whose window holds at step ``n``; end the others."""
        for fid, (entry, live) in self._coll_entries.items():
            want = (fid not in self._retired and entry.in_window(n) and not (
                not live and entry.type in _ONCE_TYPES and self._fired.elsewhere(fid, "once")))
            if want and fid not in self._coll:
                self._coll[fid] = make_collective_fault(entry, self, live=live)
            elif not want and fid in self._coll:
                if entry.type in _ONCE_TYPES and self._coll[fid].num_struck:
                    self._retired.add(fid)  # struck once; a replayed window must not re-strike
                self._deactivate(fid, "window_ended")
        interposer.set_faults(list(self._coll.values()))

    def _deactivate(self, fid: str, reason: str) -> None:
        fault = self._coll.pop(fid)
        summary = fault.release()
        if fault.num_struck:
            self._emit("fault_undone", fault_id=fid, type=fault.entry.type, step=self._step,
                       rank=self.rank, reason=reason, **{k: v for k, v in summary.items()
                                                        if k not in ("id", "type")})

    # --- the control channel ---------------------------------------------------------------

    def _handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "ping":
            return {"ok": True, "rank": self.rank, "pid": self.ident.pid,
                    "restart": self.ident.restart, "step": self._step}
        if op == "status":
            return {"ok": True, **self.status()}
        if op == "inject":
            return self._inject(request.get("fault"))
        if op == "undo":
            return self._undo(request.get("id"))
        return {"ok": False, "error": f"unknown op {op!r}; valid: ping, inject, undo, status"}

    def _inject(self, raw: Any) -> dict[str, Any]:
        try:
            entry = parse_entry(raw, "inject.fault", live=True)
        except PlanError as e:
            return {"ok": False, "error": str(e)}
        if not entry.applies_to(self.rank):
            return {"ok": True, "id": entry.id, "applies": False,
                    "note": f"fault targets ranks {list(entry.ranks or [])}, this is rank "
                            f"{self.rank}"}
        with self._lock:
            live_ids = {e.id for e in self._pending} | {e.id for e, src in self._numeric
                                                         if src == "live"}
            if entry.id in self._coll or entry.id in live_ids:
                return {"ok": True, "id": entry.id, "applies": True, "already": True}
            self._retired.discard(entry.id)
            self._add(entry, live=True)
            if entry.family == "collective":
                self._refresh_collective(self._step)
                when = "now" if entry.id in self._coll else "in its step window"
            else:
                when = "next step" if entry in self._pending else f"steps {entry.steps}"
        return {"ok": True, "id": entry.id, "applies": True, "applies_at": when,
                "step": self._step}

    def _undo(self, fid: Any) -> dict[str, Any]:
        if not isinstance(fid, str):
            return {"ok": False, "error": f"undo needs a fault 'id' string, got {fid!r}"}
        with self._lock:
            known = fid in self._coll_entries or any(e.id == fid for e, _ in self._numeric) \
                or any(e.id == fid for e in self._pending)
            self._retired.add(fid)
            self._pending = [e for e in self._pending if e.id != fid]
            self._loss_armed = [e for e in self._loss_armed if e.id != fid]
            for g in self._grad:
                if g.entry.id == fid:
                    g.cancelled = True
            if fid in self._coll:
                self._deactivate(fid, "undo")
            held = self._coll_entries.get(fid)
            if held is not None and held[1]:
                del self._coll_entries[fid]  # a live fault is gone; a plan's stays retired
            self._numeric = [(e, s) for e, s in self._numeric if e.id != fid or s == "plan"]
            interposer.set_faults(list(self._coll.values()))
            self._update_busy()
        return {"ok": True, "id": fid, "undone": known}
