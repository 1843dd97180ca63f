"""Cloud faults: a spot instance reclaimed with a short notice.

``spot_preemption`` gives every node of the job its own fake metadata endpoint
(``faultlab.metadata``) before the launch, pointed at through the variables the clouds' SDKs
honour (``AWS_EC2_METADATA_SERVICE_ENDPOINT``, ``GCE_METADATA_HOST``, ...). When the trigger
fires, the victim node's endpoint starts announcing the preemption, exactly as the cloud would:
AWS's ``spot/instance-action`` with the termination time, GCE's ``preempted`` = ``TRUE``,
Azure's ``Preempt`` scheduled event. At the deadline, if the node still runs, faultlab
terminates it as the cloud would (``node_kill`` with SIGKILL). The node may come back after
``return_after_s`` (a replacement machine with the same name joins the job) or stay gone (the
job shrinks).

Everything is stopped when the experiment ends, whatever ended it: the deadline and return
timers are cancelled and the servers are shut down (they are threads of faultlab itself, so
even a SIGKILLed faultlab leaves no server behind).
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from faultlab.errors import FaultError
from faultlab.fault_api import Fault, FaultContext, FaultParams, NodeRestart, Victim, require

__all__ = ["SpotPreemptionFault"]


class SpotPreemptionFault(Fault):
    """Announce a spot preemption on a node's metadata endpoint; terminate it at the deadline."""

    type = "spot_preemption"
    family = "cloud"
    loses_node: ClassVar[bool] = True
    targets: ClassVar[tuple[str, ...]] = ("node",)
    needs: ClassVar[tuple[str, ...]] = ("host_loopback",)
    """Its fake metadata endpoints listen on this host's loopback. A node that comes back
    (``return_after_s``) is started again where the target offers ``node_restart``; elsewhere
    the journal says why it did not (``return_error``)."""

    class Params(FaultParams):
        provider: Literal["aws", "gce", "azure"] = Field(
            "aws", description="whose metadata to fake: aws (IMDS v1/v2), gce or azure")
        notice_s: float = Field(120.0, gt=0, le=3600, description="seconds from the notice to "
                                "the termination (AWS gives 120, GCE about 30, Azure >= 30)")
        return_after_s: float | None = Field(None, ge=0, description="seconds after the "
                                             "termination until a replacement node of the same "
                                             "name joins; unset: the node stays gone")
        imds_v2_required: bool = Field(False, description="AWS only: refuse requests without "
                                                          "an IMDSv2 session token")

        @model_validator(mode="after")
        def _v2_is_aws(self) -> SpotPreemptionFault.Params:
            if self.imds_v2_required and self.provider != "aws":
                raise ValueError(f"imds_v2_required: IMDSv2 is AWS's; provider is "
                                 f"{self.provider!r} (drop imds_v2_required or use aws)")
            return self

    params: Params

    def __init__(self, params: FaultParams) -> None:
        super().__init__(params)
        self._servers: dict[str, Any] = {}
        self._stop = threading.Event()
        self._timers: list[threading.Thread] = []
        self._outcome: dict[str, Any] = {}
        self._victims: list[tuple[FaultContext, str]] = []
        self._lock = threading.Lock()

    def prepare(self, nodes: list[str]) -> dict[str, dict[str, str]]:
        from faultlab.metadata import MetadataServer

        p = self.params
        env = {}
        try:
            for node in nodes:
                server = MetadataServer(p.provider, node=node,
                                        imds_v2_required=p.imds_v2_required)
                self._servers[node] = server.start()
                env[node] = server.env()
        except BaseException:
            self.release()
            raise
        return env

    def inject(self, ctx: FaultContext, victim: Victim) -> dict[str, Any]:
        p = self.params
        require(ctx, "host_loopback", "spot_preemption")
        node = ctx.node_names()[int(victim.value or 0)]
        server = self._servers.get(node)
        if server is None:
            raise FaultError(f"{node} has no metadata endpoint (nodes prepared: "
                             f"{', '.join(self._servers) or 'none'})")
        at_t = time.time()
        self._victims.append((ctx, node))
        deadline_t = float(server.announce_preemption(notice_s=p.notice_s))
        timer = threading.Thread(target=self._at_deadline, args=(ctx, node, deadline_t),
                                 name=f"spot-deadline-{node}", daemon=True)
        self._timers.append(timer)
        timer.start()
        return {"provider": p.provider, "node": node, "endpoint": server.url,
                "notice_s": p.notice_s, "deadline_t": deadline_t,
                "return_after_s": p.return_after_s, "at_t": at_t}

    def _at_deadline(self, ctx: FaultContext, node: str, deadline_t: float) -> None:
        if self._stop.wait(max(0.0, deadline_t - time.time())):
            return
        with self._lock:
            if self._stop.is_set():
                return
            # The cloud takes the machine whether or not the job left in time.
            alive = bool(ctx.node_pids(node))
            pids = ctx.kill_node(node, signal.SIGKILL) if alive else []
            ctx.mark_lost(node)
            self._outcome[node] = {"terminated_t": time.time(), "was_running": alive,
                                   "killed_pids": pids}
        back = self.params.return_after_s
        if back is None or self._stop.wait(back):
            return
        with self._lock:
            if self._stop.is_set():
                return
            self._servers[node].clear()  # a new machine: no notice on its metadata
            try:
                restart: NodeRestart = require(ctx, "node_restart", "a replacement node")
                pid = restart.restart_node(node)
                self._outcome[node].update(returned_t=time.time(), agent_pid=pid)
            except FaultError as e:
                self._outcome[node].update(return_error=str(e))

    def release(self) -> dict[str, Any]:
        """Stop the deadline timers and the fake metadata endpoints; a node that left on
        notice is marked lost on purpose, not failed."""
        self._stop.set()
        with self._lock:  # a deadline being acted on finishes first
            for ctx, node in self._victims:
                if node in self._outcome:
                    continue
                try:  # the run ended before the deadline
                    gone = not ctx.node_pids(node)
                    if gone:  # it left on notice: its agent's exit code is no failure
                        ctx.mark_lost(node)
                    self._outcome[node] = {"left_before_deadline": gone}
                except FaultError as e:
                    self._outcome[node] = {"error": str(e)}
        for t in self._timers:
            t.join(timeout=5)
        polls = {node: _state(s) for node, s in self._servers.items()}
        for server in self._servers.values():
            server.stop()
        self._servers = {}
        out: dict[str, Any] = dict(self._outcome)
        if polls:
            out["metadata"] = polls
        return out


def _state(server: Any) -> dict[str, Any]:
    """What the journal keeps of an endpoint: did the job poll it, and was the notice acked."""
    try:
        st = server.state()
        return {"num_requests": st.get("num_requests"), "acknowledged": st.get("acknowledged")}
    except Exception as e:  # noqa: BLE001 - a note for the journal, never worth failing over
        return {"error": f"{type(e).__name__}: {e}"}
