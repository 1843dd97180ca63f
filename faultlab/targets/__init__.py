"""Targets: how a job is launched and addressed, behind one contract (``base.Target``).

Implementations, each registered under the ``faultlab.targets`` entry-point group as a team's
own would be, none importing another's module but through this package's ``make_target``:

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

from functools import cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from faultlab.errors import PluginError

if TYPE_CHECKING:
    from faultlab.spec import Experiment
    from faultlab.targets.base import Target

__all__ = ["ENTRY_POINT_GROUP", "make_target", "target_class", "target_type", "target_types"]

ENTRY_POINT_GROUP = "faultlab.targets"
"""``topology.launcher`` names an entry point of this group (name = the launcher, value =
``module:Class``); the built-ins ``local``, ``docker`` and ``slurm`` register here as a team's
target would."""


@cache
def target_types() -> dict[str, Any]:
    """Every registered target's entry point by launcher name (nothing is imported here)."""
    return {ep.name: ep for ep in sorted(entry_points(group=ENTRY_POINT_GROUP),
                                         key=lambda ep: ep.name)}


@cache
def _load(name: str) -> type[Target]:
    from faultlab.spec.target import launcher_class  # not at import: agents load this package

    cls = launcher_class(name)  # the entry point's lookup and import, and their errors
    for need in ("prepare_run_dir", "start", "finished", "result", "stop"):
        if not hasattr(cls, need):
            raise PluginError(f"target plugin {name!r} ({target_types()[name].value}) has no "
                              f"{need}(): it does not implement faultlab.targets.base.Target")
    return cls  # type: ignore[no-any-return]


def target_type(name: str) -> type[Target]:
    """The target class registered as launcher ``name`` (the guard loads a dead run's by the
    name its record carries)."""
    return _load(name)


def target_class(exp: Experiment) -> type[Target]:
    """The target class ``topology.launcher`` names (its module imported only when asked)."""
    return _load(exp.topology.launcher)


def make_target(exp: Experiment, run_dir: Path,
                node_env: dict[str, dict[str, str]] | None = None) -> Target:
    """The target ``topology.launcher`` names (``target_class``), for ``run_dir``."""
    return target_class(exp)(exp, run_dir, node_env=node_env)  # type: ignore[call-arg]
