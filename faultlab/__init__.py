"""faultlab: chaos engineering for distributed PyTorch training.

    from faultlab import load_experiments, run_experiment

    for path, exp in load_experiments(["experiments/rank_kill.yaml"]):
        result = run_experiment(exp, source=path)
        # not passed: failed, or inconclusive (a correctness SLA that could not be measured)
        assert result.passed, [s.describe() for s in result.failures() + result.unmeasured()]

Names are imported on first use, so ``faultlab validate`` or ``faultlab --version`` do not pay
for importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_WHERE = {
    "Experiment": "faultlab.spec",
    "load_experiment": "faultlab.spec",
    "load_experiments": "faultlab.spec",
    "RunResult": "faultlab.engine",
    "SLAResult": "faultlab.judge",
    "run_experiment": "faultlab.engine",
    "FaultError": "faultlab.errors",
    "FaultlabError": "faultlab.errors",
    "InvalidExperimentError": "faultlab.errors",
    "PluginError": "faultlab.errors",
    "TargetError": "faultlab.errors",
}

__all__ = sorted([*_WHERE, "__version__"])


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'faultlab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
