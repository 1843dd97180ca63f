"""Targets: how a job is launched and addressed, behind one contract (``base.Target``).

Implementations, none importing another's module but through this package's ``make_target``:

- ``local``: torchrun agents on this host, started by ``launcher.LocalJob`` with a rendezvous
  store served by the launching process and a faster-polling torchrun agent (``torchrun_agent``);
- ``docker``: one container per node on a network of the run's own (it reuses ``local``'s
  launch with the nodes swapped: ``DockerJob`` fills ``LocalJob``'s node hooks);
- ``slurm``: a Slurm batch job (faultlab's batch script or the user's), followed through
  ``scontrol`` and reached on its nodes through steps inside its allocation;
- ``attach``: a job already running, found by its run directory.

What it owns: launching any command (a registered trainer's or a user's), process trees and
signals (``procs``), node addressing, files on nodes. It may import ``faultlab.errors``,
``faultlab.spec``, ``faultlab.observe`` and ``faultlab.runtime``; never the engine, the faults,
the report, or any trainer (a trainer is reached through ``faultlab.spec.trainers``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from faultlab.spec import Experiment
    from faultlab.targets.local import LocalTarget

__all__ = ["make_target", "target_class"]


def target_class(exp: Experiment) -> type[LocalTarget]:
    """The target class ``topology.launcher`` asks for (each imported only when asked for)."""
    if exp.topology.launcher == "slurm":
        from faultlab.targets.slurm import SlurmTarget

        return SlurmTarget  # type: ignore[return-value]
    if exp.topology.launcher == "docker":
        from faultlab.targets.docker import DockerTarget

        return DockerTarget
    from faultlab.targets.local import LocalTarget

    return LocalTarget


def make_target(exp: Experiment, run_dir: Path,
                node_env: dict[str, dict[str, str]] | None = None) -> LocalTarget:
    """The target ``topology.launcher`` asks for (``target_class``), for ``run_dir``."""
    return target_class(exp)(exp, run_dir, node_env=node_env)
