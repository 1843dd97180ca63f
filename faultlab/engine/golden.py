"""The golden run: the same experiment without faults, on its own target, cached per code version.

It runs where the experiment runs, through the same ``JobSession``: as local processes for a
local experiment, on docker nodes for a docker one, and on a Slurm cluster as the same batch
job without faults (the team's own script when there is one, the same ``--nodes``, partition
and options), so a trainer that reads its allocation starts, and the reference is computed on
the accelerators, world size and collectives that the experiment's run uses.

The cache key covers everything that decides the final bits: the target's full config (trainer,
preset, every override, the command for a user's trainer), the seed, the steps, the topology
(where the nodes run included), where it computes (``reference_site``: the target kind and the
nodes' site, ``faultlab.runtime.site``: accelerator and count, driver, torch, CUDA, NCCL, the
CPU of a CPU job; the Slurm cluster) and the code version (a hash of the registered trainer's
source files, faultlab's version and torch's, or for a user's command the git commit and
uncommitted diff of the working directory). Entries are written atomically under a per-key file
lock, so parallel experiments (pytest-xdist) that need the same golden run it once. A Slurm
experiment's cache is on the cluster's shared filesystem (``golden_cache_dir``), and every way
of running (``faultlab run``, campaigns, ``--repeat``, the pre-launch suite, the pytest plugin,
the Chaos Toolkit probe) finds it there: ``golden_cache_for``.

The nodes' site is read on this host for nodes on this host, and for Slurm learnt on the nodes
(one ``srun`` probe per cluster and partition, then what runs report: the target's
``probe_site`` and ``site_seen``). It is a key, not a proof: the golden run records the site its
rank 0 reported (``GoldenRun.site``), so does the experiment's run, and the judge uses no
reference from another site (``faultlab.judge.evidence``); the runner then drops that entry
(``refuse_other_hardware``), so the next run computes the reference under the key of the nodes
it met. Where a reference is looked for and keyed, and its refusal, are ``golden_site``'s.

``runs: 2`` (the experiment's ``golden.runs``) runs it a second time: two fault-free runs that
differ say the trainer is not reproducible (``faultlab.judge.noise``), and measure its
run-to-run noise.

A golden run that resumed from a checkpoint it did not write (a fixed ``--ckpt-dir`` that an
earlier run filled) is no reference: it raises ``SharedCheckpoint`` and is not cached. Where
it saved its checkpoints, when that is outside its run directory, is kept with the entry
(``checkpoints_outside``): the experiment would find them there
(``faultlab.engine.shared_checkpoints``). One that fails raises ``GoldenRunFailed``: the
experiment is then never launched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import faultlab
from faultlab.engine.foreign import complete_events, log_losses
from faultlab.engine.golden_site import golden_cache_dir, golden_cache_for, reference_site
from faultlab.engine.shared_checkpoints import SharedCheckpoint
from faultlab.engine.view import View
from faultlab.errors import GoldenRunFailed
from faultlab.judge.timing import cold_start_s, step_time_s
from faultlab.observe import compute_metrics
from faultlab.observe.checkpoint_origin import foreign_resumes, outside_saves
from faultlab.observe.final_state import final_checkpoint_path
from faultlab.observe.launch_findings import trainer_findings
from faultlab.observe.logs import node_logs
from faultlab.observe.site import run_site
from faultlab.runtime.events import read_events
from faultlab.runtime.site import COMPARED, difference
from faultlab.spec import Experiment
from faultlab.spec.trainers import get_trainer
from faultlab.targets import target_class

__all__ = ["GoldenRun", "GoldenRunFailed", "code_version", "golden_cache_dir", "golden_cache_for",
           "golden_key", "golden_run", "reference_site"]



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
    final_checkpoint: str | None = None
    """The checkpoint its final state was read from (weights for the noise verdict)."""
    where: dict[str, Any] = field(default_factory=dict)
    """Where it was keyed to run (``reference_site``; a Slurm job's id as ``slurm_job_id``)."""
    site: dict[str, Any] | None = None
    """Where it ran, as its rank 0 reported it (``faultlab.runtime.site``; None: no record
    said). A run whose own differs is not judged against it."""
    second: dict[str, Any] | None = None
    """The second fault-free run (``runs: 2``): its digest, tensors, losses, checkpoint."""
    cold_start_s: float | None = None
    """Its launch to its first step (``faultlab.judge.timing``): the unit of a relative bound
    for a run whose fault struck before it showed its own."""
    step_s: float | None = None
    """Its median step time, likewise."""
    exit_codes: dict[str, int | None] | None = None
    """Each node's exit code (what an ``exit_code`` detection signal reads for its false
    alarms; None: an entry written before they were kept)."""


def code_version(exp: Experiment) -> str:
    h = hashlib.sha256(f"faultlab {faultlab.__version__} torch {torch.__version__}".encode())
    if exp.target.command:
        h.update(_git_state(Path.cwd()).encode())
    else:
        assert exp.target.trainer is not None
        for path in get_trainer(exp.target.trainer).source_files():
            h.update(path.name.encode() + b"\0" + path.read_bytes())
    for path in target_class(exp).code_files(exp):  # e.g. a team's batch script: the job
        with contextlib.suppress(OSError):
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


RECOVERY_ONLY = frozenset({"min_nodes", "max_restarts"})
"""Topology fields left out of the golden run's key: how far the job may shrink and how often
it may restart decide what it does after a fault, never the bits of a run without one (a golden
run that restarted is no reference: ``golden_run_fault_free``). Experiments of one job that
differ in them share a golden run."""


def golden_key(exp: Experiment) -> str:
    """The golden run's cache key: what decides its bits and where they are computed.

    A trainer's ``monitor_settings`` (a watchdog's timeout, a spike factor, a straggler
    threshold) change no bit, so a golden run whose records nobody counts is shared across
    them. But they decide what its monitors report, and a campaign's false positives and the
    ``false_alarms`` of a run scored for detection are read from those reports
    (``Experiment.counts_golden_alarms``). Such an experiment's key holds its monitor settings
    and is marked, so it never reads alarms raised under another experiment's settings: its
    verdict depends on its own stack, not on which experiment filled the cache first."""
    t = exp.target
    # Settings that change how a run is operated, never one bit of what it computes, stay out;
    # a monitor's stay in where a verdict counts the golden run's alarms (docstring).
    trainer = get_trainer(t.trainer) if t.trainer else None
    neutral = trainer.numerics_neutral if trainer is not None else frozenset()
    monitors: frozenset[str] = getattr(trainer, "monitor_settings", frozenset()) & neutral
    alarms = bool(monitors) and exp.counts_golden_alarms
    if alarms:
        neutral = neutral - monitors
    overrides = {k: v for k, v in (t.overrides or {}).items() if k not in neutral}
    ident = {
        "target": {"trainer": t.trainer, "preset": t.preset, "overrides": overrides,
                   "command": list(t.command or []),
                   # The stack that runs it: the golden run is also the finding that a
                   # fault-free run under this stack needed no restart (golden_run_fault_free),
                   # which one stack's cached run cannot say of another's.
                   "launch": t.launch if isinstance(t.launch, str | None) else list(t.launch)},
        "seed": exp.seed, "steps": exp.run.steps, "checkpoint_every": exp.run.checkpoint_every,
        # Where the nodes run and what computes: a reference is of one target (module doc).
        # How the job recovers (``RECOVERY_ONLY``) computes nothing: a fault-free run of an
        # elastic job is its full world, as a fixed-size job's is.
        "topology": {k: v for k, v in exp.topology.model_dump(mode="json").items()
                     if k != exp.topology.launcher  # the settings: the bits' own, below
                     and k not in RECOVERY_ONLY},
        "settings": _settings_key(exp.topology.settings),
        "site": reference_site(exp),
        "code": code_version(exp),
    }
    if alarms:
        ident["alarms"] = True
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:20]


def _settings_key(settings: Any) -> Any:
    """The target's settings (``exp.topology.settings``) that decide the bits: all but those
    its model names ``outside_the_bits`` (Slurm's time limit, run directory ...)."""
    if settings is None:
        return None
    return settings.model_dump(mode="json",
                               exclude=set(getattr(settings, "outside_the_bits", ())))


def golden_run(exp: Experiment, cache_dir: Path, *, timeout_s: float, runs: int = 1,
               view: View | None = None) -> GoldenRun:
    """The cached golden result for ``exp``, running it (without faults, on its own target)
    ``runs`` times if needed: a second run measures whether the trainer is reproducible and
    its run-to-run noise (``GoldenRun.second``)."""
    probe = getattr(target_class(exp), "probe_site", None)
    if probe is not None:  # the nodes' site, before the key is made of it (Slurm: one srun)
        probe(exp)
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
            first = _from_dict(key, cached, cached=True)
            if runs < 2 or first.second is not None:
                return first
        else:
            first = _measure(exp, cache_dir / key, key, timeout_s, view)
            if first.restarts:  # a run that restarted without a fault is no stable reference
                return first
            _store(entry, first)
            _learn(exp, first, cache_dir)
        if runs < 2:
            return first
        second = _measure(exp, cache_dir / f"{key}-2", key, timeout_s, view)
        if second.restarts:
            return dataclasses.replace(second, cached=False)  # the finding, from run 2
        both = dataclasses.replace(first, second=_second_of(second), cached=False)
        _store(entry, both)
        return both


def _store(entry: Path, golden: GoldenRun) -> None:
    tmp = entry.with_suffix(".tmp")
    data = dataclasses.asdict(golden)
    data.pop("cached"), data.pop("key"), data.pop("failures")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, entry)


def _learn(exp: Experiment, golden: GoldenRun, cache_dir: Path) -> None:
    """The golden run's rank 0 reported where it ran: a target that keeps its nodes' site
    (Slurm) takes it, and where that changes the key, the entry is kept under the new key too,
    where the next lookup will be made."""
    seen = getattr(target_class(exp), "site_seen", None)
    if golden.site is None or seen is None or not difference(
            {k: golden.where.get(k) for k in COMPARED}, golden.site):
        return
    if seen(exp, golden.site, f"golden run {golden.run_dir}"):
        key = golden_key(exp)
        if key != golden.key:
            _store(cache_dir / f"{key}.json", golden)


def _from_dict(key: str, d: dict[str, Any], *, cached: bool) -> GoldenRun:
    second = d.get("second")
    return GoldenRun(key=key, digest=d["digest"],
                     losses={int(k): v for k, v in d["losses"].items()},
                     wall_s=d["wall_s"], run_dir=d["run_dir"], cached=cached,
                     tensors=d.get("tensors") or {}, not_measured=d.get("not_measured"),
                     checkpoints_outside=tuple(d.get("checkpoints_outside") or ()),
                     final_checkpoint=d.get("final_checkpoint"), where=d.get("where") or {},
                     site=d.get("site"), cold_start_s=d.get("cold_start_s"),
                     step_s=d.get("step_s"), exit_codes=d.get("exit_codes"),
                     second=None if second is None else {
                         **second, "losses": {int(k): v for k, v in second["losses"].items()}})


def _second_of(run: GoldenRun) -> dict[str, Any]:
    return {"digest": run.digest, "losses": run.losses, "tensors": run.tensors,
            "run_dir": run.run_dir, "final_checkpoint": run.final_checkpoint,
            "where": run.where, "site": run.site, "wall_s": run.wall_s,
            "exit_codes": run.exit_codes}


def _measure(exp: Experiment, folder: Path, key: str, timeout_s: float,
             view: View | None) -> GoldenRun:
    """One fault-free run of ``exp`` on its own target, through the same ``JobSession`` an
    experiment's run uses; raises ``GoldenRunFailed`` (never launched) or ``SharedCheckpoint``."""
    from faultlab.engine.session import JobSession

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    plain = exp.model_copy(update={"faults": []})
    session = JobSession(plain, folder, view=view)
    run_dir = session.job_dir
    t0 = time.monotonic()
    finished = False
    try:
        session.prepare()
        session.start()
        finished = session.watch(timeout_s)
    finally:
        session.stop()
    target = session.target
    assert target is not None
    where = {**reference_site(exp), **_job_id(target)}
    if not finished:
        raise GoldenRunFailed(f"the golden run of {exp.name!r} did not finish within "
                              f"{timeout_s:.0f} s; logs in {run_dir / 'logs'}")
    target.stream.poll()
    foreign = None
    if exp.target.command:  # a user's trainer: judged by exit codes and its checkpoint
        foreign = complete_events(run_dir, target.stream.events)
        target.stream.poll()
    events = target.stream.events
    resumes = foreign_resumes(events, run_dir)
    if resumes:  # before judging its outcome: this is why it is what it is
        raise SharedCheckpoint(resumes, run_dir)
    metrics = compute_metrics(events, [])
    result = target.result()
    failed = not result.ok if foreign is not None else \
        not metrics.completes or metrics.final_digest is None
    if failed:
        tail = _log_tail(run_dir)
        raise GoldenRunFailed(f"the golden run of {exp.name!r} failed on its target "
                              f"({where.get('target')}{_job_suffix(where)}; exit codes "
                              f"{result.returncodes}); logs in {run_dir / 'logs'}"
                              + (f"; last log line: {tail}" if tail else ""))
    losses = {e["step"]: e["loss"] for e in events
              if e["kind"] == "step" and e["rank"] == 0 and "loss" in e}
    losses = losses or log_losses(exp, run_dir)
    failures = tuple(
        f"rank {e.get('rank')} exited {e.get('reason')}" + (
            f" ({str(e.get('error')).splitlines()[0][:120]})" if e.get("error") else "")
        for e in events if e.get("kind") == "exit"
        and e.get("reason") not in ("completed", "stopped"))
    # A rank aborted at exit, or crashed, writes no record of its own: its node's log says
    # it, and the finding names the cause (last: the verdict's note quotes the last one).
    failures += tuple(f"{f.text}; to change it: {f.change}" for f in
                      trainer_findings(node_logs(run_dir), (), events))
    return GoldenRun(key=key, digest=metrics.final_digest, losses=losses,
                     wall_s=time.monotonic() - t0, run_dir=str(run_dir), cached=False,
                     tensors=foreign.tensors if foreign else {},
                     not_measured=foreign.not_measured if foreign else None,
                     checkpoints_outside=tuple(outside_saves(events, run_dir)),
                     restarts=metrics.restarts, failures=failures,
                     final_checkpoint=(foreign.path if foreign else
                                       final_checkpoint_path(events)),
                     where=where, site=run_site(events),
                     cold_start_s=cold_start_s(events, session.launched_t),
                     step_s=step_time_s(events), exit_codes=dict(result.returncodes))


def _job_id(target: Any) -> dict[str, Any]:
    """The scheduler's id of the job (a Slurm job's), from the target's scheduler view."""
    view = target.scheduler_view()
    return {"slurm_job_id": view["job_id"]} if view and view.get("job_id") is not None else {}


def _job_suffix(where: dict[str, Any]) -> str:
    return f" job {where['slurm_job_id']}" if where.get("slurm_job_id") else ""


_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b")
_LAUNCHER = re.compile(r"^([EWIF]\d{4} |Traceback \(most recent call last\))")


def _log_tail(run_dir: Path) -> str | None:
    """The trainer's own last word in the nodes' logs: its last exception line (``KeyError:
    'SLURM_JOB_ID'``), else its last line before the launcher's report of the failure."""
    said = None
    for text in node_logs(run_dir).values():
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        raised = [ln for ln in lines if _EXCEPTION.match(ln) and "ChildFailedError" not in ln]
        if raised:
            return raised[-1][:200]
        before = next((i for i, ln in enumerate(lines) if _LAUNCHER.match(ln)), len(lines))
        said = said or (lines[before - 1][:200] if before else None)
    return said
