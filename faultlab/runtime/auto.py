"""Integration level 0: the runtime agent inside a trainer that has no line of faultlab.

faultlab starts the ranks of a user's unchanged torchrun trainer with ``faultlab/runtime/bootstrap``
first on ``PYTHONPATH``; its ``sitecustomize`` calls :func:`on_import` right after ``torch`` (and
later DCP) have been imported in a worker. From then on an :class:`Observer` follows the trainer
through torch's own global hooks and writes the standard records of the event protocol to
``RUN_DIR/events/{node}-rank{rank}-restart{restart}-pid{pid}-level0.jsonl``, so ``observe`` has
one code path for every level. Nothing here ever raises into the trainer: an error is one
``faultlab bootstrap:`` line on stderr (once per place) and the hook goes on without it.

What is observed where
----------------------
``start``
    At activation: ``level: 0``, ``resumed_from_step: null`` (a resume is known only later, from
    its ``checkpoint_loaded``), ``t_main`` (torch imported), ``t_process_created``.
``step``
    A global optimizer post-step hook (``register_optimizer_step_post_hook``). The *primary*
    optimizer is the first that steps; the others are ignored. The step number comes from the
    optimizer's state where it keeps one (Adam family: ``state[p]["step"]``; a CPU scalar read
    with one ``.item()``, the local tensor of a DTensor; on a device (fused/capturable) it is
    read once after each load and counted on from there, so there is no per-step device sync):
    ``step_source: optimizer_state``, which survives a resume. Otherwise the steps are counted
    in this process from the step of the last checkpoint loaded: ``counted``. The zero-gradient
    step ``get_state_dict`` takes to fill an empty optimizer's state is not a step: DCP's
    ``_init_optim_state`` is wrapped to say so, and the step it adds to the state is subtracted
    until a load replaces the state. ``step_time_s`` is the time since the previous step (the
    first: since the first forward). ``loss`` only at level 1 (``rt.loss``, a CPU tensor).
``checkpoint_saved`` / ``checkpoint_loaded``
    Wrappers of DCP's save, async_save and load, of ``torch.save``/``torch.load`` of
    checkpoint-sized objects, and of frameworks' own checkpoint writers (Lightning's): see
    ``faultlab.runtime.auto_checkpoints``, whose :class:`CheckpointHooks` this observer is.
``exit``
    At interpreter exit (``atexit``): ``completed`` with code 0, or ``error`` with the code given
    to ``sys.exit`` (wrapped to learn it); an uncaught exception is reported from a chained
    ``sys.excepthook`` (``error`` and its type). ``os._exit`` is wrapped too, in the rank's own
    process (not in a forked child): a trainer that leaves with ``os._exit(0)`` after a clean
    finish (the fix for torch 2.13's gloo abort at exit, finding ``abort_at_exit``) completed.
    Signals skip all of that, as they skip the reference trainer's own records.

Numeric faults, and when the agent learns the step
--------------------------------------------------
The agent (``agent.py``) is created at activation with the plan and the control channel, so
collective faults work from the first collective. Its ``model`` is a view of the primary
optimizer's parameters, named by the module of the first training forward (the root model:
the same FQNs as at level 1) or else by ``param_names``/``param_groups.{g}.params.{i}``.
``grad_nan``/``grad_inf`` strike through the agent's post-accumulate-grad hooks: FSDP2 calls them
right after the reduce-scatter, autograd right after accumulation, so the gradient is corrupt
*after* backward produced it and *before* the trainer's clipping, checks and optimizer step.
Those hooks are registered on the chosen parameters when the agent is told the step about to
run (``Agent.step(n)``), so what level 0 must get right is telling it before step ``n``'s first
backward. It does so

- in the post-step hook of step ``n - 1`` (``n`` = last primary step + 1): the steady state,
  no extra hook at all;
- before the first backward of the process and after every checkpoint load (the next step
  number may change there), through a *temporary* global forward pre-hook
  (``register_module_forward_pre_hook``): at the next forward with grad enabled it reads the
  primary optimizer's state step, tells the agent ``step + 1`` and removes itself. (A
  permanent global forward hook would cost a Python call per module per forward; a pre-step
  hook fires after backward and clipping, too late; hooks on every parameter cost a call per
  parameter per step.) Which optimizer to read before any has stepped is known because
  ``torch.optim.Optimizer.__init__`` is wrapped to note each one built (the first built).

A strike lasts one backward: when the agent's hook has struck, a callback queued on the autograd
engine (run when that backward ends) tells the agent the same step again, which removes its
hooks; a trainer that skips the step and redoes it does not meet the same NaN forever (at level
1 the trainer's own ``rt.step`` does this). ``weight_bitflip`` strikes when the step is told:
before the step's forward, on a parameter the optimizer holds. An action on the optimizer step
(``before_optimizer_step``, a team's ``optimizer_exception``) strikes through torch's *global*
optimizer-step pre-hook (``register_optimizer_step_pre_hook``), registered while the action is
armed for its step and removed at the next: it meets the primary optimizer's step (not another
optimizer's, nor the zero-gradient step of DCP's ``_init_optim_state``). ``loss_spike`` needs
the loss, which level 0 never sees: it is reported as ``fault_failed``.

Level 1 and level 2
-------------------
The observer's agent is ``faultlab.runtime``'s current agent, so a trainer that calls
``faultlab.runtime.attach`` itself closes it (its collective faults are released, its control
server stops) and gets its own. The observer notices at once (``attach`` is wrapped) or at its
next hook, and stands down for steps and numeric faults: the step number and the faults are the
trainer's (fire-once markers are on disk, so nothing strikes twice). With an attach *without*
an emitter (level 1) it still writes step records (the trainer's step number, ``step_source:
attach``, the loss the trainer passed to ``rt.loss``), checkpoints and the exit; with an
emitter the trainer writes the protocol itself (level 2) and the observer writes nothing more
(its ``start`` is already written; observe drops it for a process that writes its own).

Not covered: ``python -S`` or ``-I`` (no ``site``, or no ``PYTHONPATH``: no bootstrap); a
process forked from a rank (a DataLoader worker) inherits the hooks but writes no record; a
``raise SystemExit(n)`` that bypasses ``sys.exit`` is reported as ``completed``.

Step gates: after the record of a step at which the engine injects a fault by step, every rank
waits until the engine has injected it (``faultlab.runtime.gates``), so such a fault meets the
job at its step however fast the trainer steps.

Cost with nothing planned: per optimizer step, one hook call, an identity check, one CPU
``.item()``, one JSON line written and flushed (no fsync), one set lookup; nothing per forward,
backward or collective beyond the interposer's counter.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import faultlab.runtime as _rt
from faultlab.runtime.agent import Agent
from faultlab.runtime.auto_checkpoints import CheckpointHooks, PendingLoad, is_level0, mark_level0
from faultlab.runtime.auto_checkpoints import report_once as _report
from faultlab.runtime.gates import StepGates
from faultlab.runtime.hooks import load_action, uses
from faultlab.runtime.identity import Identity
from faultlab.runtime.plan import FaultEntry, load_plan
from faultlab.runtime.records import EventFile

__all__ = ["Observer", "observer", "on_import"]

_observer: Observer | None = None
_gave_up = False  # the observer failed to start: no second try, no half-installed hooks


def observer() -> Observer | None:
    """The observer of this process, if the bootstrap activated one."""
    return _observer


def on_import(module: ModuleType, *, t_bootstrap: float | None = None) -> None:
    """Called by the bootstrap after ``torch`` and the DCP modules are imported."""
    global _observer, _gave_up
    if module.__name__ == "torch":
        if _observer is None and not _gave_up:
            _gave_up = True
            started = Observer(Identity.from_env(os.environ), t_bootstrap=t_bootstrap)
            try:
                started.start()
            except BaseException:
                started.stop()  # all or nothing: no half-installed observer, no exit record
                raise
            _observer, _gave_up = started, False
    elif _observer is not None:
        _observer.patch_checkpoint_modules()



def _process_start_time() -> float | None:
    """Wall-clock time this process was created (the kernel's start time, ~10 ms)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            ticks = int(f.read().rpartition(")")[2].split()[19])
        since_s = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - since_s
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class _Params:
    """What numeric faults choose from at level 0, in the shape they expect of a model
    (``named_parameters()``): the primary optimizer's parameters, named by the module of the
    first training forward when it holds them, else by the optimizer's ``param_names``, else
    ``param_groups.{g}.params.{i}``."""

    def __init__(self, optimizer: Any, module: Any) -> None:
        self.optimizer = weakref.ref(optimizer)
        self._module = weakref.ref(module) if module is not None else (lambda: None)

    def named_parameters(self) -> Iterator[tuple[str, Any]]:
        optimizer = self.optimizer()
        if optimizer is None:
            return iter(())
        groups = optimizer.param_groups
        held = {id(p) for g in groups for p in g["params"]}
        module = self._module()
        if module is not None:
            named = [(n, p) for n, p in module.named_parameters() if id(p) in held]
            if named:
                return iter(named)
        return iter([(g["param_names"][i] if g.get("param_names") else
                      f"param_groups.{gi}.params.{i}", p)
                     for gi, g in enumerate(groups) for i, p in enumerate(g["params"])])

    def named_modules(self) -> Iterator[tuple[str, Any]]:
        """The modules of the first training forward's module (``sdc`` on ``activation``);
        none if no forward has been seen."""
        module = self._module()
        return iter(()) if module is None else module.named_modules()


class _Level0Agent(Agent):
    """The runtime agent as level 0 drives it (see the module docstring): a strike on ready
    gradients lasts one backward, an action on the optimizer step meets the primary
    optimizer's training steps only, and an action on the loss is reported as impossible."""

    observer: Observer | None = None

    def _hooked_optimizer(self, optimizer: Any) -> bool:
        obs = self.observer
        if obs is None:
            return True
        primary = obs._optimizer()
        return not obs._in_init_state and (primary is None or primary is optimizer)

    def _step_optimizer(self) -> Any:
        """The primary optimizer: a post-hook on it runs before the observer's global one
        writes the step record (``sdc`` on ``update`` is in that step's digest)."""
        obs = self.observer
        return obs._optimizer() if obs is not None else None

    def _arm(self, entry: FaultEntry, source: str, n: int) -> None:
        if uses(load_action(entry.action), "on_loss"):
            self._failed(entry, f"{entry.type} needs the trainer's loss, which level 0 never "
                                f"sees: call faultlab.runtime.attach(model, optimizer) and "
                                f"pass the loss through rt.loss(...)")
            return
        super()._arm(entry, source, n)

    def _struck(self, entry: FaultEntry, source: str, **details: Any) -> None:
        super()._struck(entry, source, **details)
        if uses(load_action(entry.action), "on_grads_ready"):
            import torch

            step = self._step
            try:  # inside backward (the hook that struck): run when this backward ends
                torch.autograd.Variable._execution_engine.queue_callback(
                    lambda: self._disarm(step))
            except RuntimeError:
                pass  # not in a backward: the next step disarms it

    def _disarm(self, step: int) -> None:
        """Remove the struck hooks: the same step again re-arms only what has not struck."""
        try:
            if self._step == step:
                self.step(step)
        except Exception as e:  # this runs inside the trainer's backward()
            _report("after a gradient fault", e)



class Observer(CheckpointHooks):
    """Level 0 in one rank process: the hooks, the records and the agent (module docstring)."""

    def __init__(self, ident: Identity, *, t_bootstrap: float | None = None) -> None:
        self.ident = ident
        self.t_bootstrap = t_bootstrap
        self.events = EventFile(ident)
        self.events.path = self.events.path.with_name(  # beside an attached agent's file
            self.events.path.name.replace("-runtime.jsonl", "-level0.jsonl"))
        self.agent: Agent | None = None
        self.level = 0
        """0 until the trainer attaches an agent itself: then 1 (no emitter) or 2 (emitter)."""
        self.step = 0
        """The last completed step of the primary optimizer (or the step loaded, before one)."""
        self.step_source = "counted"
        self._lock = threading.RLock()
        self._primary: weakref.ref[Any] | None = None
        self._built: list[weakref.ref[Any]] = []  # optimizers built, in order
        self._phantom: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._in_init_state = 0  # inside DCP's _init_optim_state: its step is not a step
        self._probe: tuple[int, Any] | None = None  # (id(optimizer), param) read for the step
        self._device_anchor: tuple[int, int, int] | None = None  # (id(opt), value, num_steps)
        self._num_steps = 0  # primary steps in this process
        self._root: weakref.ref[Any] | None = None
        self._arming: Any = None  # the temporary forward pre-hook's handle
        self._pending: list[PendingLoad] = []
        self._t_prev = time.monotonic()
        self._attached: Any = None
        self._loss: Any = None
        self._exit_code: Any = None
        self._exited = False
        self._patched: set[str] = set()
        self._params: _Params | None = None
        self._undo: list[Callable[[], None]] = []  # what stop() puts back, last first
        self._gates = StepGates(Path("."), ())
        self._step_digest = os.environ.get(STEP_DIGEST_ENV) == "1"

    # --- set-up -------------------------------------------------------------------------------

    def start(self, *, exit_hooks: bool = True) -> None:
        """Write ``start``, create the agent, install every hook. ``exit_hooks=False`` leaves
        ``atexit``, ``sys.exit`` and ``sys.excepthook`` alone (tests in a shared process)."""
        t_main = time.time()
        if exit_hooks:
            atexit.register(self._at_exit)
            self._undo.append(lambda: atexit.unregister(self._at_exit))
        own_world = {"own_world": True} if os.environ.get("FAULTLAB_RANK_OFFSET") else {}
        self._emit("start", level=0, resumed_from_step=None, local_rank=_env_int("LOCAL_RANK"),
                   t_main=t_main, t_bootstrap=self.t_bootstrap,
                   t_process_created=_process_start_time(), **own_world)
        for what, fn in (("the step gates", self._read_gates),
                         ("the collective interposer", self._interpose), ("the agent", self._agent),
                         ("the hooks", self._install_hooks),
                         ("torch.save/load and DCP", self.patch_checkpoint_modules),
                         ("the exit hooks", self._install_exit_hooks if exit_hooks else None)):
            if fn is None:
                continue
            try:
                fn()
            except Exception as e:
                _report(f"installing {what}", e)

    def _read_gates(self) -> None:
        self._gates = StepGates.from_env(os.environ)

    def _interpose(self) -> None:
        from faultlab.runtime import interposer

        if not interposer.installed() and _rt.install():
            self._undo.append(interposer.uninstall)

    def _agent(self) -> None:
        env = os.environ
        plan_path = env.get("FAULTLAB_RUNTIME_PLAN")
        self.agent = _Level0Agent(self.ident, emit=self.events.emit,
                                  plan=load_plan(plan_path) if plan_path else [],
                                  secret=env.get("FAULTLAB_RUNTIME_SECRET") or None,
                                  host=env.get("FAULTLAB_RUNTIME_HOST") or "127.0.0.1")
        self.agent.observer = self
        _rt._current = self.agent  # an explicit attach() closes and replaces it
        agent = self.agent
        attach = _rt.attach

        @functools.wraps(attach)
        def attach_then_stand_down(*args: Any, **kwargs: Any) -> Any:
            attached = attach(*args, **kwargs)
            try:
                self._level()  # now rather than at the next step: its first loss counts too
            except Exception as e:
                _report("after an explicit attach", e)
            return attached

        self._setattr(_rt, "attach", attach_then_stand_down)

        def forget() -> None:
            if _rt._current is agent:
                agent.close()
                _rt._current = None

        self._undo.append(forget)

    def stop(self) -> None:
        """Put back everything ``start`` changed (tests and benchmarks; a rank never needs it)."""
        while self._undo:
            try:
                self._undo.pop()()
            except Exception as e:
                _report("stopping", e)
        if self._arming is not None:
            self._arming.remove()
            self._arming = None
        self.events.close()

    def _setattr(self, owner: Any, name: str, value: Any) -> None:
        """``setattr`` that ``stop`` undoes."""
        old = getattr(owner, name)
        setattr(owner, name, value)
        self._undo.append(lambda: setattr(owner, name, old))

    def _install_hooks(self) -> None:
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._undo.append(register_optimizer_step_post_hook(self._post_step).remove)
        init = torch.optim.Optimizer.__init__
        if not is_level0(init):
            on_built = self._on_optimizer_built

            @functools.wraps(init)
            def __init__(optimizer: Any, *args: Any, **kwargs: Any) -> None:
                init(optimizer, *args, **kwargs)
                try:
                    on_built(optimizer)
                except Exception as e:
                    _report("noting an optimizer", e)

            self._setattr(torch.optim.Optimizer, "__init__", mark_level0(__init__))
        self._arm_at_next_forward()

    def _install_exit_hooks(self) -> None:
        exit_fn = sys.exit

        @functools.wraps(exit_fn)
        def exit_remembering_code(code: Any = None) -> None:
            self._exit_code = code
            exit_fn(code)

        self._setattr(sys, "exit", exit_remembering_code)
        hard_exit = os._exit
        leave = self._leave
        rank_pid = self.ident.pid

        @functools.wraps(hard_exit)
        def hard_exit_reporting(code: int) -> None:
            if os.getpid() == rank_pid:  # a forked child (a DataLoader worker) is not the rank
                try:
                    if code == 0:
                        leave("completed", 0)
                    else:
                        leave("error", code)
                except Exception as e:
                    _report("reporting the exit", e)
            hard_exit(code)

        self._setattr(os, "_exit", hard_exit_reporting)
        previous = sys.excepthook

        def excepthook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
            try:
                self._leave("error", 1, error=f"{exc_type.__name__}: {exc}"[:2000])
            except Exception as e:
                _report("reporting the exit", e)
            previous(exc_type, exc, tb)

        self._setattr(sys, "excepthook", excepthook)

    # --- records ------------------------------------------------------------------------------

    def _emit(self, kind: str, **fields: Any) -> None:
        if os.getpid() == self.ident.pid:  # not from a forked child (a DataLoader worker)
            self.events.emit(kind, **fields)

    def _leave(self, reason: str, code: int, **fields: Any) -> None:
        with self._lock:
            if self._exited or self.level == 2:
                return
            self._exited = True
            self._settle_loads(None, after_step=False)
            self._emit("exit", reason=reason, code=code, step=self.step, level=self.level,
                       **fields)

    def _at_exit(self) -> None:
        try:
            code = self._exit_code
            last = getattr(sys, "last_value", None)  # an uncaught exception, if our excepthook
            if last is not None and not isinstance(last, SystemExit):  # was replaced
                self._leave("error", 1, error=f"{type(last).__name__}: {last}"[:2000])
            elif code is None or code == 0:
                self._leave("completed", 0)
            else:
                self._leave("error", code if isinstance(code, int) else 1,
                            **({} if isinstance(code, int) else {"error": str(code)[:2000]}))
        except Exception as e:
            _report("reporting the exit", e)
        finally:
            self.events.close()

    # --- optimizers and steps -----------------------------------------------------------------

    def _on_optimizer_built(self, optimizer: Any) -> None:
        self._built = [r for r in self._built if r() is not None]
        self._built.append(weakref.ref(optimizer))
        optimizer.register_load_state_dict_post_hook(self._on_optimizer_loaded)

    def _on_optimizer_loaded(self, optimizer: Any) -> None:
        try:
            self._phantom.pop(optimizer, None)  # its state is the loaded one now
            if self._device_anchor is not None and self._device_anchor[0] == id(optimizer):
                self._device_anchor = None
            self._arm_at_next_forward()
        except Exception as e:
            _report("after an optimizer's load_state_dict", e)

    def _optimizer(self) -> Any:
        """The primary optimizer, or before any step the first one built (still alive)."""
        if self._primary is not None:
            return self._primary()
        return next((o for r in self._built if (o := r()) is not None), None)

    def _state_step(self, optimizer: Any) -> int | None:
        """The step count in ``optimizer``'s state (None: it keeps none)."""
        probe = self._probe
        if probe is None or probe[0] != id(optimizer):
            param = next((p for g in optimizer.param_groups for p in g["params"]
                          if "step" in optimizer.state.get(p, ())), None)
            if param is None:
                return None
            probe = self._probe = (id(optimizer), param)
        state = optimizer.state.get(probe[1])
        value = None if state is None else state.get("step")
        if value is None:
            self._probe = None
            return None
        if isinstance(value, int | float):
            return int(value) - self._phantom.get(optimizer, 0)
        local = getattr(value, "_local_tensor", value)  # a DTensor's local tensor
        if local.device.type == "cpu":
            return int(local.item()) - self._phantom.get(optimizer, 0)
        anchor = self._device_anchor  # read a device tensor once, then count on from it
        if anchor is None or anchor[0] != id(optimizer):
            anchor = self._device_anchor = (id(optimizer), int(local.item()), self._num_steps)
        return anchor[1] + self._num_steps - anchor[2] - self._phantom.get(optimizer, 0)

    def _wrap_init_optim_state(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def _init_optim_state(optim: Any, *args: Any, **kwargs: Any) -> Any:
            was_empty = not optim.state
            self._in_init_state += 1
            try:
                return fn(optim, *args, **kwargs)
            finally:
                self._in_init_state -= 1
                try:
                    if was_empty and any("step" in s for s in optim.state.values()):
                        self._phantom[optim] = self._phantom.get(optim, 0) + 1
                except Exception as e:
                    _report("after DCP's optimizer state initialisation", e)

        return mark_level0(_init_optim_state)

    def _post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._in_init_state:
            return  # get_state_dict's zero-gradient step: not a training step
        primary = self._primary() if self._primary is not None else None
        if primary is None:  # the first optimizer to step (or the next, once it is gone)
            self._primary = weakref.ref(optimizer)
        elif primary is not optimizer:
            return
        try:
            self._after_step(optimizer)
        except Exception as e:
            _report("after an optimizer step", e)

    def _after_step(self, optimizer: Any) -> None:
        now = time.monotonic()
        self._num_steps += 1
        level = self._level()
        if level == 2:
            return
        if self._pending:
            self._settle_loads(optimizer, after_step=True)
        step = self._state_step(optimizer)
        if step is not None:
            source = "optimizer_state"
        else:
            step, source = self.step + 1, "counted"
        if level == 1 and self._attached.current_step > 0:
            step, source = self._attached.current_step, "attach"
        self.step, self.step_source = step, source
        fields: dict[str, Any] = {"step": step, "step_source": source,
                                  "step_time_s": round(now - self._t_prev, 6)}
        self._t_prev = now
        if self._step_digest:
            fields["param_digest"] = param_digest(optimizer)
        loss = self._loss
        if loss is not None:
            self._loss = None
            if getattr(loss, "device", None) is not None and loss.device.type == "cpu" \
                    and loss.numel() == 1:
                fields["loss"] = float(loss.detach())
        self._emit("step", **fields)
        waited = self._gates.wait(step)
        if waited is not None:
            self._t_prev = time.monotonic()  # the pause is not part of the next step
            if not waited[1]:
                _report(f"step gate {step}", TimeoutError(
                    f"not opened within {self._gates.timeout_s:g} s; going on"))
        agent = self.agent
        if level == 0 and agent is not None:
            self._tell_agent(step + 1)

    def _tell_agent(self, n: int) -> None:
        """Tell the agent the step about to run, giving it the parameters to strike first."""
        agent = self.agent
        if agent is None:
            return
        optimizer = self._optimizer()
        if optimizer is not None and (self._params is None
                                      or self._params.optimizer() is not optimizer):
            root = self._root() if self._root is not None else None
            self._params = agent.model = _Params(optimizer, root)
        agent.step(n)

    # --- the temporary forward pre-hook (module docstring: "when the agent learns the step") --

    def _arm_at_next_forward(self) -> None:
        if self._arming is not None or self.level != 0:
            return
        from torch.nn.modules.module import register_module_forward_pre_hook

        self._arming = register_module_forward_pre_hook(self._forward_pre_hook)

    def _forward_pre_hook(self, module: Any, args: Any) -> None:
        try:
            import torch

            if not torch.is_grad_enabled():
                return
            optimizer = self._optimizer()
            if optimizer is None:
                return  # no optimizer yet: wait for a forward that has one
            self._arming.remove()
            self._arming = None
            self._t_prev = time.monotonic()
            if self._level() != 0:
                return
            if self._root is None:
                self._root = weakref.ref(module)
            if self._pending:
                self._settle_loads(optimizer, after_step=False)
            state = self._state_step(optimizer)
            self._tell_agent((state if state is not None else self.step) + 1)
        except Exception as e:
            _report("before a forward", e)

    # --- level 1 and 2 --------------------------------------------------------------------------

    def _level(self) -> int:
        current = _rt._current
        if self.level == 0 and current is not None and current is not self.agent:
            self._stand_down(current)
        return self.level

    def _stand_down(self, attached: Any) -> None:
        """The trainer attached an agent itself (module docstring: "Level 1 and level 2")."""
        self.agent = None  # attach() closed it; closing it again would clear the new one's faults
        self._attached = attached
        self.level = 1 if getattr(attached, "_events", None) is not None else 2
        if self._arming is not None:
            self._arming.remove()
            self._arming = None
        if self.level == 1:
            loss_fn = attached.loss

            def loss(value: Any) -> Any:
                out = loss_fn(value)
                self._loss = out
                return out

            attached.loss = loss

STEP_DIGEST_ENV = "FAULTLAB_STEP_DIGEST"
"""``1``: every step record carries ``param_digest`` (``observe.step_digest``)."""


def param_digest(optimizer: Any) -> str:
    """SHA-256 of the primary optimizer's parameters after its step, in ``param_groups``
    order (each tensor's raw bytes): two processes with bitwise the same weights give the
    same digest. The weights only: a group that healed from a peer also took its optimizer
    state, and its weights after the next step are equal only if that state was."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for group in optimizer.param_groups:
        for p in group["params"]:
            t = getattr(p, "_local_tensor", p).detach()
            if t.device.type != "cpu":
                t = t.cpu()
            h.update(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None

