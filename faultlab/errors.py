"""Every exception faultlab raises on purpose.

    FaultlabError                   base: catch this to catch everything below
    ├── InvalidExperimentError      the experiment document is wrong (a user mistake, exit 2);
    │                               carries file, line and the YAML path of every problem
    ├── PluginError                 a fault plugin cannot be loaded or is malformed
    ├── TargetError                 the job cannot be launched or addressed
    └── FaultError                  a fault could not be injected or undone; names the fault,
                                    its target and what was tried

Messages say where (file:line, YAML path, rank, step), show the bad value with ``!r``, list the
valid choices and say how to fix it. The CLI prints them without a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "FaultError",
    "FaultlabError",
    "InvalidExperimentError",
    "Problem",
    "PluginError",
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
    """A fault plugin (entry point ``faultlab.faults``) cannot be loaded or is malformed."""


class TargetError(FaultlabError):
    """The job cannot be launched, or a process of it cannot be addressed."""


class FaultError(FaultlabError):
    """A fault could not be injected or undone."""
