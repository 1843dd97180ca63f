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
    Wrappers of ``torch.distributed.checkpoint.save``/``async_save``/``load`` (and the
    deprecated ``save_state_dict``/``load_state_dict``) and of ``torch.save``/``torch.load``.
    A DCP save is collective: rank 0 reports it (every rank with ``no_dist``); ``async_save``
    reports when its upload future completes. ``torch.save``/``torch.load`` count only for a
    file path (not a buffer) and a checkpoint (:func:`is_checkpoint_object`: a mapping holding
    an optimizer ``state_dict``, or ``*weight``/``*bias`` tensors of at least
    :data:`CHECKPOINT_MIN_BYTES` in all) — a metrics file, a data shard or DCP's own
    per-tensor ``torch.save`` calls never count. A save's ``step`` is the last primary step. A
    load's step is not known when it happens; it is settled at the next forward or optimizer
    step: the primary optimizer's state step if the load changed it (``optimizer_state``), else
    the ``step`` key of a loaded dict (``checkpoint_key``), else digits in the path
    (``step_20``, ``step=20``, ``ckpt-20``: ``path``), else the unchanged state step, else
    null. The record keeps ``t`` of the load and is written before the next step's record.
    Every rank reports its loads, as the reference trainer does.
``exit``
    At interpreter exit (``atexit``): ``completed`` with code 0, or ``error`` with the code given
    to ``sys.exit`` (wrapped to learn it); an uncaught exception is reported from a chained
    ``sys.excepthook`` (``error`` and its type). ``os._exit`` and signals skip all of that, as
    they skip the reference trainer's own records.

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
before the step's forward, on a parameter the optimizer holds. ``loss_spike`` needs the loss,
which level 0 never sees: it is reported as ``fault_failed``.

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
(its ``start`` is already written: a level-2 trainer is best launched without the bootstrap).

Not covered: ``python -S`` or ``-I`` (no ``site``, or no ``PYTHONPATH``: no bootstrap); a
process forked from a rank (a DataLoader worker) inherits the hooks but writes no record; a
``raise SystemExit(n)`` that bypasses ``sys.exit`` is reported as ``completed``.

Cost with nothing planned: per optimizer step, one hook call, an identity check, one CPU
``.item()``, one JSON line written and flushed (no fsync); nothing per forward, backward or
collective beyond the interposer's counter.
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import faultlab.runtime as _rt
from faultlab.runtime.agent import Agent
from faultlab.runtime.plan import FaultEntry, load_plan
from faultlab.runtime.records import EventFile, Identity

__all__ = ["CHECKPOINT_MIN_BYTES", "Observer", "is_checkpoint_object", "observer", "on_import",
           "step_from_path"]

CHECKPOINT_MIN_BYTES = 64 * 1024
"""A ``torch.save``/``torch.load`` of a mapping with parameter-like tensors (a key ending in
``weight`` or ``bias``) of at least this many bytes in all is a checkpoint; so is one holding an
optimizer ``state_dict``, whatever its size. 64 KiB is above any metrics or config file and
below any real model: a 128 x 128 float32 layer is 64 KiB. The names keep data files out
(``{"input_ids": ..., "labels": ...}`` shards loaded every step would otherwise each look like
a rollback to ``observe``)."""

_MAX_VISITS = 100_000  # objects walked to size an object: bounded even for huge state dicts
_STEP_KEYS = ("step", "global_step", "iteration", "iter_num", "train_step")
_PATH_STEP = re.compile(r"(?:step|ckpt|checkpoint|iter|iteration|global_step)s?[_=\-]?(\d+)",
                        re.IGNORECASE)
_observer: Observer | None = None
_gave_up = False  # the observer failed to start: no second try, no half-installed hooks
_reported: set[str] = set()


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
        _observer.patch_loaded_modules()


def _report(where: str, error: BaseException) -> None:
    """One ``faultlab bootstrap:`` line per place, however often it fails there."""
    if where in _reported:
        return
    _reported.add(where)
    try:
        text = f"{type(error).__name__}: {error}".replace("\n", " | ")
        sys.stderr.write(f"faultlab bootstrap: {where}: {text}\n")
        sys.stderr.flush()
    except Exception:
        pass


def step_from_path(path: str | os.PathLike[str] | None) -> int | None:
    """The step a checkpoint's path names (its last ``step_00020``, ``step=20``, ``ckpt-20``,
    ``iter20`` ...), or None."""
    if path is None:
        return None
    found = _PATH_STEP.findall(os.fspath(path))
    return int(found[-1]) if found else None


def is_checkpoint_object(obj: Any, min_bytes: int = CHECKPOINT_MIN_BYTES) -> bool:
    """Whether a ``torch.save``d or ``torch.load``ed object is a checkpoint: a mapping holding
    an optimizer state_dict (``state`` and ``param_groups``), or parameter-like tensors (under a
    key ending in ``weight`` or ``bias``) of at least ``min_bytes`` in all; or a whole module
    that large. A bare tensor or a list is not (DCP writes every shard as a bare tensor), nor
    is a mapping of data (see :data:`CHECKPOINT_MIN_BYTES`)."""
    import torch

    if isinstance(obj, torch.nn.Module):
        return sum(t.nelement() * t.element_size() for t in obj.state_dict().values()
                   if isinstance(t, torch.Tensor)) >= min_bytes
    if not isinstance(obj, Mapping):
        return False
    total, visits, named = 0, 0, False
    stack: list[tuple[Any, Any, int]] = [(None, obj, 0)]
    while stack and visits < _MAX_VISITS:
        key, item, depth = stack.pop()
        visits += 1
        if isinstance(item, torch.Tensor):
            total += item.nelement() * item.element_size()
            named = named or (isinstance(key, str) and key.endswith(("weight", "bias")))
            if named and total >= min_bytes:
                return True
        elif depth < 8 and isinstance(item, Mapping):
            if "state" in item and "param_groups" in item:
                return True
            stack.extend((k, v, depth + 1) for k, v in item.items())
        elif depth < 8 and isinstance(item, list | tuple):
            stack.extend((key, v, depth + 1) for v in item)
    return False


def _file_path(f: Any) -> str | None:
    """The absolute path behind ``torch.save``/``torch.load``'s file argument (None: a buffer)."""
    if isinstance(f, str | os.PathLike):
        return os.path.abspath(os.fspath(f))
    name = getattr(f, "name", None)
    return os.path.abspath(name) if isinstance(name, str) and name else None


def _ckpt_location(where: Any) -> str | None:
    """A DCP ``checkpoint_id`` or storage reader/writer as the path a record names."""
    if where is None:
        return None
    if not isinstance(where, str | os.PathLike):
        where = getattr(where, "path", None) or getattr(where, "checkpoint_id", None)
        if where is None:
            return None
    text = os.fspath(where)
    return text if "://" in text else os.path.abspath(text)


def _size(path: str | None) -> int | None:
    """Bytes of a checkpoint file, or of the files directly in a checkpoint directory."""
    if path is None:
        return None
    try:
        if os.path.isdir(path):
            return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())
        return os.path.getsize(path)
    except OSError:
        return None


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


class _Level0Agent(Agent):
    """The runtime agent as level 0 drives it (see the module docstring): a gradient strike
    lasts one backward, and ``loss_spike`` is reported as impossible."""

    def _arm(self, entry: FaultEntry, source: str, n: int) -> None:
        if entry.type == "loss_spike":
            self._failed(entry, "loss_spike needs the trainer's loss, which level 0 never sees: "
                                "call faultlab.runtime.attach(model, optimizer) and pass the "
                                "loss through rt.loss(...)")
            return
        super()._arm(entry, source, n)

    def _struck(self, entry: FaultEntry, source: str, **details: Any) -> None:
        super()._struck(entry, source, **details)
        if entry.type in ("grad_nan", "grad_inf"):
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


@dataclass(slots=True)
class _Load:
    """A checkpoint load whose step is settled later (see the module docstring)."""

    path: str | None
    t: float
    seconds: float
    state_before: int | None
    key_step: int | None = None


class Observer:
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
        self._pending: list[_Load] = []
        self._t_prev = time.monotonic()
        self._attached: Any = None
        self._loss: Any = None
        self._exit_code: Any = None
        self._exited = False
        self._patched: set[str] = set()
        self._params: _Params | None = None
        self._undo: list[Callable[[], None]] = []  # what stop() puts back, last first

    # --- set-up -------------------------------------------------------------------------------

    def start(self, *, exit_hooks: bool = True) -> None:
        """Write ``start``, create the agent, install every hook. ``exit_hooks=False`` leaves
        ``atexit``, ``sys.exit`` and ``sys.excepthook`` alone (tests in a shared process)."""
        t_main = time.time()
        if exit_hooks:
            atexit.register(self._at_exit)
            self._undo.append(lambda: atexit.unregister(self._at_exit))
        self._emit("start", level=0, resumed_from_step=None, local_rank=_env_int("LOCAL_RANK"),
                   t_main=t_main, t_bootstrap=self.t_bootstrap,
                   t_process_created=_process_start_time())
        for what, fn in (("the collective interposer", self._interpose), ("the agent", self._agent),
                         ("the hooks", self._install_hooks),
                         ("torch.save/load and DCP", self.patch_loaded_modules),
                         ("the exit hooks", self._install_exit_hooks if exit_hooks else None)):
            if fn is None:
                continue
            try:
                fn()
            except Exception as e:
                _report(f"installing {what}", e)

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
        if not hasattr(init, "__faultlab_level0__"):
            on_built = self._on_optimizer_built

            @functools.wraps(init)
            def __init__(optimizer: Any, *args: Any, **kwargs: Any) -> None:
                init(optimizer, *args, **kwargs)
                try:
                    on_built(optimizer)
                except Exception as e:
                    _report("noting an optimizer", e)

            __init__.__faultlab_level0__ = True  # type: ignore[attr-defined]
            self._setattr(torch.optim.Optimizer, "__init__", __init__)
        self._arm_at_next_forward()

    def _install_exit_hooks(self) -> None:
        exit_fn = sys.exit

        @functools.wraps(exit_fn)
        def exit_remembering_code(code: Any = None) -> None:
            self._exit_code = code
            exit_fn(code)

        self._setattr(sys, "exit", exit_remembering_code)
        previous = sys.excepthook

        def excepthook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
            try:
                self._leave("error", 1, error=f"{exc_type.__name__}: {exc}"[:2000])
            except Exception as e:
                _report("reporting the exit", e)
            previous(exc_type, exc, tb)

        self._setattr(sys, "excepthook", excepthook)

    def patch_loaded_modules(self) -> None:
        """Wrap torch.save/load and the DCP functions of the modules imported so far."""
        modules = sys.modules
        if "torch" in modules and "torch" not in self._patched:
            self._patched.add("torch")
            torch = modules["torch"]
            self._setattr(torch, "save", self._wrap_torch_save(torch.save))
            self._setattr(torch, "load", self._wrap_torch_load(torch.load))
        name = "torch.distributed.checkpoint"
        if name in modules and name not in self._patched:
            self._patched.add(name)
            dcp = modules[name]
            for attr, kind in (("save", "save"), ("save_state_dict", "save"),
                               ("async_save", "async_save"), ("load", "load"),
                               ("load_state_dict", "load")):
                fn = getattr(dcp, attr, None)
                if fn is not None and not hasattr(fn, "__faultlab_level0__"):
                    self._setattr(dcp, attr, self._wrap_dcp(fn, kind))
        name = "torch.distributed.checkpoint.state_dict"
        if name in modules and name not in self._patched:
            self._patched.add(name)
            sd = modules[name]
            init_state = getattr(sd, "_init_optim_state", None)
            if init_state is not None:
                self._setattr(sd, "_init_optim_state", self._wrap_init_optim_state(init_state))

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

        _init_optim_state.__faultlab_level0__ = True  # type: ignore[attr-defined]
        return _init_optim_state

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
        loss = self._loss
        if loss is not None:
            self._loss = None
            if getattr(loss, "device", None) is not None and loss.device.type == "cpu" \
                    and loss.numel() == 1:
                fields["loss"] = float(loss.detach())
        self._emit("step", **fields)
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

    # --- checkpoints ----------------------------------------------------------------------------

    def _wrap_dcp(self, fn: Callable[..., Any], kind: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0, m0 = time.time(), time.monotonic()
            before = self._before_load() if kind == "load" else None
            result = fn(*args, **kwargs)
            try:
                # checkpoint_id, or the storage writer/reader (the deprecated forms: 2nd arg)
                where = kwargs.get("checkpoint_id") or kwargs.get("storage_writer") \
                    or kwargs.get("storage_reader") or (args[1] if len(args) > 1 else None)
                path = _ckpt_location(where)
                if kind == "load":
                    self._loaded(path, time.time(), time.monotonic() - m0, before)
                elif self.ident.rank == 0 or kwargs.get("no_dist"):
                    self._dcp_saved(path, result, kind == "async_save", t0, m0)
            except Exception as e:
                _report(f"after torch.distributed.checkpoint.{fn.__name__}", e)
            return result

        wrapper.__faultlab_level0__ = True  # type: ignore[attr-defined]
        return wrapper

    def _dcp_saved(self, path: str | None, result: Any, is_async: bool, t0: float,
                   m0: float) -> None:
        step, stall_s = self.step, time.monotonic() - m0
        if not is_async:
            self._saved(path, step, stall_s, stall_s, False)
            return
        future = getattr(result, "upload_completion", result)  # AsyncSaveResponse or Future

        def done(f: Any) -> None:
            try:
                if f.exception() is None:
                    self._saved(path, step, time.monotonic() - m0, stall_s, True)
            except Exception as e:
                _report("after an async checkpoint", e)

        future.add_done_callback(done)

    def _saved(self, path: str | None, step: int, seconds: float, stall_s: float,
               is_async: bool) -> None:
        if self.level == 2:
            return
        self._emit("checkpoint_saved", step=step, path=path, seconds=round(seconds, 4),
                   stall_s=round(stall_s, 4), bytes=_size(path), **{"async": is_async})

    def _wrap_torch_save(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
            path = _file_path(f)
            try:
                counts = path is not None and is_checkpoint_object(obj)
            except Exception as e:
                _report("sizing a torch.save", e)
                counts = False
            m0 = time.monotonic()
            result = fn(obj, f, *args, **kwargs)
            if counts:
                try:
                    seconds = time.monotonic() - m0
                    self._saved(path, self.step, seconds, seconds, False)
                except Exception as e:
                    _report("after a torch.save", e)
            return result

        save.__faultlab_level0__ = True  # type: ignore[attr-defined]
        return save

    def _wrap_torch_load(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def load(f: Any, *args: Any, **kwargs: Any) -> Any:
            path = _file_path(f)
            before = self._before_load() if path is not None else None
            m0 = time.monotonic()
            result = fn(f, *args, **kwargs)
            if path is not None:
                try:
                    if is_checkpoint_object(result):
                        key = next((result[k] for k in _STEP_KEYS if isinstance(
                            result.get(k), int) and not isinstance(result.get(k), bool)), None) \
                            if isinstance(result, Mapping) else None
                        self._loaded(path, time.time(), time.monotonic() - m0, before, key)
                except Exception as e:
                    _report("after a torch.load", e)
            return result

        load.__faultlab_level0__ = True  # type: ignore[attr-defined]
        return load

    def _before_load(self) -> int | None:
        try:
            optimizer = self._optimizer()
            return None if optimizer is None else self._state_step(optimizer)
        except Exception as e:
            _report("before a checkpoint load", e)
            return None

    def _loaded(self, path: str | None, t: float, seconds: float, before: int | None,
                key_step: int | None = None) -> None:
        if self.level == 2:
            return
        with self._lock:
            self._pending.append(_Load(path, t, seconds, before, key_step))
        self._device_anchor = None  # an in-place load may have changed a device step tensor
        if self.level == 0:
            self._arm_at_next_forward()

    def _settle_loads(self, optimizer: Any, *, after_step: bool) -> None:
        """Emit the pending ``checkpoint_loaded`` records (module docstring: checkpoints)."""
        with self._lock:
            pending, self._pending = self._pending, []
        now = self._state_step(optimizer) if optimizer is not None else None
        if now is not None and after_step:
            now -= 1
        for load in pending:
            digits = step_from_path(load.path)
            if now is not None and now != load.state_before:
                step, source = now, "optimizer_state"
            elif load.key_step is not None:
                step, source = load.key_step, "checkpoint_key"
            elif digits is not None:
                step, source = digits, "path"
            elif now is not None:
                step, source = now, "optimizer_state"  # restored to the step it had
            else:
                step, source = None, "unknown"
            if step is not None:
                self.step = step
            self._emit("checkpoint_loaded", t=load.t, step=step, step_source=source,
                       path=load.path, seconds=round(load.seconds, 4), fell_back_from=[])


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None

