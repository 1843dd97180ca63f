"""Slurm faults: what the scheduler itself does to a job (``topology.launcher: slurm``).

- ``slurm_node_down``: the scheduler's view of a failed or drained node (``scontrol update
  state=down|drain``). Slurm requeues the job (or, with ``--no-kill``, shrinks it): this tests
  the team's requeue, ``--no-kill`` and hot-spare set-up. It changes the node for every user
  of the cluster, so it needs operator rights and ``slurm.allow_node_state_changes: true``;
  the node is always resumed on undo, when the experiment ends, and by the guard if faultlab
  dies.
- ``slurm_preempt``: Slurm's own preemption notice. ``scancel --signal=TERM|USR1`` (to every
  process of every step, or ``batch: true`` to the batch shell, as ``#SBATCH
  --signal=B:USR1@120`` does), then after ``grace_s`` the job is requeued (``scontrol
  requeue``), as ``PreemptMode=REQUEUE`` does once ``GraceTime`` has passed. It tests that the
  trainer's signal handler saves before the kill, and that the requeued job resumes from it.
  ``scancel`` returns before the signal is delivered (slurmctld forwards it to each node's
  slurmd; 0.01-0.3 s on the 2-core test cluster under load), so the injection waits until every
  rank has reported its ``preemption_notice`` (at most ``NOTICE_WAIT_S`` or the grace time):
  with ``at_step: N`` the ranks are then still at step N's gate, and a trainer that saves the
  last completed step on the notice saves step N, on every run.
"""

from __future__ import annotations

import threading
import time
from typing import Any, ClassVar, Literal

from pydantic import Field

from faultlab.errors import FaultError
from faultlab.fault_api import Fault, FaultContext, FaultParams, SlurmController, Victim, require

__all__ = ["SlurmNodeDownFault", "SlurmPreemptFault"]

NOTICE_WAIT_S = 5.0
"""How long ``slurm_preempt`` waits for the ranks to report the signal (a trainer that reports
no ``preemption_notice`` costs this once per injection)."""


def _notices(ctx: Any, since_t: float, timeout_s: float) -> dict[str, Any]:
    """Wait until every rank of the job has reported a ``preemption_notice`` after
    ``since_t``; returns each rank's delivery time in seconds, and the ranks still missing."""
    ranks = set(ctx.ranks())
    deadline = time.monotonic() + timeout_s
    seen: dict[int, float] = {}
    while True:
        if not ctx.attached:  # an attached job's stream is polled by ranks() (refresh)
            ctx.stream.poll()
        for e in ctx.stream.of_kind("preemption_notice"):
            if e["t"] >= since_t and isinstance(e.get("rank"), int):
                seen.setdefault(e["rank"], round(e["t"] - since_t, 4))
        if ranks <= set(seen) or time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    return {"notice_delivered_s": {str(r): s for r, s in sorted(seen.items())},
            "notice_missing": sorted(ranks - set(seen))}


def _slurm(ctx: FaultContext, what: str) -> SlurmController:
    slurm: SlurmController = require(ctx, "slurm_controller", what)
    return slurm


class SlurmNodeDownFault(Fault):
    """Set a node of the job down (or drain it) in Slurm: the scheduler's view of a failure."""

    type = "slurm_node_down"
    family = "scheduler"
    loses_node: ClassVar[bool] = True
    reversible = True
    targets: ClassVar[tuple[str, ...]] = ("node",)
    needs: ClassVar[tuple[str, ...]] = ("slurm_controller",)

    class Params(FaultParams):
        state: Literal["down", "drain"] = Field(
            "down", description="down: the job is killed there (and requeued, by default); "
                                "drain: running jobs go on, nothing new starts there")
        reason: str = Field("faultlab chaos", description="the reason Slurm shows (sinfo -R)")

    params: Params

    @classmethod
    def refuses(cls, topology: Any) -> str | None:
        settings = getattr(topology, "settings", None)  # the Slurm target's (slurm: block)
        if settings is not None and not getattr(settings, "allow_node_state_changes", True):
            return ("it changes the node for every user of the cluster: set "
                    "topology.slurm.allow_node_state_changes: true (and run as a Slurm "
                    "operator)")
        return None

    def __init__(self, params: FaultParams) -> None:
        super().__init__(params)
        self._down: list[str] = []

    def inject(self, ctx: FaultContext, victim: Victim) -> dict[str, Any]:
        slurm = _slurm(ctx, "slurm_node_down")
        nodes = ctx.node_names()
        if int(victim.value or 0) >= len(nodes):
            raise FaultError(f"node {victim.value}: the job holds {len(nodes)} node(s) now "
                             f"({', '.join(nodes) or 'none: not running'})")
        node = nodes[int(victim.value or 0)]
        self._down.append(node)
        p = self.params
        slurm.set_node_state(node, p.state, f"{p.reason} (job {slurm.job_id})")
        return {"node": node, "state": p.state, "job_state": slurm.state(),
                "at_t": time.time()}

    def undo(self, ctx: FaultContext) -> dict[str, Any]:
        """``scontrol update nodename=N state=resume`` for every node it set down or
        drained."""
        if not self._down:
            return {"resumed": []}
        slurm = _slurm(ctx, "resuming a node")
        resumed = [n for n in self._down if slurm.resume_node(n)]
        self._down = []
        return {"resumed": resumed}


class SlurmPreemptFault(Fault):
    """Slurm's preemption: a signal to the job, then a requeue once the grace time is over."""

    type = "slurm_preempt"
    family = "scheduler"
    targets: ClassVar[tuple[str, ...]] = ("all",)
    needs: ClassVar[tuple[str, ...]] = ("slurm_controller",)

    class Params(FaultParams):
        signal: Literal["TERM", "USR1", "USR2", "INT"] = Field(
            "TERM", description="the notice: TERM is what preemption sends; USR1 what "
                                "#SBATCH --signal=USR1@SECONDS sends")
        batch: bool = Field(False, description="signal only the batch shell (--batch), as "
                                               "--signal=B:SIG@SECONDS does")
        grace_s: float = Field(20.0, ge=0, le=3600, description="seconds between the notice "
                                                                "and the requeue (GraceTime)")
        requeue: bool = Field(True, description="requeue the job after the grace time "
                                                "(PreemptMode=REQUEUE); false: only the signal")

    params: Params

    def __init__(self, params: FaultParams) -> None:
        super().__init__(params)
        self._timer: threading.Timer | None = None
        self._requeued: dict[str, Any] = {}

    def inject(self, ctx: FaultContext, victim: Victim) -> dict[str, Any]:
        slurm = _slurm(ctx, "slurm_preempt")
        p = self.params
        t = time.time()
        slurm.cancel(p.signal, batch=p.batch)
        # the batch shell's signal reaches the ranks only through the user's script, if at all
        delivered = {} if p.batch else _notices(
            slurm, t, min(float(p.grace_s), NOTICE_WAIT_S))
        if p.requeue:
            grace = float(p.grace_s)
            slurm.hold_finish(t + grace + 5)  # the job may end in its grace: it comes back
            # the grace time runs from the signal, not from the end of the wait above
            self._timer = threading.Timer(max(0.0, t + grace - time.time()), self._requeue,
                                          args=(slurm,))
            self._timer.daemon = True
            self._timer.start()
        out = {"signal": f"SIG{p.signal}", "batch": p.batch, "grace_s": p.grace_s,
               "requeue": p.requeue, "at_t": t, **delivered}
        if p.requeue:
            out["deadline_t"] = t + float(p.grace_s)  # the requeue kills what is left
        return out

    def _requeue(self, slurm: Any) -> None:
        try:
            self._requeued = {"requeued_t": time.time(), "job_state": slurm.requeue()}
        except FaultError as e:
            self._requeued = {"requeue_error": str(e)}

    def release(self) -> dict[str, Any]:
        """Cancel a requeue still waiting for its grace time; report what was requeued."""
        if self._timer is not None:
            self._timer.cancel()
        return dict(self._requeued)

    @classmethod
    def needs_prepare(cls) -> bool:
        return True  # one instance for the run, so that release() sees the requeue
