"""The Slurm target's own settings: the block ``topology.slurm:`` of an experiment.

``SlurmTarget.settings`` is ``SlurmSettings``: the experiment loader parses the block with it
(file:line locations like every spec error) into ``exp.topology.settings``, the defaults where
the block is absent.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import Field, WithJsonSchema, field_validator

from faultlab.spec._base import SpecModel, as_tuple, show

__all__ = ["SLURM_SHARED_ENV", "SlurmSettings"]


SLURM_SHARED_ENV = "FAULTLAB_SLURM_SHARED"
"""A directory every node of the Slurm cluster sees at the same path (the local test cluster's
``scripts/slurm-cluster.sh env`` sets it): ``slurm.run_dir``'s default is ``runs/`` in it."""


class SlurmSettings(SpecModel):
    """How the job is submitted to Slurm: the block ``topology.slurm:`` (``launcher: slurm``;
    ``SlurmTarget.settings``). faultlab runs where the Slurm commands work (a login node):
    ``SLURM_CONF`` or the host's own configuration."""

    outside_the_bits: ClassVar[frozenset[str]] = frozenset(
        {"time_limit", "run_dir", "allow_node_state_changes"})
    """Settings that do not change what the job computes: left out of the golden run's key."""

    partition: str | None = None
    """``sbatch --partition``; the cluster's default partition if unset."""
    account: str | None = None
    """``sbatch --account``."""
    time_limit: str | None = None
    """``sbatch --time`` (``MM``, ``HH:MM:SS`` or ``D-HH``); the partition's default if unset."""
    sbatch_args: Annotated[tuple[str, ...], WithJsonSchema(
        {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]})] = ()
    """More ``sbatch`` options, as given (``--exclusive``, ``--no-requeue``, ``--signal=...``)."""
    run_dir: Annotated[Path, Field(strict=False)] | None = None
    """Where the job's run directories go, on a filesystem every node sees at the same path
    (events, logs, checkpoints); default ``$FAULTLAB_SLURM_SHARED/runs``."""
    script: Annotated[Path, Field(strict=False)] | None = None
    """Your own sbatch script, submitted unchanged (faultlab's own environment exported to it:
    ``FAULTLAB_RUN_DIR``, ``FAULTLAB_PYTHON``, and for a ``target.command`` the runtime agent's
    bootstrap); ``target`` then says what the script runs, for the golden run. Unset:
    faultlab's batch script, one torchrun agent per node with the c10d rendezvous on the first
    node, running ``target``."""
    allow_node_state_changes: bool = False
    """Allow faults that change a node's state for every user of the cluster
    (``slurm_node_down``); the node is always resumed on undo and by the guard."""

    @field_validator("sbatch_args", mode="before")
    @classmethod
    def _args(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(shlex.split(value))
        return as_tuple(value)

    @field_validator("script")
    @classmethod
    def _script(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"{show(str(value))}: no such file (relative paths start from the "
                             f"directory faultlab runs in, {show(str(Path.cwd()))})")
        return value

    @field_validator("run_dir")
    @classmethod
    def _run_dir(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_absolute():
            raise ValueError(f"{show(str(value))} is relative: give the absolute path every "
                             f"node sees")
        return value

    def runs_root(self) -> Path:
        """Where this experiment's run directories go (``run_dir`` or the shared default);
        ValueError when neither is set (checked when the run starts: a file that names no
        directory still validates on a machine that is not the cluster's login node)."""
        if self.run_dir is not None:
            return self.run_dir
        shared = os.environ.get(SLURM_SHARED_ENV)
        if not shared:
            raise ValueError(f"slurm.run_dir: not set, and neither is ${SLURM_SHARED_ENV}; give "
                             f"a directory every node sees at the same path")
        return Path(shared) / "runs"
