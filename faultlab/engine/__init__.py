"""The engine: runs an experiment against its target and judges it.

It may import ``faultlab.errors``, ``faultlab.spec``, ``faultlab.faults``, ``faultlab.targets``,
``faultlab.runtime``, ``faultlab.observe``, ``faultlab.judge``, ``faultlab.report``,
``faultlab.metadata`` and ``faultlab.storage``: it is downstream of everything but the CLI, which
calls it (never a trainer: one is reached through ``faultlab.spec.trainers``).
"""

from faultlab.engine.runner import RunResult, run_experiment
from faultlab.engine.view import NullView, RunView
from faultlab.judge import SLAResult, judge  # re-exported: they lived here before

__all__ = ["NullView", "RunResult", "RunView", "SLAResult", "judge", "run_experiment"]
