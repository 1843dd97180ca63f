"""faultlab's level-0 bootstrap: the runtime agent in a rank whose trainer has no line of faultlab.

faultlab puts this file's directory first on ``PYTHONPATH`` of the ranks it launches, so the
interpreter runs it at start-up (``site`` imports ``sitecustomize``). It activates only in a
torchrun *worker* that faultlab launched:

- ``FAULTLAB_RUN_DIR`` set and ``FAULTLAB_BOOTSTRAP=1``;
- ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` set (torchrun's agent has none of the first two, so
  the agent process, which imports torch too, stays untouched);
- not a child of an activated worker (a DataLoader worker started with ``spawn``, a subprocess
  running python): activation writes ``FAULTLAB_BOOTSTRAP_PID`` into the environment, and a
  process that inherits one naming another pid stays quiet.

It never imports torch (a trainer may set environment variables before it does). It installs a
post-import hook instead: a ``sys.meta_path`` finder that, for ``torch``, for
``torch.distributed.checkpoint`` (and its ``state_dict`` module) and for Lightning's checkpoint
file layer, wraps the loader's ``exec_module`` so that ``faultlab.runtime.auto.on_import(module)``
runs right after the module's own code, before any other module can ``from ... import`` a name
of it. The finder steps out of ``sys.meta_path`` once all of them have been imported; until then
it costs one set lookup per import.

Independently of level 0, in *any* Python process whose environment names a GPU state file
(``FAULTLAB_GPU_STATE``: faultlab sets it on every node of an experiment with a gpu fault, at
every integration level, and a subprocess inherits it) the same finder hooks ``torch`` and
``pynvml``: after ``import torch``, ``faultlab.runtime.gpu.install()`` (a rank's in-rank gpu
faults); after ``import pynvml``, ``faultlab.runtime.nvml_overlay.apply`` (what NVML shows of
them, to the trainer and to a health-check script alike).

Then it chains: the next ``sitecustomize`` on ``sys.path`` (a user's, the distribution's) runs as
if this file were not there. Whatever goes wrong inside the bootstrap is written to stderr as
one line starting with ``faultlab bootstrap:`` and the user's program goes on.

This file imports only the standard library; it must run under any interpreter faultlab
starts.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import time
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

__all__ = ["GPU_HOOKED_MODULES", "HOOKED_MODULES", "PostImportFinder", "chain", "report",
           "should_activate"]

#: Modules after whose import ``faultlab.runtime.auto.on_import`` runs: torch, DCP, and the
#: modules of ``faultlab.runtime.auto_checkpoints.FRAMEWORK_SAVES`` (Lightning's file layer).
HOOKED_MODULES = ("torch", "torch.distributed.checkpoint",
                  "torch.distributed.checkpoint.state_dict",
                  "lightning_fabric.utilities.cloud_io", "lightning.fabric.utilities.cloud_io")
_WORKER_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
_PID_KEY = "FAULTLAB_BOOTSTRAP_PID"
_HERE = os.path.dirname(os.path.realpath(__file__))
T_BOOTSTRAP = time.time()


def report(where: str, error: BaseException) -> None:
    """One line on stderr; never raises."""
    try:
        text = f"{type(error).__name__}: {error}".replace("\n", " | ")
        sys.stderr.write(f"faultlab bootstrap: {where}: {text}\n")
        sys.stderr.flush()
    except Exception:  # a closed stderr must not break the user's program either
        pass


def should_activate(env: Mapping[str, str], pid: int) -> bool:
    """Whether this process is a torchrun worker that faultlab launched for level 0."""
    if not env.get("FAULTLAB_RUN_DIR") or env.get("FAULTLAB_BOOTSTRAP") != "1":
        return False
    if not all(env.get(k) for k in _WORKER_KEYS):
        return False  # the torchrun agent, or python started by hand
    owner = env.get(_PID_KEY)
    return not owner or owner == str(pid)  # same pid: an exec of the worker itself


class PostImportFinder:
    """A ``sys.meta_path`` finder that runs ``callback(module)`` after each of ``names`` has
    been executed. It finds nothing itself: it asks the finders after it, then wraps the found
    loader's ``exec_module`` (on that loader instance only, and only for that one call)."""

    def __init__(self, names: tuple[str, ...],
                 callback: Callable[[ModuleType], None]) -> None:
        self.pending = set(names)
        self.callback = callback

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.pending:
            return None
        self.pending.discard(fullname)
        if not self.pending:
            self.uninstall()
        spec = None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec  # namespace package or a legacy loader: imported without the hook
        callback = self.callback

        def exec_then_hook(module: ModuleType) -> None:
            try:
                exec_module(module)
            finally:
                loader.__dict__.pop("exec_module", None)  # back to the class's method
            try:
                callback(module)
            except Exception as e:
                report(f"after importing {module.__name__}", e)

        try:
            loader.exec_module = exec_then_hook  # type: ignore[union-attr]
        except (AttributeError, TypeError) as e:  # a loader with __slots__
            report(f"cannot hook the import of {fullname}", e)
        return spec

    def install(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def uninstall(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass


def _on_import(module: ModuleType) -> None:
    from faultlab.runtime import auto

    auto.on_import(module, t_bootstrap=T_BOOTSTRAP)


GPU_HOOKED_MODULES = ("torch", "pynvml")


def _on_gpu_import(module: ModuleType) -> None:
    if module.__name__ == "torch":
        from faultlab.runtime import gpu

        gpu.install()
    elif module.__name__ == "pynvml":
        from faultlab.runtime import nvml_overlay

        nvml_overlay.apply(module)


def _callback(level0: bool, gpu: bool) -> Callable[[ModuleType], None]:
    def on_import(module: ModuleType) -> None:
        if level0 and module.__name__ in HOOKED_MODULES:
            _on_import(module)
        if gpu and module.__name__ in GPU_HOOKED_MODULES:
            try:
                _on_gpu_import(module)
            except Exception as e:
                report(f"gpu faults, after importing {module.__name__}", e)
    return on_import


def chain() -> None:
    """Run the next ``sitecustomize`` on ``sys.path``: the one this file shadows."""
    try:
        here = os.path.normcase(_HERE)
        rest = [p for p in sys.path
                if os.path.normcase(os.path.realpath(p or os.curdir)) != here]
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    except Exception as e:
        report("looking for the next sitecustomize", e)
        return
    if spec is None or spec.loader is None:
        return
    if spec.origin and os.path.normcase(os.path.dirname(os.path.realpath(spec.origin))) == here:
        return  # a symlink back to this very file
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module  # the user's module is *the* sitecustomize
    spec.loader.exec_module(module)


def _main() -> None:
    try:
        level0 = should_activate(os.environ, os.getpid())
        gpu = bool(os.environ.get("FAULTLAB_GPU_STATE"))
        if level0:
            os.environ[_PID_KEY] = str(os.getpid())
        names = (HOOKED_MODULES if level0 else ()) + (GPU_HOOKED_MODULES if gpu else ())
        if names:
            callback = _callback(level0, gpu)
            finder = PostImportFinder(tuple(dict.fromkeys(names)), callback)
            already = [sys.modules[n] for n in finder.pending if n in sys.modules]
            finder.pending.difference_update(m.__name__ for m in already)
            if finder.pending:
                finder.install()
            for module in already:  # a chained sitecustomize cannot have done it yet; a
                callback(module)    # python -X importtime ... could have
    except Exception as e:
        report("activation", e)
    chain()  # an error in the user's sitecustomize is reported by site, as it would be


if __name__ == "sitecustomize":
    _main()
