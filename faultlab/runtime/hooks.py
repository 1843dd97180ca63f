"""The rank-side API of in-rank faults: a fault's action, and the hooks it hangs on.

A fault that strikes inside a rank names its action by import path on the faultlab side
(``Fault.rank_action = "package.module:Class"``); every plan entry and live inject carries that
path and the parameters, validated once, by the fault's ``Params`` model, before they leave
faultlab. The rank imports the action's module only when a plan or a live inject names it
(:func:`load_action`), and never imports pydantic or the engine: an action module imports
this module, the standard library and torch.

An action is a :class:`RankAction` subclass. It overrides the hooks it needs; the agent calls
only those (a hook left as the base's costs nothing):

``on_step_start(step)``
    At the start of step ``step`` (``rt.step(step)``; at level 0, before the step's first
    forward), before anything of the step has run. ``weight_bitflip`` flips bits here.
``grads_to_watch()`` and ``on_grads_ready(name, param)``
    ``grads_to_watch`` (called right after ``on_step_start``) lists ``(name, parameter)``
    pairs; ``on_grads_ready`` is then called for each as soon as its local gradient is final
    in this step's backward (a post-accumulate-grad hook: after FSDP2's reduce-scatter, before
    clipping and the optimizer). The hooks are removed at the next step. ``grad_nan``,
    ``grad_inf``.
``on_loss(loss)``
    The trainer's loss passes through it (``rt.loss(loss)``); returns the loss to use.
    ``loss_spike``. Level 0 never sees the loss: there the agent reports such an action as
    failed.
``before_optimizer_step(optimizer)``
    Right before the optimizer given to ``attach`` steps, in the armed step (a torch optimizer
    step pre-hook, removed at the next step). Where ``attach`` got no optimizer, and at level 0,
    it is torch's global optimizer-step pre-hook instead, registered for the armed step only:
    at level 0 it meets the primary optimizer (the first that stepped), otherwise every
    optimizer that steps in that step.
``after_optimizer_step(optimizer)``
    Right after the optimizer step (a torch optimizer step post-hook, on the same optimizer
    ``before_optimizer_step`` meets: the one given to ``attach``, else the global hook; at
    level 0 a post-hook on the primary optimizer itself, so it runs before the level-0 step
    record is written). ``sdc`` on ``update``.
``modules_to_watch()`` and ``after_module_forward(name, module, args, output)``
    ``modules_to_watch`` lists ``(name, module)`` pairs of the model's modules (at level 0 the
    module of the first training forward: ``named_modules()`` of the model the action sees);
    ``after_module_forward`` is a forward hook on each and may return a replacement output.
    ``sdc`` on ``activation``.
``grads_before_reduce()`` and ``on_local_grad(name, grad)``
    ``grads_before_reduce`` lists ``(name, parameter)`` pairs; ``on_local_grad`` is a tensor
    hook on each (``param.register_hook``): it sees the gradient autograd computed for that
    parameter before it is accumulated into ``.grad``, so before DDP's bucket all-reduce, and
    may return a replacement. A sharded FSDP2 parameter never sees it (its gradient reaches it
    through the reduce-scatter, which ``before_collective`` meets). ``sdc`` on ``gradient``.
``before_collective(call)``
    Before each matching ``torch.distributed`` collective is issued (``matches(op)`` says
    which: by default the ``ops`` parameter, fnmatch patterns, all when None). It may sleep,
    block or raise; ``call`` is a :class:`faultlab.runtime.interposer.Call`. The collective
    faults.
``before_forward(module)`` and ``after_forward(module, forward_s)``
    Around the rank's *outermost* module forward (FSDP2's root, a LightningModule's model):
    the rank's "next accelerator operation", a stand-in for the first kernel a step launches.
    ``before_forward`` may raise (what torch raises for a failed device); ``after_forward``
    gets the forward's compute time (its wall time less the time the rank's thread waited for
    a CPU; it may stretch the compute). The GPU faults, whose actions a node's GPU state file
    names (``faultlab.runtime.gpu``), not a plan.
``after_backward(module, backward_s)``
    At the end of the backward pass through that forward's output (the autograd engine's
    final callback), with the backward's compute time, measured the same way. A GPU fault's
    too.
``release()``
    Undone, its window over, or the process closing: stop striking, let go of anything held
    (a blocked collective); returns the counters of its ``fault_undone`` event.

When it strikes, an action calls ``self.rank.struck(**details)``: the first strike emits the
``fault_injected`` event and records the fire-once marker. ``self.rank.failed(error)`` (or
raising :class:`ActionError` from a hook called at step start) reports ``fault_failed``.

The hooks an action registers on the model (``grads_to_watch``, ``modules_to_watch``,
``grads_before_reduce``) and on the optimizer live as long as it does: an at-step action's
until the next step, a window action's until its window ends or it is undone.

Scheduling is the action's class attributes:

``strikes = "at_step"``
    Armed at each step of the entry's ``steps`` / ``from_step``..``to_step`` (a plan entry must
    name one; a live one without steps arms at the next step), and at most once per
    (fault id, rank, step) for the whole job: a rollback or a restarted process replaying the
    step is not struck again. A fresh instance per armed step.
``strikes = "window"``
    Active over every step of its window (a live one: from now until undone); one instance for
    as long as it is active. ``once_per_job = True``: a planned one that struck in one process
    does not strike again in a restarted one, nor in a replayed window.
"""

from __future__ import annotations

import fnmatch
import importlib
import threading
from typing import Any, ClassVar, Protocol

from faultlab.errors import ActionError, PlanError
from faultlab.runtime.plan import FaultEntry

__all__ = ["HOOKS", "ActionError", "Rank", "RankAction", "load_action", "uses"]

HOOKS = ("on_step_start", "grads_to_watch", "on_grads_ready", "on_loss",
         "before_optimizer_step", "after_optimizer_step", "modules_to_watch",
         "after_module_forward", "grads_before_reduce", "on_local_grad", "before_collective",
         "before_forward", "after_forward", "after_backward")



class Rank(Protocol):
    """What an action sees of its rank (given as ``self.rank``)."""

    rank: int
    live: bool
    """Injected live (not from the launch plan)."""

    @property
    def step(self) -> int:
        """The step under way (as last passed to ``rt.step``)."""

    @property
    def model(self) -> Any:
        """The model given to ``attach`` (at level 0: a view of the optimizer's parameters
        with ``named_parameters()``); None if there is none."""

    @property
    def optimizer(self) -> Any: ...

    @property
    def device(self) -> int | None:
        """The rank's local accelerator index (``LOCAL_RANK``), where known."""

    @property
    def node(self) -> str:
        """The node this process runs on (``FAULTLAB_NODE``, else the host name)."""

    def claim(self, key: str) -> bool:
        """True the first time ``key`` is claimed in this job (a marker on disk: a restarted
        process gets False), False after: for an action that strikes once per job."""

    def struck(self, **details: Any) -> None:
        """This action struck: the first call emits ``fault_injected`` with ``details`` and
        records the fire-once marker; later calls only count."""

    def failed(self, error: str) -> None:
        """This action cannot strike here: emits ``fault_failed``."""

    def record(self, kind: str, **fields: Any) -> None:
        """Emit one more event of this fault (``fault_struck``), with its ``fault_id``,
        ``type``, ``step`` and ``rank`` (``fields`` may set ``step`` and ``t``)."""

    def mark_node(self) -> None:
        """Mark this process's node as holding this fault, for the whole job (a file under
        the run directory every process of the job sees)."""

    def node_marked(self) -> bool:
        """Has this fault marked this process's node (:meth:`mark_node`, any process)?"""


class RankAction:
    """Base of a fault's rank-side action (see the module docstring)."""

    strikes: ClassVar[str] = "at_step"
    """``"at_step"`` or ``"window"``."""
    once_per_job: ClassVar[bool] = False
    """A window action that strikes once per job (hang, error, partition)."""
    needs_model: ClassVar[bool] = False
    """Refused with ``fault_failed`` when the trainer gave no model."""

    def __init__(self, entry: FaultEntry, rank: Rank) -> None:
        self.entry, self.rank = entry, rank
        self.params: dict[str, Any] = entry.params
        self.released = threading.Event()
        self.num_struck = 0
        """Strikes so far (kept by ``rank.struck``)."""
        ops = self.params.get("ops")
        self._ops: tuple[str, ...] | None = None if ops is None else tuple(ops)
        self._match: dict[str, bool] = {}

    # --- the hooks ----------------------------------------------------------------------------

    def on_step_start(self, step: int) -> None:
        return None

    def grads_to_watch(self) -> list[tuple[str, Any]]:
        return []

    def on_grads_ready(self, name: str, param: Any) -> None:
        return None

    def on_loss(self, loss: Any) -> Any:
        return loss

    def before_optimizer_step(self, optimizer: Any) -> None:
        return None

    def after_optimizer_step(self, optimizer: Any) -> None:
        return None

    def modules_to_watch(self) -> list[tuple[str, Any]]:
        return []

    def after_module_forward(self, name: str, module: Any, args: Any, output: Any) -> Any:
        return None

    def grads_before_reduce(self) -> list[tuple[str, Any]]:
        return []

    def on_local_grad(self, name: str, grad: Any) -> Any:
        return None

    def matches(self, op: str) -> bool:
        """Does ``before_collective`` want operation ``op``?"""
        hit = self._match.get(op)
        if hit is None:
            hit = self._match[op] = self._ops is None or any(
                fnmatch.fnmatchcase(op, pattern) for pattern in self._ops)
        return hit

    def before_collective(self, call: Any) -> None:
        return None

    def before_forward(self, module: Any) -> None:
        return None

    def after_forward(self, module: Any, forward_s: float) -> None:
        return None

    def after_backward(self, module: Any, backward_s: float) -> None:
        return None

    # --- its life -----------------------------------------------------------------------------

    def release(self) -> dict[str, Any]:
        """Stop striking and let go of what is held; the counters for ``fault_undone``."""
        self.released.set()
        return self.summary()

    def summary(self) -> dict[str, Any]:
        return {"id": self.entry.id, "type": self.entry.type, "live": self.rank.live,
                "num_struck": self.num_struck, "released": self.released.is_set()}


def uses(cls: type[RankAction], hook: str) -> bool:
    """Does ``cls`` override ``hook`` (the agent calls only the hooks an action uses)?"""
    return getattr(cls, hook) is not getattr(RankAction, hook)


_LOADED: dict[str, type[RankAction]] = {}


def load_action(path: str) -> type[RankAction]:
    """The action class at ``"package.module:Class"``, imported now (once per process)."""
    cls = _LOADED.get(path)
    if cls is not None:
        return cls
    module_name, _, name = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise PlanError(f"action {path!r} cannot be loaded in this rank: {e}") from None
    if not (isinstance(obj, type) and issubclass(obj, RankAction)):
        raise PlanError(f"action {path!r} is not a faultlab.runtime.hooks.RankAction subclass")
    if obj.strikes not in ("at_step", "window"):
        raise PlanError(f"action {path!r}: strikes {obj.strikes!r} is not at_step or window")
    _LOADED[path] = obj
    return obj
