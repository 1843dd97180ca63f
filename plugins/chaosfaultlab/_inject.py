"""Injecting one faultlab fault into a job: what ``chaosfaultlab.actions.inject_fault`` and its
shortcuts do beneath their arguments.

This module owns the checks of an injection's arguments (fault type, ``params`` validated as in
a faultlab experiment, target forms, numbers), the wait until the job can take the fault, the
resolution of a node name to its index, and the injection itself: journaled in
``RUN_DIR/faultlab-actions/faults.jsonl`` before and after (``chaosfaultlab._state``), handed to
``chaosfaultlab._undo`` if reversible, and undone on a timer when it has a duration.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from chaosfaultlab import _jobs, _undo
from chaosfaultlab._state import ActionLog
from faultlab.errors import FaultError, FaultlabError
from faultlab.faults import Fault, Victim, fault_types
from faultlab.targets.base import JobContext

__all__ = ["TARGET_FORMS", "check_number", "fault_class", "fault_params", "inject",
           "parse_target", "resolve_victim", "wait_for_job"]

TARGET_FORMS = '{"rank": N}, {"node": N} (index or name, e.g. "node1") or "all"'


# --- arguments --------------------------------------------------------------------------------

def fault_class(fault_type: Any) -> type[Fault]:
    types = fault_types()
    if not isinstance(fault_type, str) or fault_type not in types:
        raise FaultError(f"fault_type: {fault_type!r} is not an installed faultlab fault type; "
                         f"installed: {', '.join(types)} (see `faultlab list faults`)")
    return types[fault_type]


def fault_params(cls: type[Fault], params: Any) -> Any:
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise FaultError(f"params: expected a mapping of {cls.type}'s parameters, got "
                         f"{params!r}")
    try:
        return cls.Params.model_validate(params)
    except ValidationError as e:
        problems = "; ".join(
            f"params.{'.'.join(map(str, err['loc']))}: {err['msg']} (got {err.get('input')!r})"
            for err in e.errors())
        valid = ", ".join(cls.Params.model_fields) or "none"
        raise FaultError(f"{cls.type}: {problems}; its parameters are: {valid}") from None


def parse_target(cls: type[Fault], target: Any) -> tuple[str, int | str | None]:
    """(kind, value) of a target argument; a node may be given by name (resolved later)."""
    if target == "all":
        kind, value = "all", None
    elif isinstance(target, dict) and len(target) == 1:
        [(kind, value)] = target.items()
        if kind not in ("rank", "node"):
            raise FaultError(f"target: unknown key {kind!r}; expected {TARGET_FORMS}")
        by_name = kind == "node" and isinstance(value, str) and re.fullmatch(r"node\d+", value)
        if not by_name and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise FaultError(f"target: {kind} must be an integer >= 0"
                             f"{' or a node name' if kind == 'node' else ''}, got {value!r}")
    else:
        raise FaultError(f"target: expected {TARGET_FORMS}, got {target!r}")
    if kind not in cls.targets:
        forms = " or ".join(f'{{"{k}": N}}' if k != "all" else '"all"' for k in cls.targets)
        raise FaultError(f"target: {cls.type} cannot hit {kind!r}; it takes {forms}")
    return kind, value


def check_number(name: str, value: Any, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
        raise FaultError(f"{name}: expected a number >= {minimum:g}, got {value!r}")
    return float(value)


# --- the job ----------------------------------------------------------------------------------

def wait_for_job(ctx: JobContext, run_dir: Path, kind: str, value: Any, after_step: int,
                 timeout_s: float) -> None:
    """Until the job reached ``after_step`` and the victim rank runs; FaultError if not."""

    def ready() -> bool:
        ctx.stream.poll()
        if ctx.stream.max_step() < after_step or not ctx.stream.current_ranks():
            return False
        return kind != "rank" or ctx.stream.latest_start(value) is not None

    if _jobs.wait_until(lambda: ready() or not _jobs.job_running(run_dir), timeout_s) \
            and ready():
        return
    state = "has ended" if not _jobs.job_running(run_dir) else f"still runs after {timeout_s:g} s"
    raise FaultError(f"the job in {run_dir} {state} at step {ctx.stream.max_step()} with ranks "
                     f"{ctx.stream.current_ranks() or 'none'}; the fault needed step >= "
                     f"{after_step}{f' and rank {value} started' if kind == 'rank' else ''}")


def resolve_victim(ctx: JobContext, kind: str, value: Any) -> Victim:
    """The victim in the running job; a node given by name becomes its index."""
    if kind == "node" and isinstance(value, str):
        names = ctx.node_names()
        if value not in names:
            raise FaultError(f"target: no node {value!r} in the job; nodes are "
                             f"{', '.join(names)}")
        value = names.index(value)
    elif kind == "node" and not int(value or 0) < len(ctx.node_names()):
        raise FaultError(f"target: node {value} does not exist; the job has "
                         f"{len(ctx.node_names())} nodes (0..{len(ctx.node_names()) - 1})")
    return Victim(kind, value)


# --- injecting --------------------------------------------------------------------------------

def inject(run_dir: Path, ctx: JobContext, fault: Fault, victim: Victim,
           duration_s: float | None) -> dict:
    """Inject ``fault`` into ``victim``, journaled before and after; the activity's result."""
    cls = type(fault)
    reversible = fault.reversible  # a parameter may make it so (node_kill method: machine)
    log = ActionLog(run_dir)
    fid = log.begin(cls.type, str(victim), reversible, time.time())
    injected_t = time.time()
    try:
        details = fault.inject(ctx, victim)
    except FaultlabError as e:
        log.injected(fid, cls.type, str(victim), reversible, injected_t, {"error": str(e)})
        raise FaultError(f"{fid} ({cls.type} on {victim}) could not be injected: {e}") from None
    injected_t = float(details.pop("at_t", injected_t))
    log.injected(fid, cls.type, str(victim), reversible, injected_t, details)
    if reversible:
        _undo.remember(run_dir, fid, fault, ctx)
        if duration_s is not None:
            timer = threading.Timer(duration_s, _undo.undo_by_id, args=(run_dir, fid))
            timer.daemon = True
            timer.start()
    return {"id": fid, "type": cls.type, "target": str(victim), "injected_t": injected_t,
            "details": details}
