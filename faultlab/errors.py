"""Every exception faultlab raises, the whole tree (its classes are defined here and nowhere
else; the module that raises one imports it from here, and its old import path still works):

    FaultlabError                   base: catch this to catch everything below
    ├── InvalidExperimentError      the experiment document is wrong (a user mistake, exit 2);
    │                               carries file, line and the YAML path of every problem
    ├── PluginError                 a plugin (fault, SLA, target, trainer) cannot be loaded or
    │                               is malformed
    ├── InitError                   ``faultlab init`` cannot turn the command into an experiment
    ├── PlanError                   a runtime plan or a live-inject entry is invalid (in a rank;
    │                               also a ValueError)
    ├── CheckpointError             no checkpoint can be loaded, or one cannot be written (the
    │                               manifests of ``faultlab.runtime``; also a RuntimeError)
    ├── SharedCheckpoint            the golden run resumed from checkpoints it did not write
    ├── SharedCheckpointStop        the engine stopped before the experiment ran: checkpoints
    │                               shared between runs
    ├── RelayDown                   a rank cannot reach its node's relay (also an OSError); never
    │                               reaches a user: the rank writes its events to its own file
    ├── ExperimentFailed            an experiment ran and did not pass (defined by the pytest
    │                               plugin, ``pytest_faultlab``, which faultlab never imports)
    ├── TargetError                 the job cannot be launched or addressed
    │   ├── LaunchError             the job cannot be launched as asked (also a ValueError)
    │   ├── ServiceError            a service of ``target.services`` could not be started (also a
    │   │                           ValueError)
    │   ├── SlurmError              a Slurm command failed (also a RuntimeError)
    │   ├── NotShared               the Slurm nodes do not see the runs root faultlab writes
    │   ├── GoldenRunFailed         the fault-free run failed or timed out: no reference
    │   └── RuntimeControlError     no answer from a rank's runtime agent (also a ValueError)
    └── FaultError                  a fault could not be injected or undone; names the fault,
        │                           its target and what was tried
        └── ActionError             a fault's action cannot strike on this rank (in a rank: its
            │                       ``fault_failed`` event; also a ValueError)
            └── NoParameterError    ``param_glob`` selects no parameter on this rank

Those that were ``ValueError``, ``RuntimeError`` or ``OSError`` before they joined the tree
still are, so an ``except ValueError`` written against them still catches them.
``faultlab.runtime`` imports this module and nothing else of faultlab (it needs only the
standard library), so a rank's exceptions are in the tree too.

Messages say where (file:line, YAML path, rank, step), show the bad value with ``!r``, list the
valid choices and say how to fix it. The CLI prints them without a traceback.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ActionError",
    "CheckpointError",
    "FaultError",
    "FaultlabError",
    "GoldenRunFailed",
    "InitError",
    "InvalidExperimentError",
    "LaunchError",
    "NoParameterError",
    "NotShared",
    "PlanError",
    "PluginError",
    "Problem",
    "RelayDown",
    "RuntimeControlError",
    "ServiceError",
    "SharedCheckpoint",
    "SharedCheckpointStop",
    "SlurmError",
    "TargetError",
]


class FaultlabError(Exception):
    """Base of every error faultlab raises on purpose."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One located problem in an experiment document."""

    file: Path | None
    line: int | None
    path: str
    """YAML path, e.g. ``faults[1].trigger.at_step``; empty for the document itself."""
    message: str

    def __str__(self) -> str:
        where = str(self.file) if self.file else "<experiment>"
        if self.line is not None:
            where += f":{self.line}"
        return f"{where} {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


class InvalidExperimentError(FaultlabError):
    """The experiment document is invalid; ``problems`` lists every problem found."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class PluginError(FaultlabError):
    """A plugin (an entry point of ``faultlab.faults``, ``faultlab.slas``, ``faultlab.targets``
    or ``faultlab.trainers``) cannot be loaded or is malformed."""


class InitError(FaultlabError):
    """The command cannot be turned into an experiment (``faultlab init``); the message says
    why."""


class PlanError(FaultlabError, ValueError):
    """A runtime plan or a live-inject entry is invalid; the message says where and why."""


class CheckpointError(FaultlabError, RuntimeError):
    """No checkpoint can be loaded, or one cannot be written; the message says which and why."""


class SharedCheckpoint(FaultlabError):
    """The golden run resumed from checkpoints it did not write (``resumes``: the
    ``ForeignResume`` records of ``faultlab.observe.checkpoint_origin``); the engine words it
    with the experiment's location (``faultlab.engine.shared_checkpoints``)."""

    def __init__(self, resumes: Sequence[Any], run_dir: Path) -> None:
        self.resumes = resumes
        self.run_dir = run_dir
        paths = ", ".join(str(r.path) for r in resumes)
        super().__init__(f"the golden run in {run_dir} resumed from {paths}, which it did not "
                         f"write")


class SharedCheckpointStop(FaultlabError):
    """The engine stopped before the experiment ran, for checkpoints shared between runs; the
    message is located and says the fix."""


class RelayDown(FaultlabError, OSError):
    """The node's relay cannot be reached (and could not be started)."""


class TargetError(FaultlabError):
    """The job cannot be launched, or a process of it cannot be addressed."""


class LaunchError(TargetError, ValueError):
    """The job cannot be launched as asked; the message names the flag or path and why."""


class ServiceError(TargetError, ValueError):
    """A service could not be started; the message names it, its log and why."""


class SlurmError(TargetError, RuntimeError):
    """A Slurm command failed: the command line and what Slurm said."""


class NotShared(TargetError):
    """The nodes do not see the runs root (``topology.slurm.run_dir``) that faultlab writes."""


class GoldenRunFailed(TargetError):
    """The fault-free run failed or timed out: there is no reference, and the experiment is
    not launched."""


class RuntimeControlError(TargetError, ValueError):
    """No answer from a rank's runtime agent; the message names the rank and the run dir."""


class FaultError(FaultlabError):
    """A fault could not be injected or undone."""


class ActionError(FaultError, ValueError):
    """The action cannot strike on this rank (no such parameter, no model): reported as the
    fault's ``fault_failed`` event, the job goes on."""


class NoParameterError(ActionError):
    """``param_glob`` selects no parameter with a non-empty local shard on this rank."""
