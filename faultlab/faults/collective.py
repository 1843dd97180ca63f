"""Collective faults: slow, stuck, failing or partitioned collective communication.

They strike inside the victim ranks through the runtime agent's interposer on
``torch.distributed`` (``faultlab.runtime.interposer``), on the host before the collective is
issued — the same on gloo and NCCL (for NCCL: before the kernel is enqueued). Injected live, a
collective fault applies at once and lasts until undone (``duration_s`` or ``until``); each is
reversible: a delay stops, a hung call is let go and completes.

``ops`` names the operations to hit, as ``torch.distributed`` calls them
(``all_gather_single``, ``reduce_scatter_single``, ``all_reduce``, ``barrier``, ``send``...) or
``funcol.<name>`` for DTensor's functional collectives; fnmatch patterns allowed; default: all.
FSDP2 issues ``all_gather_single`` and ``reduce_scatter_single``.
"""

from __future__ import annotations

import fnmatch
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from faultlab.faults.runtime_base import RuntimeFault, RuntimeFaultParams
from faultlab.runtime.interposer import OP_NAMES

__all__ = ["CollectiveDelayFault", "CollectiveErrorFault", "CollectiveHangFault",
           "CollectivePartitionFault"]

_OPS_HELP = ("operations to hit (names or fnmatch patterns, e.g. all_gather_single, "
             "'funcol.*'); default: every collective")


def _check_ops(v: list[str] | None) -> list[str] | None:
    for name in v or ():
        if not fnmatch.filter(OP_NAMES, name):
            raise ValueError(f"{name!r} matches no interceptable operation; valid: "
                             f"{', '.join(OP_NAMES)} (fnmatch patterns allowed)")
    return v


class _CollectiveParams(RuntimeFaultParams):
    _ops_known = field_validator("ops", check_fields=False)(_check_ops)


class _Collective(RuntimeFault):
    family = "collective"
    reversible = True
    strikes = "window"


class CollectiveDelayFault(_Collective):
    """Delay every matching collective on the victim ranks (a slow link, a straggler).

    Only the victim's calls are held, in its own thread before each is issued; its peers run
    on and then wait inside the collective for it, as on a real slow link. With
    ``bandwidth_gbps`` the hold grows with the call's bytes."""

    type = "collective_delay"
    rank_action = "faultlab.runtime.actions.collective:Delay"
    slows_job: ClassVar[bool] = True

    class Params(_CollectiveParams):
        delay_ms: float | None = Field(None, ge=0, le=3_600_000, description="delay before "
                                       "each matching call, ms (default: 100, or 0 with "
                                       "bandwidth_gbps)")
        bandwidth_gbps: float | None = Field(None, gt=0, le=10_000, allow_inf_nan=False,
                                             description="a degraded link: each matching call "
                                             "is held besides for its payload (its largest "
                                             "tensor argument; a list counts whole) sent at "
                                             "this many Gbit/s, so big collectives slow more "
                                             "than small ones")
        jitter_ms: float = Field(0.0, ge=0, le=3_600_000, description="seeded uniform jitter "
                                                                      "around delay_ms (never "
                                                                      "below 0), ms")
        ops: list[str] | None = Field(None, min_length=1, description=_OPS_HELP)
        seed: int | None = Field(None, ge=0, lt=2**63, description="seed of the jitter; "
                                                                   "default: from the fault id")
        num_steps: int | None = Field(None, ge=1, description="with an at_step trigger: delay "
                                      "exactly steps at_step .. at_step + num_steps - 1, "
                                      "planned at launch; unset: from when the trigger fires "
                                      "until undone (duration_s, until, or the run's end)")

        def runtime_params(self) -> dict[str, Any]:
            # The step window is the plan entry's, not a parameter the agent knows.
            params = {k: v for k, v in super().runtime_params().items() if k != "num_steps"}
            if params["delay_ms"] is None:
                params["delay_ms"] = 0.0 if self.bandwidth_gbps else 100.0
            return params


class CollectiveHangFault(_Collective):
    """The victim rank never completes a collective (blocks before issuing it) until undone;
    its peers wait inside the collective, as with a dead NIC or a deadlocked rank."""

    type = "collective_hang"
    rank_action = "faultlab.runtime.actions.collective:Hang"

    class Params(_CollectiveParams):
        ops: list[str] | None = Field(None, min_length=1, description=_OPS_HELP)
        after_num_calls: int = Field(1, ge=1, description="hang on this matching call "
                                                          "(1 = the next one)")


class CollectiveErrorFault(_Collective):
    """Matching collectives on the victim rank raise ``DistBackendError`` ("Connection reset
    by peer") instead of running: a broken transport."""

    type = "collective_error"
    rank_action = "faultlab.runtime.actions.collective:Error"

    class Params(_CollectiveParams):
        ops: list[str] | None = Field(None, min_length=1, description=_OPS_HELP)
        after_num_calls: int = Field(1, ge=1, description="first matching call that fails "
                                                          "(1 = the next one)")
        num_calls: int = Field(1, ge=1, description="how many calls fail")


class CollectivePartitionFault(_Collective):
    """Split the ranks into groups: a collective whose participants span groups hangs (or
    fails) on the victim ranks; collectives within one group proceed. Target ``all`` to
    partition the whole job."""

    type = "collective_partition"
    rank_action = "faultlab.runtime.actions.collective:Partition"

    class Params(_CollectiveParams):
        groups: list[list[int]] = Field(min_length=2, description="groups of global ranks, "
                                                                  "e.g. [[0, 1], [2, 3]]; a "
                                                                  "rank in none is alone")
        mode: Literal["hang", "error"] = Field("hang", description="what a cross-group "
                                                                   "collective does: hang "
                                                                   "(until undone) or error")
        ops: list[str] | None = Field(None, min_length=1, description=_OPS_HELP)

        @field_validator("groups")
        @classmethod
        def _disjoint(cls, v: list[list[int]]) -> list[list[int]]:
            seen: set[int] = set()
            for g in v:
                if not g:
                    raise ValueError(f"group {g!r} is not a non-empty list of ranks")
                for r in g:
                    if r < 0:
                        raise ValueError(f"rank {r!r} is not an integer >= 0")
                    if r in seen:
                        raise ValueError(f"rank {r!r} is in more than one group")
                    seen.add(r)
            return v
