"""faultlab's runtime agent: the few lines a trainer adds so faults can strike inside a rank.

    from faultlab import runtime

    runtime.install()                              # optional, as early as you like
    ...                                            # build, fully_shard, make the optimizer
    rt = runtime.attach(model, optimizer, emit=events.emit)
    for step in range(start + 1, last + 1):
        rt.step(step)                              # again with the same n after a rollback
        loss = rt.loss(model(x, y))                # optional: loss_spike strikes here
        ...
        rt.step_done(step)                         # level 2 (own step records): after the
                                                   # record, before the checkpoint (step gates)
    rt.close()                                     # also at exit

Outside faultlab (no ``FAULTLAB_RUN_DIR``) ``attach`` returns a :class:`NullAgent` whose calls
do nothing. Under faultlab it reads the rank's identity, the launch plan
(``FAULTLAB_RUNTIME_PLAN``) and the control secret (``FAULTLAB_RUNTIME_SECRET``) from the
environment. Why in-rank faults need code in the rank: a NaN in one rank's gradient shard, or a
collective that one rank never issues, cannot be produced from outside the process.

It may import ``faultlab.errors`` only (where every exception faultlab raises is defined; it needs
the standard library only), so a rank loads nothing of faultlab's own side. Importing this package
does not import torch; ``install`` and ``attach`` import torch when called. The modules: ``plan``
(the shape of a fault entry), ``hooks`` (the rank-side API: a fault's action and the hooks it hangs
on), ``agent`` (loading the actions a plan names, fire-once bookkeeping, events), ``interposer``
(wrapping ``torch.distributed``), ``actions`` (the built-in faults' actions, each module imported
only when a plan or a live inject names one of them), ``control`` (the listener) and ``client``
(the faultlab side of the channel). Level 0 (no code in the trainer at all): ``bootstrap`` (the
directory faultlab puts first on a rank's ``PYTHONPATH``; its ``sitecustomize`` activates in
torchrun workers) and ``auto`` (what then follows the trainer through torch's global hooks and
drives the agent).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

from faultlab.runtime.agent import Agent, Emit, Identity, NullAgent
from faultlab.runtime.gates import StepGates
from faultlab.runtime.plan import FaultEntry, PlanError, load_plan

__all__ = [
    "Agent",
    "FaultEntry",
    "NullAgent",
    "PlanError",
    "RuntimeControlError",
    "attach",
    "install",
    "new_secret",
    "send",
    "write_plan",
]

_ENV_KEYS = ("FAULTLAB_RUNTIME_PLAN", "FAULTLAB_RUNTIME_SECRET")
_LAZY = {"RuntimeControlError": "faultlab.runtime.client", "send": "faultlab.runtime.client",
         "new_secret": "faultlab.runtime.client", "write_plan": "faultlab.runtime.plan"}
_current: Agent | None = None


def install() -> bool:
    """Install the collective interposer (idempotent; ``attach`` calls it). Early is fine —
    before ``init_process_group`` or the model — and so is late: FSDP2 looks the collectives up
    at call time. Returns False when torch.distributed is not available."""
    from faultlab.runtime import interposer

    return interposer.install()


def attach(model: Any, optimizer: Any, emit: Emit | Callable[..., None] | None = None,
           ) -> Agent | NullAgent:
    """The agent of this rank process; call once, after the model is sharded and the optimizer
    exists. ``emit(kind, **fields)`` is the trainer's event emitter; without one the agent writes
    ``RUN_DIR/events/{node}-rank{rank}-restart{restart}-pid{pid}-runtime.jsonl``.

    Raises PlanError for an invalid plan file, ValueError for an inconsistent environment
    (a malformed ``FAULTLAB_STEP_GATES`` included)."""
    global _current
    env = os.environ
    if not env.get("FAULTLAB_RUN_DIR"):
        stray = [k for k in _ENV_KEYS if env.get(k)]
        if stray:
            raise ValueError(f"{' and '.join(stray)} set without FAULTLAB_RUN_DIR: the runtime "
                             f"agent needs the run directory for its markers and events")
        return NullAgent()
    ident = Identity.from_env(env)
    plan_path = env.get("FAULTLAB_RUNTIME_PLAN")
    plan = load_plan(plan_path) if plan_path else []
    gates = StepGates.from_env(env)
    install()
    if _current is not None:
        _current.close()
    _current = Agent(ident, model=model, optimizer=optimizer, emit=emit, plan=plan,
                     secret=env.get("FAULTLAB_RUNTIME_SECRET") or None,
                     host=env.get("FAULTLAB_RUNTIME_HOST") or "127.0.0.1", gates=gates)
    return _current


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'faultlab.runtime' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
