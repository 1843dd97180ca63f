"""The agent each rank runs: plan, fire-once bookkeeping, events, live control.

A trainer sees four calls (``attach``, ``step``, ``loss``, ``close``), and a fifth if it
writes its own step records (level 2): ``step_done(n)`` right after its record of step ``n``,
where a fault injected from outside at step ``n`` meets it (the step gate,
``faultlab.runtime.gates``). Behind them the agent

- reads its identity and its plan from the environment faultlab gives the job;
- loads each entry's rank-side action (``faultlab.runtime.hooks``: the entry names it by
  import path, and its module is imported only then), arms the at-step actions at their steps
  and activates the window actions over their step windows (publishing those that act on
  collectives to the interposer), and calls each on the hooks it uses;
- makes every at-step action strike at most once per (fault id, rank, step) for the whole job:
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
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from faultlab.runtime import interposer
from faultlab.runtime.control import ControlServer
from faultlab.runtime.gates import StepGates
from faultlab.runtime.hooks import ActionError, RankAction, load_action, uses
from faultlab.runtime.identity import Identity
from faultlab.runtime.plan import FaultEntry, PlanError, parse_entry
from faultlab.runtime.records import EventFile, FiredMarkers
from faultlab.runtime.uplink import RelayDown, uplink_for
from faultlab.runtime.watch import model_hooks

__all__ = ["Agent", "Emit", "Identity", "NullAgent"]

Emit = Callable[..., None]


class _Handle:
    """What one action sees of its rank (``faultlab.runtime.hooks.Rank``)."""

    def __init__(self, agent: Agent, entry: FaultEntry, source: str) -> None:
        self._agent, self.entry, self.source = agent, entry, source
        self.rank = agent.rank
        self.live = source == "live"
        self.action: RankAction | None = None

    @property
    def step(self) -> int:
        return self._agent.current_step

    @property
    def model(self) -> Any:
        return self._agent.model

    @property
    def optimizer(self) -> Any:
        return self._agent.optimizer

    @property
    def device(self) -> int | None:
        local = os.environ.get("LOCAL_RANK")
        return int(local) if local and local.isdigit() else None

    @property
    def node(self) -> str:
        return self._agent.ident.node

    def record(self, kind: str, **fields: Any) -> None:
        self._agent._emit(kind, **{"fault_id": self.entry.id, "type": self.entry.type,
                                   "step": self._agent.current_step, "rank": self.rank,
                                   **fields})

    def mark_node(self) -> None:
        self._agent._fired.mark(self.entry.id, f"node-{self.node}", shared=True)

    def node_marked(self) -> bool:
        return self._agent._fired.seen(self.entry.id, f"node-{self.node}", shared=True)

    def claim(self, key: str) -> bool:
        fired = self._agent._fired
        if fired.seen(self.entry.id, key):
            return False
        fired.mark(self.entry.id, key)
        return True

    def struck(self, **details: Any) -> None:
        action = self.action
        if action is not None:
            action.num_struck += 1
            if action.num_struck > 1:
                return
        if action is not None and action.strikes == "window":
            if action.once_per_job and not self.live:
                self._agent.mark_once(self.entry)
            self._agent.injected(self.entry, **details)
        else:
            self._agent._struck(self.entry, self.source, **details)

    def failed(self, error: str) -> None:
        self._agent._failed(self.entry, error)


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
        self._at_step: list[tuple[FaultEntry, str]] = []  # (entry, source), source plan|live
        self._pending: list[FaultEntry] = []  # live at-step entries without steps: next step
        self._windows: dict[str, tuple[FaultEntry, bool]] = {}  # id -> (entry, live)
        self._active: dict[str, RankAction] = {}  # the window actions active now
        self._window_hooks: dict[str, list[Any]] = {}  # their torch hooks' handles
        self._retired: set[str] = set()
        self._armed: list[tuple[RankAction, list[Any]]] = []  # this step's: (action, handles)
        self._loss_armed: list[RankAction] = []
        self._busy = False
        for entry in plan or []:
            if entry.applies_to(self.rank):
                self._add(entry, live=False)
        with self._lock:
            self._refresh_windows(0)
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
            self._disarm_all()
            for entry in self._pending:
                self._at_step.append((entry.at_step(n), "live"))
            self._pending = []
            for entry, source in self._at_step:
                if entry.id not in self._retired and entry.in_window(n) \
                        and not self._fired.seen(entry.id, f"step{n}"):
                    self._arm(entry, source, n)
            self._refresh_windows(n)
            for action in list(self._active.values()):
                if uses(type(action), "on_step_start"):
                    self._call_step_start(action, n)
            self._update_busy()

    def loss(self, loss: Any) -> Any:
        if not self._loss_armed:
            return loss
        for action in list(self._loss_armed):
            loss = action.on_loss(loss)
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
                    "active": [a.summary() for a in self._active.values()],
                    "armed": [a.entry.id for a, _ in self._armed],
                    "numeric": [{**e.to_json(), "source": s} for e, s in self._at_step] +
                               [{**e.to_json(), "source": "live", "at": "next step"}
                                for e in self._pending],
                    "counts": interposer.counts(),
                    "fired": sorted(f"{fid}@{when}" for fid, when in self._fired.mine)}

    closed = False
    """``close`` ran: the agent keeps no step any more (``faultlab.runtime.gpu`` then counts
    forwards)."""

    def close(self) -> None:
        self.closed = True
        atexit.unregister(self.close)
        if self._server is not None:
            self._server.close()
            self._server = None
        with self._lock:
            for fid in list(self._active):
                self._deactivate(fid, "close")
            self._disarm_all()
            self._busy = False
            interposer.set_faults(())
        if self._events is not None:
            self._events.close()

    # --- what window actions report --------------------------------------------------------

    def injected(self, entry: FaultEntry, **details: Any) -> None:
        self._emit("fault_injected", fault_id=entry.id, type=entry.type, step=self._step,
                   rank=self.rank, source=self._source(entry), **details)

    def mark_once(self, entry: FaultEntry) -> None:
        self._fired.mark(entry.id, "once")

    # --- internals -------------------------------------------------------------------------

    def _source(self, entry: FaultEntry) -> str:
        held = self._windows.get(entry.id)
        if held is not None:
            return "live" if held[1] else "plan"
        return next((s for e, s in self._at_step if e.id == entry.id), "live")

    def _add(self, entry: FaultEntry, *, live: bool) -> None:
        """Load the entry's action (its module is imported now) and schedule it; PlanError if
        it cannot be loaded, or if a planned at-step action has no step filter."""
        cls = load_action(entry.action)
        if cls.strikes == "window":
            self._windows[entry.id] = (entry, live)
        elif live and entry.steps is None and entry.from_step is None:
            self._pending.append(entry)
        elif not live and entry.steps is None and entry.from_step is None:
            raise PlanError(f"fault {entry.id!r}: a planned {entry.type} needs 'steps' or "
                            f"'from_step' (without them it would strike at every step)")
        else:
            self._at_step.append((entry, "live" if live else "plan"))
        self._busy = True

    def _update_busy(self) -> None:
        self._busy = bool(self._at_step or self._pending or self._windows or self._armed
                          or self._loss_armed)

    def _struck(self, entry: FaultEntry, source: str, **details: Any) -> None:
        self._fired.mark(entry.id, f"step{self._step}")
        self._emit("fault_injected", fault_id=entry.id, type=entry.type, step=self._step,
                   rank=self.rank, source=source, **details)

    def _failed(self, entry: FaultEntry, error: str) -> None:
        self._emit("fault_failed", fault_id=entry.id, type=entry.type, step=self._step,
                   rank=self.rank, error=error)

    def _disarm_all(self) -> None:
        # Never called from inside a grad hook: FSDP2 iterates the hook dict while calling them.
        for _, handles in self._armed:
            for h in handles:
                h.remove()
        self._armed, self._loss_armed = [], []

    def _call_step_start(self, action: RankAction, n: int) -> bool:
        try:
            action.on_step_start(n)
        except ActionError as e:
            self._failed(action.entry, str(e))
            return False
        return True

    def _arm(self, entry: FaultEntry, source: str, n: int) -> None:
        """Arm an at-step action for step ``n``: a fresh instance, its hooks for this step."""
        cls = load_action(entry.action)
        if cls.needs_model and self.model is None:
            self._failed(entry, f"{entry.type} needs the model: pass it to attach()")
            return
        handle = _Handle(self, entry, source)
        action = handle.action = cls(entry, handle)
        if uses(cls, "on_step_start") and not self._call_step_start(action, n):
            return
        try:
            handles = self._hooks(action)
        except ActionError as e:
            self._failed(entry, str(e))
            return
        self._armed.append((action, handles))
        if uses(cls, "on_loss"):
            self._loss_armed.append(action)

    def _hooks(self, action: RankAction) -> list[Any]:
        """Register ``action``'s torch hooks (model and optimizer); their handles."""
        handles = model_hooks(action)
        if uses(type(action), "before_optimizer_step"):
            handles.append(self._optimizer_step_hook(action))
        if uses(type(action), "after_optimizer_step"):
            handles.append(self._optimizer_post_hook(action))
        return handles

    def _optimizer_post_hook(self, action: RankAction) -> Any:
        """Call ``action.after_optimizer_step`` right after each step of the attached optimizer
        (:meth:`_step_optimizer`), or where none is known of every optimizer
        :meth:`_hooked_optimizer` accepts (torch's global post-hook)."""
        def hook(optimizer: Any, args: Any, kwargs: Any) -> None:
            if self._hooked_optimizer(optimizer):
                action.after_optimizer_step(optimizer)

        optimizer = self._step_optimizer()
        if optimizer is not None:
            return optimizer.register_step_post_hook(hook)
        from torch.optim.optimizer import register_optimizer_step_post_hook

        return register_optimizer_step_post_hook(hook)

    def _step_optimizer(self) -> Any:
        """The optimizer whose steps the post-step hooks meet; None: every optimizer's."""
        return self.optimizer

    def _optimizer_step_hook(self, action: RankAction) -> Any:
        """Call ``action.before_optimizer_step`` right before this step's optimizer step: a
        pre-hook on the optimizer given to ``attach``, or, where none was given (level 0, an
        ``attach(model, None)``), torch's global optimizer-step pre-hook, which only the
        optimizer steps :meth:`_hooked_optimizer` accepts reach. Either is registered for the
        armed step only (its handle is removed with the step's other hooks), so no step
        without such an action pays a call."""
        def hook(optimizer: Any, args: Any, kwargs: Any) -> None:
            action.before_optimizer_step(optimizer)

        if self.optimizer is not None:
            return self.optimizer.register_step_pre_hook(hook)
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        def global_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
            if self._hooked_optimizer(optimizer):
                action.before_optimizer_step(optimizer)

        return register_optimizer_step_pre_hook(global_hook)

    def _hooked_optimizer(self, optimizer: Any) -> bool:
        """Does a step of ``optimizer`` meet the armed ``before_optimizer_step`` actions when no
        optimizer was attached? Here every optimizer's; level 0 keeps the primary one's."""
        return True

    def _refresh_windows(self, n: int) -> None:
        """Activate the window actions whose window holds at step ``n``; end the others."""
        for fid, (entry, live) in self._windows.items():
            cls = load_action(entry.action)
            want = (fid not in self._retired and entry.in_window(n) and not (
                not live and cls.once_per_job and self._fired.elsewhere(fid, "once")))
            if want and fid not in self._active:
                self._activate(entry, live)
            elif not want and fid in self._active:
                if cls.once_per_job and self._active[fid].num_struck:
                    self._retired.add(fid)  # struck once; a replayed window must not re-strike
                self._deactivate(fid, "window_ended")
        interposer.set_faults([a for a in self._active.values()
                               if uses(type(a), "before_collective")])

    def _activate(self, entry: FaultEntry, live: bool) -> None:
        """A window action's instance and its torch hooks; an action that cannot strike here
        is retired with ``fault_failed``."""
        cls = load_action(entry.action)
        handle = _Handle(self, entry, "live" if live else "plan")
        try:
            if cls.needs_model and self.model is None:
                raise ActionError(f"{entry.type} needs the model: pass it to attach()")
            action = handle.action = cls(entry, handle)
            self._window_hooks[entry.id] = self._hooks(action)
        except ActionError as e:
            self._retired.add(entry.id)
            self._failed(entry, str(e))
            return
        self._active[entry.id] = action

    def _deactivate(self, fid: str, reason: str) -> None:
        action = self._active.pop(fid)
        for h in self._window_hooks.pop(fid, ()):
            h.remove()
        summary = action.release()
        if action.num_struck:
            self._emit("fault_undone", fault_id=fid, type=action.entry.type, step=self._step,
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
            live_ids = {e.id for e in self._pending} | {e.id for e, src in self._at_step
                                                         if src == "live"}
            if entry.id in self._active or entry.id in live_ids:
                return {"ok": True, "id": entry.id, "applies": True, "already": True}
            try:
                self._add(entry, live=True)
            except PlanError as e:
                return {"ok": False, "error": str(e)}
            self._retired.discard(entry.id)
            if entry.id in self._windows:
                self._refresh_windows(self._step)
                when = "now" if entry.id in self._active else "in its step window"
            else:
                when = "next step" if entry in self._pending else f"steps {entry.steps}"
        return {"ok": True, "id": entry.id, "applies": True, "applies_at": when,
                "step": self._step}

    def _undo(self, fid: Any) -> dict[str, Any]:
        if not isinstance(fid, str):
            return {"ok": False, "error": f"undo needs a fault 'id' string, got {fid!r}"}
        with self._lock:
            known = fid in self._windows or any(e.id == fid for e, _ in self._at_step) \
                or any(e.id == fid for e in self._pending)
            self._retired.add(fid)
            self._pending = [e for e in self._pending if e.id != fid]
            self._loss_armed = [a for a in self._loss_armed if a.entry.id != fid]
            for action, _ in self._armed:
                if action.entry.id == fid:
                    # its hooks stay registered (FSDP2 may be iterating them) but do nothing
                    action.release()
            if fid in self._active:
                self._deactivate(fid, "undo")
            held = self._windows.get(fid)
            if held is not None and held[1]:
                del self._windows[fid]  # a live fault is gone; a plan's stays retired
            self._at_step = [(e, s) for e, s in self._at_step if e.id != fid or s == "plan"]
            interposer.set_faults([a for a in self._active.values()
                                   if uses(type(a), "before_collective")])
            self._update_busy()
        return {"ok": True, "id": fid, "undone": known}

