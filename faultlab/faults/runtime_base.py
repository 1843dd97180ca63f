"""Base of the faults that strike inside a rank, through its runtime agent (``faultlab.runtime``).

A runtime fault exists in two forms that carry the same JSON entry:

- planned before launch: ``plan_entry(fault_id, ranks, steps)`` is one entry of the plan file
  every rank reads at start (``FAULTLAB_RUNTIME_PLAN``) — deterministic, step-exact, survives
  restarts (fire-once markers keep a replayed step from striking again);
- injected live: ``inject`` sends ``{"op": "inject", "fault": entry}`` to each victim rank's
  agent through ``ctx.runtime(rank, message)`` (the engine adds the run's secret); numeric faults
  strike at that rank's next step, collective faults at once. ``undo`` sends ``{"op": "undo"}``
  to the same ranks; a rank that is gone has nothing left to undo.

The entry names the fault's rank-side action by import path (``rank_action``, a
``faultlab.runtime.hooks.RankAction``: imported by the rank only, never here) and carries its
``params``, validated once, here, by the fault's ``Params`` model, complete with every default:
the rank checks the entry's shape only. ``strikes`` says how the engine may plan it: ``at_step``
(strikes at its steps, once per step for the whole job) or ``window`` (active over a window of
steps); it must match the action's own ``strikes`` (a test checks every registered fault).
"""

from __future__ import annotations

import uuid
import zlib
from typing import Any, ClassVar, Protocol, runtime_checkable

from faultlab.errors import FaultError
from faultlab.fault_api import Fault, FaultContext, FaultParams, Victim

__all__ = ["RuntimeContext", "RuntimeFault", "RuntimeFaultParams"]


@runtime_checkable
class RuntimeContext(Protocol):
    def runtime(self, rank: int, message: dict[str, Any]) -> dict[str, Any]:
        """Send ``message`` to ``rank``'s runtime agent; return its reply."""


class RuntimeFaultParams(FaultParams):
    """Params of a runtime fault: what its rank-side action gets, already validated."""

    def runtime_params(self) -> dict[str, Any]:
        """Every parameter the action reads, defaults included (None stays None); a subclass
        leaves out those that are faultlab's only."""
        return self.model_dump(mode="json")


class RuntimeFault(Fault):
    """A fault carried out by the runtime agent inside the victim ranks."""

    targets: ClassVar[tuple[str, ...]] = ("rank", "node", "all")
    strikes: ClassVar[str] = "at_step"
    """``at_step`` or ``window``, as its action's (``faultlab.runtime.hooks``)."""
    planned_from_step: ClassVar[bool] = False
    """A ``window`` fault that the launch plan holds from its ``at_step`` trigger to the end of
    the job when its parameters give no ``num_steps`` (``sdc``: a bad device stays bad)."""
    params: RuntimeFaultParams

    def __init__(self, params: FaultParams) -> None:
        super().__init__(params)
        self.fault_id = f"{self.type}-{uuid.uuid4().hex[:8]}"
        """Id of the live injection (keys the runtime's fire-once markers and the undo); the
        engine may set its own (the experiment's fault id) before ``inject``."""
        self._sent: list[int] = []

    def _params(self, fault_id: str) -> dict[str, Any]:
        params = self.params.runtime_params()
        if "seed" in type(self.params).model_fields and params.get("seed") is None:
            params["seed"] = zlib.crc32(fault_id.encode())  # deterministic given the id
        return params

    def plan_entry(self, fault_id: str, ranks: list[int] | None,
                   steps: list[int] | None) -> dict[str, Any]:
        """The entry for a launch plan (``faultlab.runtime.write_plan``) or a live inject."""
        if not self.rank_action:
            raise FaultError(f"{self.type}: {type(self).__name__} names no rank_action")
        return {"id": fault_id, "type": self.type, "action": self.rank_action, "ranks": ranks,
                "steps": steps, "params": self._params(fault_id)}

    def victim_ranks(self, ctx: FaultContext, victim: Victim) -> list[int]:
        if victim.kind == "all":
            return ctx.ranks()
        if victim.kind == "node":
            node = ctx.node_names()[int(victim.value or 0)]
            return [r for r in ctx.ranks() if ctx.node_of_rank(r) == node]
        return [int(victim.value or 0)]

    def inject(self, ctx: FaultContext, victim: Victim) -> dict[str, Any]:
        send = _runtime(ctx, self.type)
        ranks = self.victim_ranks(ctx, victim)
        if not ranks:
            raise FaultError(f"{self.type}: {victim} has no rank to inject into (yet)")
        messages = {rank: {"op": "inject", "fault": self.plan_entry(self.fault_id, [rank], None)}
                    for rank in ranks}
        self._sent.extend(ranks)  # before sending: undo must reach a half-injected rank
        replies = {}
        for rank, reply in _fan_out(ctx, send, messages).items():
            if isinstance(reply, FaultError | ValueError):
                raise FaultError(f"{self.type} {self.fault_id!r}: rank {rank}: {reply}")
            if not reply.get("ok"):
                raise FaultError(f"{self.type} {self.fault_id!r}: rank {rank}'s runtime agent "
                                 f"refused the fault: {reply.get('error')}")
            replies[rank] = reply.get("applies_at")
        return {"fault_id": self.fault_id, "ranks": ranks, "applies_at": replies}

    def undo(self, ctx: FaultContext) -> dict[str, Any]:
        """An ``undo`` message to the runtime agent of every rank it was sent to: the rule is
        lifted inside the rank (a held collective goes on); a rank that died or restarted
        since holds nothing."""
        if not self._sent:
            return {}
        send = _runtime(ctx, self.type)
        undone: list[int] = []
        gone: list[int] = []
        messages = {rank: {"op": "undo", "id": self.fault_id} for rank in sorted(set(self._sent))}
        for rank, reply in sorted(_fan_out(ctx, send, messages).items()):
            # a rank that died or restarted: nothing to undo
            ok = not isinstance(reply, FaultError | ValueError) and reply.get("ok")
            (undone if ok else gone).append(rank)
        self._sent = []
        return {"fault_id": self.fault_id, "undone_ranks": undone, "unreachable_ranks": gone}


def _fan_out(ctx: FaultContext, send: Any, messages: dict[int, dict[str, Any]]
             ) -> dict[int, Any]:
    """Each rank's reply (or the error that says why there is none): all at once through the
    target's ``runtime_many`` (one message per node over the relays), else one by one."""
    many = getattr(ctx, "runtime_many", None)
    if many is not None:
        return dict(many(messages))
    out: dict[int, Any] = {}
    for rank, message in messages.items():
        try:
            out[rank] = send(rank, message)
        except (FaultError, ValueError) as e:
            out[rank] = e
    return out


def _runtime(ctx: FaultContext, fault_type: str) -> Any:
    if not isinstance(ctx, RuntimeContext):
        raise FaultError(f"{fault_type} needs a target whose context can reach the runtime "
                         f"agent (FaultContext.runtime); {type(ctx).__name__} cannot")
    return ctx.runtime
