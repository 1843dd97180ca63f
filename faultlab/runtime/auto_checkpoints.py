"""Level 0's checkpoint observation: which saves and loads are checkpoints, and their records.

``checkpoint_saved`` / ``checkpoint_loaded`` come from

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

Frameworks that write the file themselves
-----------------------------------------
Some frameworks serialise into memory and write the bytes through their own file layer, so
``torch.save`` sees a buffer, never a path. Their save functions are wrapped where they are
defined (:data:`FRAMEWORK_SAVES`), right after their module is imported and before any other
module imports the name: PyTorch Lightning's (and Fabric's) ``_atomic_save(checkpoint,
filepath)``, which ``ModelCheckpoint`` and ``Trainer.save_checkpoint`` reach through
``TorchCheckpointIO``. Lightning's loads go through ``torch.load`` on an open file, which the
``torch.load`` wrapper already sees (the file's ``name``).

:class:`CheckpointHooks` is the part of ``faultlab.runtime.auto.Observer`` that does this; it
relies on the observer for the step, the level and the records.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

__all__ = ["CHECKPOINT_MIN_BYTES", "FRAMEWORK_SAVES", "CheckpointHooks", "PendingLoad",
           "is_checkpoint_object", "is_level0", "mark_level0", "report_once", "step_from_path"]

_F = TypeVar("_F", bound=Callable[..., Any])
_LEVEL0 = "__faultlab_level0__"


def mark_level0(fn: _F) -> _F:
    """Mark ``fn`` as level 0's own wrapper, so that it is never wrapped again."""
    setattr(fn, _LEVEL0, True)
    return fn


def is_level0(fn: object) -> bool:
    """``fn`` is a wrapper level 0 put in place (``mark_level0``)."""
    return hasattr(fn, _LEVEL0)

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

FRAMEWORK_SAVES: dict[str, tuple[str, ...]] = {
    "lightning_fabric.utilities.cloud_io": ("_atomic_save",),
    "lightning.fabric.utilities.cloud_io": ("_atomic_save",),
}
"""Module → its functions ``f(checkpoint, path, ...)`` that write a checkpoint file (see the
module docstring); the bootstrap hooks the import of each module named here."""

_reported: set[str] = set()


def report_once(where: str, error: BaseException) -> None:
    """One ``faultlab bootstrap:`` line on stderr per place, however often it fails there;
    never raises (the level-0 modules' only way to complain)."""
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


@dataclass(slots=True)
class PendingLoad:
    """A checkpoint load whose step is settled later (see the module docstring)."""

    path: str | None
    t: float
    seconds: float
    state_before: int | None
    key_step: int | None = None


class CheckpointHooks:
    """The checkpoint wrappers of the level-0 observer (module docstring). What it needs of
    the observer is declared here; ``Observer`` provides it."""

    ident: Any
    step: int
    level: int
    _lock: threading.RLock
    _pending: list[PendingLoad]
    _patched: set[str]
    _device_anchor: tuple[int, int, int] | None

    if TYPE_CHECKING:  # the observer's own methods
        def _emit(self, kind: str, **fields: Any) -> None: ...
        def _setattr(self, owner: Any, name: str, value: Any) -> None: ...
        def _optimizer(self) -> Any: ...
        def _state_step(self, optimizer: Any) -> int | None: ...
        def _arm_at_next_forward(self) -> None: ...
        def _wrap_init_optim_state(self, fn: Callable[..., Any]) -> Callable[..., Any]: ...

    def patch_checkpoint_modules(self) -> None:
        """Wrap torch.save/load, the DCP functions and the :data:`FRAMEWORK_SAVES` of the modules
        imported so far (each module once)."""
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
                if fn is not None and not is_level0(fn):
                    self._setattr(dcp, attr, self._wrap_dcp(fn, kind))
        name = "torch.distributed.checkpoint.state_dict"
        if name in modules and name not in self._patched:
            self._patched.add(name)
            sd = modules[name]
            init_state = getattr(sd, "_init_optim_state", None)
            if init_state is not None:
                self._setattr(sd, "_init_optim_state", self._wrap_init_optim_state(init_state))
        for name, attrs in FRAMEWORK_SAVES.items():
            if name in modules and name not in self._patched:
                self._patched.add(name)
                for attr in attrs:
                    fn = getattr(modules[name], attr, None)
                    if fn is not None and not is_level0(fn):
                        self._setattr(modules[name], attr, self._wrap_file_save(fn))


    def _wrap_dcp(self, fn: Callable[..., Any], kind: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0, m0 = time.time(), time.monotonic()
            before = self._before_load() if kind == "load" else None
            try:
                result = fn(*args, **kwargs)
            except BaseException as e:  # CheckpointException is a BaseException
                if kind == "load":
                    where = kwargs.get("checkpoint_id") or kwargs.get("storage_reader") \
                        or (args[1] if len(args) > 1 else None)
                    self._load_failed(_ckpt_location(where), e)
                raise
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
                report_once(f"after torch.distributed.checkpoint.{fn.__name__}", e)
            return result

        return mark_level0(wrapper)

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
                report_once("after an async checkpoint", e)

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
                report_once("sizing a torch.save", e)
                counts = False
            m0 = time.monotonic()
            result = fn(obj, f, *args, **kwargs)
            if counts:
                try:
                    seconds = time.monotonic() - m0
                    self._saved(path, self.step, seconds, seconds, False)
                except Exception as e:
                    report_once("after a torch.save", e)
            return result

        return mark_level0(save)

    def _wrap_file_save(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """A framework's ``save(checkpoint, path, ...)`` (:data:`FRAMEWORK_SAVES`)."""

        @functools.wraps(fn)
        def save(checkpoint: Any, path: Any, *args: Any, **kwargs: Any) -> Any:
            m0 = time.monotonic()
            result = fn(checkpoint, path, *args, **kwargs)
            try:
                if is_checkpoint_object(checkpoint):
                    seconds = time.monotonic() - m0
                    self._saved(_ckpt_location(path), self.step, seconds, seconds, False)
            except Exception as e:
                report_once(f"after {fn.__module__}.{fn.__name__}", e)
            return result

        return mark_level0(save)

    def _wrap_torch_load(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def load(f: Any, *args: Any, **kwargs: Any) -> Any:
            path = _file_path(f)
            before = self._before_load() if path is not None else None
            m0 = time.monotonic()
            try:
                result = fn(f, *args, **kwargs)
            except BaseException as e:
                if path is not None:
                    self._load_failed(path, e)
                raise
            if path is not None:
                try:
                    if is_checkpoint_object(result):
                        key = next((result[k] for k in _STEP_KEYS if isinstance(
                            result.get(k), int) and not isinstance(result.get(k), bool)), None) \
                            if isinstance(result, Mapping) else None
                        self._loaded(path, time.time(), time.monotonic() - m0, before, key)
                except Exception as e:
                    report_once("after a torch.load", e)
            return result

        return mark_level0(load)

    def _before_load(self) -> int | None:
        try:
            optimizer = self._optimizer()
            return None if optimizer is None else self._state_step(optimizer)
        except Exception as e:
            report_once("before a checkpoint load", e)
            return None

    def _loaded(self, path: str | None, t: float, seconds: float, before: int | None,
                key_step: int | None = None) -> None:
        if self.level == 2:
            return
        with self._lock:
            self._pending.append(PendingLoad(path, t, seconds, before, key_step))
        self._device_anchor = None  # an in-place load may have changed a device step tensor
        if self.level == 0:
            self._arm_at_next_forward()

    def _load_failed(self, path: str | None, error: BaseException) -> None:
        """A load raised: the trainer reached its load (``observe.metrics.reached_load``)."""
        if self.level == 2:
            return
        try:
            self._emit("checkpoint_load_failed", path=path,
                       error=f"{type(error).__name__}: {error}"[:500])
        except Exception as e:
            report_once("reporting a failed load", e)

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
