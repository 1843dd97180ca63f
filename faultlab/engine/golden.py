"""The golden run: the same experiment without faults, cached so it runs once per code version.

The cache key covers everything that decides the final bits: the target's full config (trainer,
preset, every override, the command for a user's trainer), the seed, the steps, the topology
and the code version (a hash of the registered trainer's source files, faultlab's version and
torch's, or for a user's command the git commit and uncommitted diff of the working
directory). Entries are written atomically under a per-key file lock, so parallel experiments
(pytest-xdist) that need the same golden run it once.

A golden run that resumed from a checkpoint it did not write (a fixed ``--ckpt-dir`` that an
earlier run filled) is no reference: it raises ``SharedCheckpoint`` and is not cached. Where
it saved its checkpoints, when that is outside its run directory, is kept with the entry
(``checkpoints_outside``): the experiment would find them there
(``faultlab.engine.shared_checkpoints``).

The golden run always runs on local nodes: where the nodes run (``topology.launcher``) decides
no bit of the result — the same interpreter, torch and gloo compute it either way — so it is
not part of the key, and a container experiment shares its golden run with a local one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import faultlab
from faultlab.engine.foreign import complete_events, log_losses
from faultlab.engine.shared_checkpoints import SharedCheckpoint
from faultlab.errors import TargetError
from faultlab.observe import compute_metrics
from faultlab.observe.checkpoint_origin import foreign_resumes, outside_saves
from faultlab.observe.launch_findings import trainer_findings
from faultlab.observe.logs import node_logs
from faultlab.runtime.events import read_events
from faultlab.spec import Experiment
from faultlab.spec.trainers import get_trainer

__all__ = ["GoldenRun", "code_version", "golden_key", "golden_run"]


@dataclass(frozen=True, slots=True)
class GoldenRun:
    key: str
    digest: str | None
    losses: dict[int, float]
    wall_s: float
    run_dir: str
    cached: bool
    tensors: dict[str, str] = field(default_factory=dict)
    """Tensor name → SHA-256 of the final checkpoint (a job that writes no final_digest)."""
    not_measured: str | None = None
    """Why ``digest`` is None (a job that saved no final checkpoint)."""
    checkpoints_outside: tuple[str, ...] = ()
    """Checkpoints it saved outside ``run_dir`` (a fixed ``--ckpt-dir``): the experiment,
    given the same path, would resume from them."""
    restarts: int = 0
    """Restarts the fault-free run needed (a finding: the verdict fails
    ``golden_run_fault_free``; such a run is not cached, so the next run measures again)."""
    failures: tuple[str, ...] = ()
    """How its failed processes ended (exit reason and error), when it restarted."""


def code_version(exp: Experiment) -> str:
    h = hashlib.sha256(f"faultlab {faultlab.__version__} torch {torch.__version__}".encode())
    if exp.target.command:
        h.update(_git_state(Path.cwd()).encode())
    else:
        assert exp.target.trainer is not None
        for path in get_trainer(exp.target.trainer).source_files():
            h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _git_state(cwd: Path) -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                              text=True, timeout=10).stdout.strip()
        diff = subprocess.run(["git", "diff", "HEAD"], cwd=cwd, capture_output=True,
                              timeout=10).stdout
        return f"{head}:{hashlib.sha256(diff).hexdigest()}"
    except (OSError, subprocess.SubprocessError):
        return "no-git"


def golden_key(exp: Experiment) -> str:
    t = exp.target
    # Settings that change how a run is operated, never one bit of what it computes, stay out.
    neutral = get_trainer(t.trainer).numerics_neutral if t.trainer else frozenset()
    overrides = {k: v for k, v in (t.overrides or {}).items() if k not in neutral}
    ident = {
        "target": {"trainer": t.trainer, "preset": t.preset, "overrides": overrides,
                   "command": list(t.command or []),
                   # The stack that runs it: the golden run is also the finding that a
                   # fault-free run under this stack needed no restart (golden_run_fault_free),
                   # which one stack's cached run cannot say of another's.
                   "launch": t.launch if isinstance(t.launch, str | None) else list(t.launch)},
        "seed": exp.seed, "steps": exp.run.steps, "checkpoint_every": exp.run.checkpoint_every,
        "topology": exp.topology.model_dump(mode="json", exclude={"launcher", "slurm"}),
        "code": code_version(exp),
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:20]


def golden_run(exp: Experiment, cache_dir: Path, *, timeout_s: float) -> GoldenRun:
    """The cached golden result for ``exp``, running it (without faults) if needed."""
    from faultlab.targets.local import LocalTarget

    key = golden_key(exp)
    cache_dir.mkdir(parents=True, exist_ok=True)
    entry = cache_dir / f"{key}.json"
    with open(cache_dir / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cached: dict[str, Any] | None = json.loads(entry.read_text()) \
            if entry.exists() else None
        if cached is not None and cached.get("checkpoints_outside") is None:
            # an entry written before they were kept: read them from its events
            events_dir = Path(cached["run_dir"]) / "events"
            events = read_events(events_dir) if events_dir.is_dir() else []
            cached["checkpoints_outside"] = outside_saves(events, cached["run_dir"])
            if foreign_resumes(events, cached["run_dir"]):
                cached = None  # cached before such a run was refused: no reference, run again
        if cached is not None:
            return GoldenRun(key=key, digest=cached["digest"],
                             losses={int(k): v for k, v in cached["losses"].items()},
                             wall_s=cached["wall_s"], run_dir=cached["run_dir"], cached=True,
                             tensors=cached.get("tensors") or {},
                             not_measured=cached.get("not_measured"),
                             checkpoints_outside=tuple(cached["checkpoints_outside"]))
        run_dir = cache_dir / key
        shutil.rmtree(run_dir, ignore_errors=True)
        target = LocalTarget(exp.model_copy(update={"faults": []}), run_dir)
        t0 = time.monotonic()
        try:
            target.start()
            while not target.finished():
                if time.monotonic() - t0 > timeout_s:
                    raise TargetError(f"the golden run of {exp.name!r} did not finish within "
                                      f"{timeout_s:.0f} s; logs in {run_dir / 'logs'}")
                time.sleep(0.1)
        finally:
            target.stop()
        target.stream.poll()
        foreign = None
        if exp.target.command:  # a user's trainer: judged by exit codes and its checkpoint
            foreign = complete_events(run_dir, target.stream.events)
            target.stream.poll()
        resumes = foreign_resumes(target.stream.events, run_dir)
        if resumes:  # before judging its outcome: this is why it is what it is
            raise SharedCheckpoint(resumes, run_dir)
        metrics = compute_metrics(target.stream.events, [])
        result = target.result()
        failed = not result.ok if foreign is not None else \
            not metrics.completes or metrics.final_digest is None
        if failed:
            raise TargetError(f"the golden run of {exp.name!r} failed (exit codes "
                              f"{result.returncodes}); logs in {run_dir / 'logs'}")
        losses = {e["step"]: e["loss"] for e in target.stream.events
                  if e["kind"] == "step" and e["rank"] == 0 and "loss" in e}
        losses = losses or log_losses(exp, run_dir)
        data: dict[str, Any] = {"digest": metrics.final_digest, "losses": losses,
                                "wall_s": time.monotonic() - t0, "run_dir": str(run_dir),
                                "tensors": foreign.tensors if foreign else {},
                                "not_measured": foreign.not_measured if foreign else None,
                                "checkpoints_outside": outside_saves(target.stream.events,
                                                                     run_dir)}
        failures = tuple(
            f"rank {e.get('rank')} exited {e.get('reason')}" + (
                f" ({str(e.get('error')).splitlines()[0][:120]})" if e.get("error") else "")
            for e in target.stream.events if e.get("kind") == "exit"
            and e.get("reason") not in ("completed", "stopped"))
        # A rank aborted at exit, or crashed, writes no record of its own: its node's log says
        # it, and the finding names the cause (last: the verdict's note quotes the last one).
        failures += tuple(f"{f.text}; to change it: {f.change}" for f in
                          trainer_findings(node_logs(run_dir), (), target.stream.events))
        if not metrics.restarts:  # a run that restarted without a fault is no stable reference
            tmp = entry.with_suffix(".tmp")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, entry)
        return GoldenRun(key=key, digest=data["digest"], losses=losses, wall_s=data["wall_s"],
                         run_dir=str(run_dir), cached=False, tensors=data["tensors"],
                         not_measured=data["not_measured"],
                         checkpoints_outside=tuple(data["checkpoints_outside"]),
                         restarts=metrics.restarts, failures=failures)
