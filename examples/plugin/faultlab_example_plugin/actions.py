"""The rank's side of ``optimizer_exception``: an action on faultlab's hooks API.

A rank imports this module only when its plan (or a live inject) names
``faultlab_example_plugin.actions:OptimizerException``. It imports faultlab's rank-side API and
the standard library: no pydantic, nothing of faultlab's engine.
"""

from __future__ import annotations

import builtins
from typing import Any

from faultlab.runtime.hooks import RankAction

__all__ = ["OptimizerException"]


class OptimizerException(RankAction):
    """Raise in the armed step's ``optimizer.step()``, before any parameter is updated: once
    (a trainer that catches it and steps again is not struck twice)."""

    strikes = "at_step"

    def before_optimizer_step(self, optimizer: Any) -> None:
        if self.released.is_set() or self.num_struck:
            return
        kind = getattr(builtins, self.params["exception"])
        self.rank.struck(exception=self.params["exception"], message=self.params["message"])
        raise kind(f"faultlab optimizer_exception on rank {self.rank.rank} at step "
                   f"{self.rank.step}: {self.params['message']}")
