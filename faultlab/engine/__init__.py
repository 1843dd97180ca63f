"""The engine: runs an experiment against its target and judges it."""

from faultlab.engine.runner import RunResult, run_experiment
from faultlab.engine.view import NullView, RunView
from faultlab.judge import SLAResult, judge  # re-exported: they lived here before

__all__ = ["NullView", "RunResult", "RunView", "SLAResult", "judge", "run_experiment"]
