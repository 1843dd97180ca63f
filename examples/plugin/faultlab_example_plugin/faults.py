"""faultlab's side of ``optimizer_exception``: the declaration a team writes.

Imported by faultlab (``faultlab list faults``, ``validate``, the engine) through the
``faultlab.faults`` entry point; never by a rank.
"""

from __future__ import annotations

from pydantic import Field

from faultlab.faults.runtime_base import RuntimeFault, RuntimeFaultParams

__all__ = ["OptimizerExceptionFault"]


class OptimizerExceptionFault(RuntimeFault):
    """Raise an exception inside the victim rank's optimizer step at the chosen step: that
    rank's process fails, and its peers are left in their next collective (blocked, or failing
    once the transport sees the dead peer) until the job's watchdog or the launcher ends them:
    what a team's recovery must notice and survive."""

    type = "optimizer_exception"
    family = "optimizer"
    targets = ("rank",)
    strikes = "at_step"
    rank_action = "faultlab_example_plugin.actions:OptimizerException"

    class Params(RuntimeFaultParams):
        message: str = Field("injected optimizer failure", min_length=1, max_length=500,
                             description="text of the exception raised in the optimizer step")
        exception: str = Field("RuntimeError", pattern="^(RuntimeError|ValueError|"
                                                       "FloatingPointError)$",
                               description="builtin exception type raised: RuntimeError, "
                                           "ValueError or FloatingPointError")
