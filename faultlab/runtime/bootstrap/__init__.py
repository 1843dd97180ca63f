"""The level-0 bootstrap directory (integration level 0, "zero code").

A launcher that wants faultlab's runtime agent inside an unmodified trainer starts its ranks
with this directory first on ``PYTHONPATH`` and ``FAULTLAB_BOOTSTRAP=1`` (beside the
``FAULTLAB_RUN_DIR`` every faultlab job has)::

    from faultlab.runtime.bootstrap import bootstrap_env

    env = {**os.environ, "FAULTLAB_RUN_DIR": str(run_dir)}
    env.update(bootstrap_env(env))
    subprocess.Popen(["torchrun", "--nproc-per-node", "2", "train.py"], env=env)

Only ``sitecustomize.py`` may live in this directory besides this file: everything in it is
importable as a top-level module in the ranks. What the bootstrap does is in
``sitecustomize.py`` (activation, chaining) and ``faultlab.runtime.auto`` (the observer).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["BOOTSTRAP_DIR", "bootstrap_env"]

BOOTSTRAP_DIR = Path(__file__).resolve().parent
"""The directory to put first on the ranks' ``PYTHONPATH``."""


def bootstrap_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``PYTHONPATH`` (``BOOTSTRAP_DIR`` first, then what ``env`` had, minus earlier copies of
    it) and ``FAULTLAB_BOOTSTRAP=1``: the variables to add to the ranks' environment."""
    env = os.environ if env is None else env
    rest = [p for p in (env.get("PYTHONPATH") or "").split(os.pathsep)
            if p and Path(p).resolve() != BOOTSTRAP_DIR]
    return {"PYTHONPATH": os.pathsep.join([str(BOOTSTRAP_DIR), *rest]),
            "FAULTLAB_BOOTSTRAP": "1"}
