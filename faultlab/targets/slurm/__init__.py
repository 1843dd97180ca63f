"""The slurm target: the job is a Slurm batch job; faultlab runs where ``sbatch`` works.

``topology.launcher: slurm`` submits either faultlab's own batch script (one torchrun agent per
allocated node through ``srun``, the c10d rendezvous on the first node, the registered trainer
or ``target.command`` as each rank) or the user's own script (``slurm.script``), unchanged, with
faultlab's environment exported. The run directory is on the cluster's shared filesystem
(``slurm.run_dir``): the ranks write their events, logs and checkpoints there, and faultlab,
on the login node, reads them at the same path.

The job is followed through Slurm itself (``scontrol -o show job``: state, reason, restarts,
node list, exit code); every change is recorded with its time (``scheduler_view``), next to the
trainer's own events. Faults reach a node the way Slurm lets a job's owner reach it: a step
inside the job's allocation, ``srun --jobid J --overlap -w NODE -N1 -n1``, running faultlab's
node command (``faultlab.targets.slurm.node``) against the node's own process table, never the
login host's. Scheduler-level faults (a node set down, a preemption notice, a requeue) go
through ``scontrol`` and ``scancel``. What a fault changed outside the job (a node down, a test
cluster's machine killed) is written to the guard's state file before it is done, so that the
guard process undoes it if faultlab itself dies; ``stop`` cancels the job.

Modules: ``job`` (the job directory, the batch script, the ``sbatch`` line), ``scheduler``
(following the job through ``scontrol``; ``scancel`` and requeue), ``guard`` (changes outside
the job and their undoing), ``target`` (``SlurmTarget``: the ``Target`` contract, life cycle,
ranks and nodes), ``slurmcli`` (Slurm's commands) and ``node`` (faultlab's node command).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from faultlab.targets.slurm.guard import LAB_LABEL, restore_from_guard
    from faultlab.targets.slurm.job import prepare_job_dir
    from faultlab.targets.slurm.scheduler import SlurmJobResult
    from faultlab.targets.slurm.target import SlurmTarget

_WHERE = {"LAB_LABEL": "faultlab.targets.slurm.guard",
          "restore_from_guard": "faultlab.targets.slurm.guard",
          "prepare_job_dir": "faultlab.targets.slurm.job",
          "SlurmJobResult": "faultlab.targets.slurm.scheduler",
          "SlurmTarget": "faultlab.targets.slurm.target"}
"""Imported on first use: the node command (``python -m faultlab.targets.slurm.node``, every
node's task of a job and every fault's step on a node) runs on the standard library alone,
and importing this package for it cost each such process 0.45 CPU-s (the spec's pydantic and
numpy), on every node of every job."""

__all__ = ["LAB_LABEL", "SlurmJobResult", "SlurmTarget", "prepare_job_dir", "restore_from_guard"]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'faultlab.targets.slurm' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
