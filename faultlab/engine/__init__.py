"""The engine: runs an experiment against its target and judges it."""

from faultlab.engine.runner import RunResult, SLAResult, judge, run_experiment
from faultlab.engine.view import NullView, RunView

__all__ = ["NullView", "RunResult", "RunView", "SLAResult", "judge", "run_experiment"]
