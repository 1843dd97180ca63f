"""The job under test and its shape: ``target`` (which trainer), ``topology`` (nodes, ranks,
backend, launcher) and ``run`` (steps, checkpoint interval, timeout).

Each model checks only itself; the rules that tie these sections to the faults (a rank inside
the world size, a trigger inside the run) and the trainer's config to ``run`` are the whole
document's, in ``faultlab.spec.model``.
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from faultlab.spec._base import SpecModel, as_tuple, located, show, spec_error, unknown
from faultlab.spec._trainer import check_overrides
from faultlab.spec.trainers import get_trainer, trainers

__all__ = ["PYTHON_NAMES", "RunSpec", "TargetSpec", "Topology"]

PYTHON_NAMES = ("python", "python3")
"""A command starting with one of these runs on the interpreter (and virtual environment)
faultlab itself runs on."""


class TargetSpec(SpecModel):
    """The job under test: a registered trainer (the bundled reference trainer by default), or
    your own trainer's command."""

    trainer: str | None = None
    """A trainer registered under the ``faultlab.trainers`` entry point: ``reference``, the
    bundled FSDP2 trainer, is the default unless ``command`` is given."""
    preset: str | None = None
    """Model preset of the trainer (its plugin's ``presets``; the first is the default)."""
    overrides: dict[str, Any] = Field(default_factory=dict)
    """The trainer's settings by config field name, e.g. ``global_batch: 12``."""
    command: Annotated[tuple[str, ...], Field(min_length=1)] | None = None
    """Your trainer's command (a list, or a string split like a shell would), run unchanged
    under torchrun by faultlab, which observes it through its runtime agent (level 0).
    ``{run_dir}`` in an argument stands for each launch's own run directory (``--ckpt-dir
    {run_dir}/checkpoints``), so the golden run and the experiment never share checkpoints; a
    bare ``python`` is the interpreter (and virtual environment) faultlab itself runs on."""

    @model_validator(mode="before")
    @classmethod
    def _reference_by_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("command") is None:
            data = dict(data)
            if data.get("trainer") is None:
                data["trainer"] = "reference"
            name = data["trainer"]
            if data.get("preset") is None and isinstance(name, str) and name in trainers():
                # the trainer's first preset is its default
                data["preset"] = get_trainer(name).presets[0]
        return data

    @field_validator("trainer", mode="before")
    @classmethod
    def _trainer(cls, value: Any) -> Any:
        if value is not None and (not isinstance(value, str) or value not in trainers()):
            others = [n for n in trainers() if n != "reference"]
            also = f" (registered: {', '.join(others)})" if others else ""
            raise ValueError(f"unknown trainer {show(value)}: the bundled trainer is "
                             f"'reference'{also}; to run your own trainer, set command: [...] "
                             f"instead")
        return value

    @field_validator("preset")
    @classmethod
    def _preset(cls, value: str | None, info: ValidationInfo) -> str | None:
        name = info.data.get("trainer")
        if value is not None and name is not None:
            presets = get_trainer(name).presets
            if value not in presets:
                raise ValueError(unknown("preset", value, presets, "choose from"))
        return value

    @field_validator("overrides")
    @classmethod
    def _overrides(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        name = info.data.get("trainer")
        if name is None:
            return value  # a command target: _one_kind reports overrides
        converted, errors = check_overrides(get_trainer(name), value)
        if errors:
            raise located(errors)
        return converted

    @field_validator("command", mode="before")
    @classmethod
    def _command(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return tuple(shlex.split(value))
            except ValueError as e:
                raise ValueError(f"cannot split {show(value)} into arguments: {e}; write "
                                 f"it as a list instead") from None
        return as_tuple(value)

    @field_validator("command")
    @classmethod
    def _command_found(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        # Every rank would fail the same way, restart after restart: refuse it here.
        if not value:
            return value
        exe = value[0]
        if exe not in PYTHON_NAMES and shutil.which(exe) is None:
            raise ValueError(f"{show(exe)} is not found: not on PATH, and no executable file "
                             f"of that name (relative paths start from the directory faultlab "
                             f"runs in, {show(str(Path.cwd()))})")
        script = value[1] if len(value) > 1 else ""
        if Path(exe).name.startswith("python") and script.endswith(".py") and \
                not Path(script).is_file():
            raise ValueError(f"{show(script)}: no such file (relative paths start from the "
                             f"directory faultlab runs in, {show(str(Path.cwd()))})")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> TargetSpec:
        if self.command is None:
            return self
        errors = []
        if self.trainer is not None:
            errors.append(spec_error(("command",), "set either trainer (the bundled "
                                     "reference trainer) or command (your own), not both",
                                     list(self.command)))
        for key in ("preset", "overrides"):
            if getattr(self, key):
                errors.append(spec_error((key,), f"{key} applies to the reference trainer "
                                         f"only; pass your trainer's own flags in command",
                                         getattr(self, key)))
        if errors:
            raise located(errors)
        return self

    @property
    def is_reference(self) -> bool:
        return self.command is None


# -------------------------------------------------------------------------- topology, run


class Topology(SpecModel):
    """Shape of the job: ``nodes`` torchrun agents with ``procs_per_node`` ranks each."""

    nodes: int = Field(default=2, ge=1)
    """Number of nodes (torchrun agents)."""
    procs_per_node: int = Field(default=1, ge=1)
    """Ranks per node."""
    min_nodes: int | None = Field(default=None, ge=1)
    """Fewest nodes the job may shrink to (elastic); ``null`` means ``nodes`` (no shrinking)."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """Process-group backend; ``auto`` is NCCL with a GPU, else gloo."""
    max_restarts: int = Field(default=3, ge=0)
    """Restarts torchrun allows the job before it gives up."""
    launcher: Literal["local", "docker"] = "local"
    """Where the nodes run: ``local`` (torchrun agents on this host, sharing its network) or
    ``docker`` (one container per node on a bridge network of its own; needs a Docker engine,
    and is what the ``network`` faults and ``node_pause`` act on)."""

    @model_validator(mode="after")
    def _min_nodes(self) -> Topology:
        if self.min_nodes is not None and self.min_nodes > self.nodes:
            raise located([spec_error(("min_nodes",), f"min_nodes ({self.min_nodes}) cannot "
                                      f"exceed nodes ({self.nodes})", self.min_nodes)])
        return self

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def effective_min_nodes(self) -> int:
        return self.nodes if self.min_nodes is None else self.min_nodes


class RunSpec(SpecModel):
    """How long the experiment runs."""

    steps: int = Field(default=40, ge=1)
    """Training steps of the run (the schedule horizon)."""
    checkpoint_every: int = Field(default=10, ge=1)
    """Checkpoint after every N steps."""
    timeout_s: float = Field(default=300.0, gt=0)
    """Wall-clock limit of the whole experiment; past it the job is stopped and fails."""
