"""Chaos Toolkit control: a faultlab run context around an experiment.

Declare it at the experiment's top level::

    "controls": [{"name": "faultlab-run", "provider": {"type": "python",
                  "module": "chaosfaultlab.control",
                  "arguments": {"preset": "tiny", "steps": 30, "nodes": 2}}}]

Before the experiment it launches the training job (the arguments of
``chaosfaultlab.actions.start_training``), waits until the job has completed ``ready_step``,
and sets ``configuration["faultlab_run_dir"]`` so activities can say
``"run_dir": "${faultlab_run_dir}"`` (or leave ``run_dir`` out). With ``attach_run_dir``
instead, it launches nothing and points the activities at that already-running job (the
staging case); with ``slurm_job_id``, at that running Slurm job (its events in
``attach_run_dir``, default the job's working directory). An ``experiment_file`` whose
``topology.launcher`` is ``slurm`` launches a Slurm batch job.

After the experiment — whatever its outcome: completed, deviated, failed, interrupted — and
again on clean-up (idempotent), every fault still active is undone and a job the context
launched is continued and reaped. An attached job is never stopped; only its faults are
undone. If the ``chaos`` process itself is killed, the launched job's guard process continues
and kills it (see ``chaosfaultlab._jobs``).

A run context that cannot start interrupts the experiment (status ``interrupted``) instead of
letting its activities run against nothing; invalid control arguments are rejected when
``chaos`` validates the experiment, before anything runs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from chaoslib.exceptions import InterruptExecution, InvalidActivity

from chaosfaultlab import _jobs
from chaosfaultlab.actions import start_training, undo_faults
from faultlab.errors import FaultlabError
from faultlab.targets.attach import AttachedTarget

__all__ = ["after_experiment_control", "before_experiment_control", "cleanup_control",
           "configure_control", "validate_control"]

logger = logging.getLogger("chaostoolkit")


@dataclass(kw_only=True, slots=True)
class RunContextConfig:
    """The control's ``provider.arguments``."""

    experiment_file: str | None = None
    """A faultlab experiment file whose target, topology, steps and seed define the job."""
    preset: str | None = None
    """Model preset of the reference trainer (default ``tiny``) when there is no file."""
    steps: int | None = None
    """Training steps (default 30)."""
    nodes: int | None = None
    """Local nodes, i.e. torchrun agents (default 2)."""
    procs_per_node: int | None = None
    """Ranks per node (default 1)."""
    min_nodes: int | None = None
    """Fewest nodes the job may shrink to (default: ``nodes``)."""
    checkpoint_every: int | None = None
    """Checkpoint interval in steps (default 10)."""
    seed: int | None = None
    """Trainer seed (default 0)."""
    overrides: dict[str, Any] | None = None
    """Trainer settings, as a faultlab experiment's ``target.overrides``."""
    run_dir: str | None = None
    """Where the job runs; default a new ``<report_dir>/<name>-<timestamp>``."""
    report_dir: str = "reports/chaos"
    """Parent of the default run directory."""
    name: str = "chaos"
    """Name of the run (run directory prefix)."""
    ready_step: int = 1
    """Begin the experiment once the job has completed this step (0: at once)."""
    ready_timeout_s: float = 180.0
    """Give up (and interrupt the experiment) if ``ready_step`` takes longer than this."""
    attach_run_dir: str | None = None
    """Attach to the job already running in this run directory instead of launching one."""
    slurm_job_id: int | str | None = None
    """Attach to this running Slurm job (a number, or ``${...}`` from the configuration)."""
    allow_node_state_changes: bool = False
    """With ``slurm_job_id``: allow ``slurm_node_down`` on the job's nodes (it changes them for
    every user of the cluster)."""

    def __post_init__(self) -> None:
        if self.allow_node_state_changes and self.slurm_job_id is None:
            raise ValueError("allow_node_state_changes: goes with slurm_job_id (a launched "
                             "Slurm job takes it from its experiment file's slurm block)")
        if self.slurm_job_id is not None and (
                isinstance(self.slurm_job_id, bool)
                or not str(self.slurm_job_id).strip().lstrip("$").strip("{}").strip()):
            raise ValueError(f"slurm_job_id: expected a Slurm job id, got "
                             f"{self.slurm_job_id!r}")
        if self.attach_run_dir is not None or self.slurm_job_id is not None:
            shaped = [f.name for f in fields(self) if f.name not in _ATTACH_OK
                      and getattr(self, f.name) != f.default]
            if shaped:
                what = (f"slurm_job_id: {self.slurm_job_id!r}" if self.slurm_job_id is not None
                         else f"attach_run_dir: {self.attach_run_dir!r}")
                raise ValueError(f"{what} attaches to a running job; leave out "
                                 f"{', '.join(shaped)} (those describe a job to launch)")
        if isinstance(self.ready_step, bool) or not isinstance(self.ready_step, int) \
                or self.ready_step < 0:
            raise ValueError(f"ready_step: expected an integer >= 0, got {self.ready_step!r}")
        if isinstance(self.ready_timeout_s, bool) or \
                not isinstance(self.ready_timeout_s, int | float) or self.ready_timeout_s <= 0:
            raise ValueError(f"ready_timeout_s: expected a number > 0, got "
                             f"{self.ready_timeout_s!r}")

    @classmethod
    def from_arguments(cls, arguments: dict[str, Any]) -> RunContextConfig:
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(arguments) - set(known))
        if unknown:
            raise ValueError(f"unknown argument {unknown[0]!r}; the faultlab run context "
                             f"takes: {', '.join(known)}")
        return cls(**arguments)


_ATTACH_OK = {"attach_run_dir", "slurm_job_id", "allow_node_state_changes", "ready_step",
              "ready_timeout_s"}
_LAUNCH_ARGS = ("experiment_file", "preset", "steps", "nodes", "procs_per_node", "min_nodes",
                "checkpoint_every", "seed", "overrides", "run_dir", "report_dir", "name")


@dataclass
class _Context:
    run_dir: Path
    launched: bool


_OPEN: list[_Context] = []


def validate_control(control: dict[str, Any]) -> None:
    """Called when ``chaos`` validates the experiment: reject bad arguments before any run."""
    try:
        RunContextConfig.from_arguments(dict(control.get("provider", {}).get("arguments") or {}))
    except (ValueError, TypeError) as e:
        raise InvalidActivity(f"control {control.get('name')!r} (chaosfaultlab.control): "
                              f"{e}") from None


def configure_control(configuration: dict | None = None, **arguments: Any) -> None:
    """Nothing to set up before the run: the job starts in ``before_experiment_control``."""


def before_experiment_control(context: dict, configuration: dict | None = None,
                              **arguments: Any) -> None:
    """Launch (or attach to) the job and publish its run directory as ``faultlab_run_dir``."""
    try:
        cfg = RunContextConfig.from_arguments(arguments)
    except (ValueError, TypeError) as e:
        raise InterruptExecution(f"faultlab run context: {e}") from None
    try:
        if cfg.slurm_job_id is not None:
            run_dir = _jobs.attach_slurm(cfg.slurm_job_id, cfg.attach_run_dir,
                                         cfg.allow_node_state_changes)
            _OPEN.append(_Context(run_dir, launched=False))
        elif cfg.attach_run_dir is not None:
            run_dir = _jobs.resolve_run_dir(cfg.attach_run_dir)
            if not AttachedTarget(run_dir).running():
                raise FaultlabError(f"attach_run_dir: no job is running in {str(run_dir)!r}")
            _OPEN.append(_Context(run_dir, launched=False))
        else:
            run_dir = Path(start_training(**{k: getattr(cfg, k) for k in _LAUNCH_ARGS}))
            _OPEN.append(_Context(run_dir, launched=True))
        attached = cfg.attach_run_dir is not None or cfg.slurm_job_id is not None
        logger.info(f"faultlab run context: {'attached to' if attached else 'launched'}"
                    f" the job in {run_dir}")
        _wait_ready(run_dir, cfg)
    except FaultlabError as e:
        _close_all()
        raise InterruptExecution(f"faultlab run context: {e}") from None
    if configuration is not None:
        configuration[_jobs.CONFIG_KEY] = str(run_dir)


def _wait_ready(run_dir: Path, cfg: RunContextConfig) -> None:
    from faultlab.observe import EventStream

    stream = EventStream(run_dir)

    def ready() -> bool:
        stream.poll()
        return stream.max_step() >= cfg.ready_step

    if _jobs.wait_until(lambda: ready() or not _jobs.job_running(run_dir), cfg.ready_timeout_s) \
            and ready():
        return
    state = "ended" if not _jobs.job_running(run_dir) else \
        f"did not get there within {cfg.ready_timeout_s:g} s"
    raise FaultlabError(f"the job in {run_dir} was to complete step {cfg.ready_step} before "
                        f"the experiment, but it {state} (at step {stream.max_step()}); logs "
                        f"in {run_dir / 'logs'}")


def after_experiment_control(context: dict, state: Any = None,
                             configuration: dict | None = None, **arguments: Any) -> None:
    """Undo every fault and stop the launched job, whatever the experiment's outcome."""
    _close_all()


def cleanup_control() -> None:
    """Same as ``after_experiment_control`` (idempotent): the last chance to clean up."""
    _close_all()


def _close_all() -> None:
    while _OPEN:
        ctx = _OPEN.pop()
        # Each step is attempted even if the one before failed: a fault must never be left.
        try:
            result = undo_faults(str(ctx.run_dir))
            if result["undone"] or result["errors"]:
                logger.info(f"faultlab run context: undid {result['undone']} in {ctx.run_dir}"
                            + (f"; could not undo {result['errors']}" if result["errors"]
                               else ""))
        except Exception as e:  # chaoslib would only log it at debug level: say it loudly
            logger.error(f"faultlab run context: undoing faults in {ctx.run_dir} failed: {e}")
        try:  # an attached Slurm job: forgotten, what its faults left on the cluster restored
            restored = _jobs.detach_slurm(ctx.run_dir)
            if any(restored.values()):
                logger.info(f"faultlab run context: restored {restored}")
        except Exception as e:
            logger.error(f"faultlab run context: restoring the cluster failed: {e}")
        if ctx.launched:
            try:
                _jobs.stop(ctx.run_dir)
                logger.info(f"faultlab run context: stopped the job in {ctx.run_dir}")
            except Exception as e:
                logger.error(f"faultlab run context: stopping the job in {ctx.run_dir} "
                             f"failed: {e}")
