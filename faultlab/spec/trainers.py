"""Trainer registry: what ``target.trainer``, ``target.preset`` and ``target.overrides`` mean.

faultlab imports no trainer. A trainer that experiments may name registers an object under the
entry-point group ``faultlab.trainers`` (name = ``target.trainer``, value = ``module:object``),
exactly as a fault registers under ``faultlab.faults``; the bundled reference trainer is one
(``reference = "reference_trainer.plugin:TRAINER"``). A trainer given by ``target.command``
needs no registration: faultlab launches that command as it is.

The object is duck-typed; this is the contract (``TrainerPlugin``):

``name: str``
    The registered name.
``presets: Sequence[str]``
    Model presets ``target.preset`` may name; the first is the default.
``config_class: type``
    A dataclass. Its type-annotated fields are the settings ``target.overrides`` may set, by
    field name; faultlab checks each value's type against the annotation at load time.
``numerics_neutral: frozenset[str]``
    Settings that change how a run is operated but never one bit of what it computes (a
    checkpointing mode, a watchdog): left out of the golden-run cache key.
``monitor_settings: frozenset[str]`` (optional)
    Of those, the ones that decide what a fault-free run's monitors report (a watchdog's
    timeout, a spike factor): kept in the key of a golden run whose alarms a verdict counts
    (a campaign's false positives, ``false_alarms``; ``faultlab.engine.golden.golden_key``).
``make_config(run_dir: Path, **settings) -> config``
    Builds and validates a config from ``settings`` (``preset``, ``steps``,
    ``checkpoint_every``, ``seed``, ``device`` — where the class has such a field — and the
    overrides). Raises ``ValueError`` on a bad value; an attribute ``flag`` on the error (e.g.
    ``"--global-batch"``) names the setting, so faultlab can point at the override's key.
``command(config) -> list[str]``
    The full command line of one rank, interpreter included.
``preflight(config, world_size: int) -> None``
    Refuses, with ``ValueError``, a launch that could only crash-loop (an unusable run
    directory, a batch smaller than the world size).
``source_files() -> list[Path]``
    The files whose content decides what the trainer computes (the golden-run cache key).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from faultlab import registry

__all__ = ["ENTRY_POINT_GROUP", "TrainerPlugin", "config_settings", "get_trainer", "trainers"]

ENTRY_POINT_GROUP = registry.GROUPS["trainer"]


@runtime_checkable
class TrainerPlugin(Protocol):
    """A trainer that experiments may name in ``target.trainer`` (see the module docstring)."""

    name: str
    presets: Sequence[str]
    config_class: type
    numerics_neutral: frozenset[str]

    def make_config(self, run_dir: Path, **settings: Any) -> Any: ...

    def command(self, config: Any) -> list[str]: ...

    def preflight(self, config: Any, world_size: int) -> None: ...

    def source_files(self) -> list[Path]: ...


@cache
def trainers() -> dict[str, TrainerPlugin]:
    """Every registered trainer by name (``faultlab.registry``). A broken plugin is an error,
    never skipped."""
    return {name: registry.load("trainer", name, check=_checker(name))
            for name in registry.registered("trainer")}


def _checker(name: str) -> Any:
    def check(obj: Any) -> str | None:
        missing = [a for a in ("name", "presets", "config_class", "numerics_neutral",
                               "make_config", "command", "preflight", "source_files")
                   if not hasattr(obj, a)]
        if missing:
            return f"lacks {', '.join(missing)} (see faultlab.spec.trainers)"
        if not dataclasses.is_dataclass(obj.config_class):
            return f"has config_class {obj.config_class!r}, which is not a dataclass"
        if obj.name != name:
            return f"declares name={obj.name!r}; they must match"
        return None

    return check


def get_trainer(name: str) -> TrainerPlugin:
    """The trainer registered as ``name``; KeyError if there is none."""
    return trainers()[name]


def config_settings(trainer: TrainerPlugin, **settings: Any) -> dict[str, Any]:
    """The settings faultlab gives every trainer (``preset``, ``steps``, ``checkpoint_every``,
    ``seed``, ``device``), kept where the trainer's config class has such a field."""
    fields = {f.name for f in dataclasses.fields(trainer.config_class)}
    return {k: v for k, v in settings.items() if k in fields}
