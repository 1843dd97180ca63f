"""The collective interposer: every ``torch.distributed`` collective passes through here first.

Why attribute replacement works, even after the model is built: FSDP2
(``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py`` in torch 2.13) calls
``dist.all_gather_single``, ``dist.reduce_scatter_single`` and ``dist.all_reduce`` (HSDP) as
attributes of the ``torch.distributed`` module *at call time*, DTensor calls
``funcol.all_reduce`` & co. the same way, and trainers write ``dist.all_reduce(...)``. So
``install()`` replaces those attributes of ``torch.distributed``,
``torch.distributed.distributed_c10d`` and ``torch.distributed._functional_collectives`` with
thin wrappers, and — for code that did ``from torch.distributed import all_reduce`` before
``install()`` — also every other loaded module attribute bound to the very same function object
(DTensor's ``_collective_utils`` binds ``broadcast`` and ``scatter`` that way). A module imported
*after* ``install()`` gets the wrappers. Only a function object captured elsewhere before
``install()`` (a closure, a dict) escapes: install early if that matters.

The fast path of a wrapper, with nothing injected, is: a thread-local depth check, a counter
increment, a check that the active-fault tuple is empty. Nested calls (``all_gather_object``
calls ``all_gather``; the deprecated ``all_gather_into_tensor`` calls ``all_gather_single``)
are counted and faulted once, under the outermost name. Under ``torch.compile`` tracing the
wrappers step aside (dynamo maps the original functions to functional collectives by
identity).

The interposer keeps nothing alive that the trainer would not: a chaos tool must not change the
behaviour it judges. (Until issue 38 every wrapper kept aliases of the last 16 calls' CPU
tensors through interpreter exit, which hid torch 2.13's gloo abort at exit from the trainer's
golden run; that abort is now a finding, ``abort_at_exit`` in
:mod:`faultlab.observe.launch_findings`, with the fix a team applies.)

Faults act on the host before the collective is issued, which is one code path for every
backend. On gloo that delays/blocks the collective itself; on NCCL (asynchronous kernels on
CUDA streams) it delays/blocks the *enqueue*, so the GPU stream idles and peers block inside
their kernels — the same effect as a slow or dead peer, seen from the other ranks.
"""

from __future__ import annotations

import inspect
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

__all__ = ["C10D_OPS", "FUNCOL_OPS", "OP_NAMES", "Call", "Striker", "counts", "install",
           "installed", "set_faults", "uninstall"]

#: Every operation the interposer can intercept: ``torch.distributed`` functions by their own
#: name, ``torch.distributed._functional_collectives`` (what DTensor uses) as ``funcol.<name>``.
C10D_OPS: tuple[str, ...] = (
    "all_gather_single", "reduce_scatter_single", "all_gather_into_tensor",
    "reduce_scatter_tensor", "_all_gather_base", "_reduce_scatter_base", "all_reduce",
    "all_reduce_coalesced", "broadcast", "reduce", "barrier", "monitored_barrier", "all_gather",
    "all_gather_coalesced", "all_gather_object", "gather", "gather_object", "scatter",
    "scatter_object_list", "broadcast_object_list", "reduce_scatter", "all_to_all",
    "all_to_all_single", "send", "recv", "isend", "irecv", "batch_isend_irecv",
    "send_object_list", "recv_object_list",
)
FUNCOL_OPS: tuple[str, ...] = (
    "broadcast", "all_reduce", "all_gather_single", "reduce_scatter_single",
    "all_gather_tensor", "reduce_scatter_tensor", "all_reduce_coalesced",
    "all_gather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced",
    "all_gather_single_coalesced", "reduce_scatter_single_coalesced", "all_to_all_single",
    "all_gather_single_autograd", "reduce_scatter_single_autograd",
    "all_gather_tensor_autograd", "reduce_scatter_tensor_autograd", "all_to_all_single_autograd",
)
OP_NAMES: tuple[str, ...] = C10D_OPS + tuple(f"funcol.{n}" for n in FUNCOL_OPS)


class Striker(Protocol):
    """An active collective fault, as the interposer sees it (a ``RankAction``)."""

    def matches(self, op: str) -> bool: ...

    def before_collective(self, call: Call) -> None:
        """Called before the collective is issued: may sleep, block or raise."""


class _Local(threading.local):
    depth = 0


class _State:
    __slots__ = ("faults",)

    def __init__(self) -> None:
        self.faults: tuple[Striker, ...] = ()


_LOCAL = _Local()
_STATE = _State()
_COUNTS: dict[str, int] = dict.fromkeys(OP_NAMES, 0)
_LOCK = threading.Lock()
_PATCHES: list[tuple[object, str, Any]] = []  # (module, attribute, original) to undo
_SIGNATURES: dict[str, inspect.Signature | None] = {}


def installed() -> bool:
    return bool(_PATCHES)


def counts() -> dict[str, int]:
    """Calls intercepted so far in this process, per operation (operations never called
    are left out)."""
    return {op: n for op, n in _COUNTS.items() if n}


def set_faults(faults: Sequence[Striker]) -> None:
    """Publish the active collective faults (replaced as a whole: readers never lock)."""
    _STATE.faults = tuple(faults)


class Call:
    """One intercepted call; the group, its ranks and the backend are resolved on demand
    (only when a fault needs them, never on the fast path)."""

    __slots__ = ("_participants", "args", "fn", "kwargs", "op")

    def __init__(self, op: str, fn: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> None:
        self.op, self.fn, self.args, self.kwargs = op, fn, args, kwargs
        self._participants: list[int] | None = None

    def argument(self, name: str) -> Any:
        sig = _SIGNATURES.get(self.op, ...)
        if sig is ...:
            try:
                sig = _SIGNATURES[self.op] = inspect.signature(self.fn)
            except (TypeError, ValueError):
                sig = _SIGNATURES[self.op] = None
        if sig is None:
            return self.kwargs.get(name)
        try:
            return sig.bind_partial(*self.args, **self.kwargs).arguments.get(name)
        except TypeError:
            return self.kwargs.get(name)

    @property
    def group(self) -> Any:
        return self.argument("group")

    def participants(self) -> list[int]:
        """Global ranks taking part: the group's ranks; for point-to-point, self and peer."""
        if self._participants is None:
            self._participants = self._resolve_participants()
        return self._participants

    def _resolve_participants(self) -> list[int]:
        import torch.distributed as dist

        me = dist.get_rank()
        if self.op.startswith("funcol."):
            from torch.distributed import _functional_collectives as funcol
            try:
                return list(funcol._expand_group(self.group)[1])
            except Exception:  # an exotic group form: assume the whole world
                return list(range(dist.get_world_size()))
        if self.op in ("send", "isend", "send_object_list", "recv", "irecv", "recv_object_list"):
            peer = self.argument("dst" if "send" in self.op else "src")
            if peer is None:
                gpeer = self.argument("group_dst" if "send" in self.op else "group_src")
                if gpeer is not None:
                    peer = dist.get_global_rank(self.group or dist.group.WORLD,  # type: ignore[arg-type]
                                               gpeer)
            if peer is not None:
                return sorted({me, int(peer)})
        if self.op == "batch_isend_irecv":
            ops = self.argument("p2p_op_list") or []
            return sorted({me, *(int(p.peer) for p in ops)})
        return list(dist.get_process_group_ranks(self.group))

    def backend(self) -> str:
        import torch.distributed as dist

        group = self.group if not self.op.startswith("funcol.") else None
        try:
            return str(dist.get_backend(group))
        except Exception:
            return "unknown"


def _strike(op: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
            faults: tuple[Striker, ...]) -> None:
    call = Call(op, fn, args, kwargs)
    for fault in faults:
        if fault.matches(op):
            fault.before_collective(call)


def _wrap(op: str, fn: Callable[..., Any], is_compiling: Callable[[], bool]
          ) -> Callable[..., Any]:
    local, state, counter = _LOCAL, _STATE, _COUNTS

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if is_compiling():
            return fn(*args, **kwargs)
        if local.depth:
            return fn(*args, **kwargs)
        counter[op] += 1
        local.depth = 1
        try:
            faults = state.faults
            if faults:
                _strike(op, fn, args, kwargs, faults)
            return fn(*args, **kwargs)
        finally:
            local.depth = 0

    for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(wrapper, attr, getattr(fn, attr, None))
    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    wrapper.__faultlab_op__ = op  # type: ignore[attr-defined]
    return wrapper


def install() -> bool:
    """Interpose on every collective (idempotent). False if torch.distributed is unavailable."""
    with _LOCK:
        if _PATCHES:
            return True
        import torch
        import torch.distributed as dist

        if not dist.is_available():
            return False
        from torch.distributed import _functional_collectives as funcol
        from torch.distributed import distributed_c10d as c10d

        is_compiling = torch.compiler.is_compiling
        by_id: dict[int, tuple[Any, Callable[..., Any]]] = {}
        names: set[str] = set()
        for module, prefix, ops in ((c10d, "", C10D_OPS), (funcol, "funcol.", FUNCOL_OPS)):
            for name in ops:
                fn = getattr(module, name, None)
                if fn is None or hasattr(fn, "__faultlab_op__"):
                    continue
                by_id[id(fn)] = (fn, _wrap(prefix + name, fn, is_compiling))
                names.add(name)
        # Rebind every module attribute that *is* one of the originals (the identity check makes
        # funcol.all_reduce and dist.all_reduce, same name, map to their own wrappers).
        for module in list(sys.modules.values()):
            try:  # a lazy or proxy "module" may do anything on attribute access
                namespace = getattr(module, "__dict__", None)
            except Exception:
                continue
            if not isinstance(namespace, dict) or module is sys.modules[__name__]:
                continue
            for name in names:
                value = namespace.get(name)
                hit = by_id.get(id(value)) if value is not None else None
                if hit is not None and hit[0] is value:
                    _PATCHES.append((module, name, value))
                    setattr(module, name, hit[1])
        return True


def uninstall() -> None:
    """Put every original back (tests and the benchmark; a trainer never needs this)."""
    with _LOCK:
        while _PATCHES:
            module, name, original = _PATCHES.pop()
            setattr(module, name, original)
        _STATE.faults = ()
