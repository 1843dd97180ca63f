"""Checks of ``target.overrides`` against the reference trainer's own ``TrainConfig``.

Names are the dataclass's field names (``global_batch``, not ``--global-batch``). Types are
checked first, field by field, so that ``lr: fast`` is reported as a type error instead of
crashing ``TrainConfig.__post_init__``; then a whole ``TrainConfig`` is built, so every rule
the trainer enforces (``warmup_steps >= 0``, ``nonfinite_policy`` choices ...) holds at load
time, and its ``ConfigError`` (which names a flag) is mapped back to the override's key.
"""

from __future__ import annotations

import dataclasses
import typing
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError
from pydantic_core import InitErrorDetails

from faultlab.spec._base import choices, did_you_mean, relocate, show, spec_error
from reference_trainer.config import ConfigError, TrainConfig

__all__: list[str] = []

OWNED_BY_EXPERIMENT: dict[str, str] = {
    "run_dir": "faultlab gives every run its own directory",
    "steps": "set run.steps instead",
    "checkpoint_every": "set run.checkpoint_every instead",
    "seed": "set the experiment's seed (or pass --seed) instead",
    "preset": "set target.preset instead",
    "stop_after": "faultlab decides when the run stops",
}
"""TrainConfig fields the experiment sets elsewhere, with where to set them."""


@cache
def _adapters() -> dict[str, TypeAdapter[Any]]:
    hints = typing.get_type_hints(TrainConfig)
    out: dict[str, TypeAdapter[Any]] = {}
    for f in dataclasses.fields(TrainConfig):
        if f.name in OWNED_BY_EXPERIMENT:
            continue
        hint = hints[f.name]
        # YAML has no tuples: a list is fine where the trainer wants a tuple.
        strict = typing.get_origin(hint) is not tuple
        out[f.name] = TypeAdapter(hint, config=ConfigDict(strict=strict, allow_inf_nan=False))
    return out


def override_names() -> tuple[str, ...]:
    """TrainConfig fields an experiment may override."""
    return tuple(_adapters())


def check_overrides(overrides: dict[str, Any]) -> tuple[dict[str, Any], list[InitErrorDetails]]:
    """Names and types of ``overrides``; returns the converted values and located errors."""
    adapters = _adapters()
    values: dict[str, Any] = {}
    errors: list[InitErrorDetails] = []
    for key, value in overrides.items():
        if key in OWNED_BY_EXPERIMENT:
            errors.append(spec_error((key,), f"{key!r} cannot be overridden: "
                                             f"{OWNED_BY_EXPERIMENT[key]}", value))
        elif key not in adapters:
            hint = did_you_mean(key, adapters) or f"; valid keys: {choices(adapters)}"
            errors.append(spec_error((key,), f"unknown reference-trainer setting {show(key)}"
                                             f"{hint}", value))
        else:
            try:
                values[key] = adapters[key].validate_python(value)
            except ValidationError as e:
                errors.extend(relocate(e, (key,)))
    return values, errors


def check_train_config(*, preset: str, overrides: dict[str, Any], steps: int,
                       checkpoint_every: int, seed: int) -> list[InitErrorDetails]:
    """Build the TrainConfig the experiment implies; errors located under ``target``."""
    try:
        TrainConfig(run_dir=Path("."), preset=preset, steps=steps,
                    checkpoint_every=checkpoint_every, seed=seed, **overrides)
    except ConfigError as e:
        field = e.flag.removeprefix("--").replace("-", "_")
        message = str(e).removeprefix(f"{e.flag}: ")
        if field in overrides:
            return [spec_error(("overrides", field), message, overrides[field])]
        if field == "preset":
            return [spec_error(("preset",), message, preset)]
        return [spec_error(("overrides",), f"{e.flag.removeprefix('--')}: {message}",
                           overrides)]
    except Exception as e:  # the types were checked; anything left is still the user's value
        return [spec_error(("overrides",), f"the reference trainer rejects these settings: "
                                           f"{type(e).__name__}: {e}", overrides)]
    return []
