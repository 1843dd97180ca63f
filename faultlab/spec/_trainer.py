"""Checks of ``target.overrides`` against a registered trainer's own config class.

The trainer comes from the registry (``faultlab.spec.trainers``); for ``reference`` its config
class is the reference trainer's ``TrainConfig``. Names are the dataclass's field names
(``global_batch``, not ``--global-batch``). Types are checked first, field by field, so that
``lr: fast`` is reported as a type error instead of crashing the class's ``__post_init__``; then
a whole config is built (``make_config``), so every rule the trainer enforces
(``warmup_steps >= 0``, ``nonfinite_policy`` choices ...) holds at load time, and its error
(whose ``flag`` attribute names a flag) is mapped back to the override's key.
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
from faultlab.spec.trainers import TrainerPlugin, config_settings

__all__: list[str] = []

OWNED_BY_EXPERIMENT: dict[str, str] = {  # where the trainer's config has such a field
    "run_dir": "faultlab gives every run its own directory",
    "steps": "set run.steps instead",
    "checkpoint_every": "set run.checkpoint_every instead",
    "seed": "set the experiment's seed (or pass --seed) instead",
    "preset": "set target.preset instead",
    "stop_after": "faultlab decides when the run stops",
}
"""Config fields the experiment sets elsewhere, with where to set them."""


@cache
def _adapters(config_class: type) -> dict[str, TypeAdapter[Any]]:
    hints = typing.get_type_hints(config_class)
    out: dict[str, TypeAdapter[Any]] = {}
    for f in dataclasses.fields(config_class):
        if f.name in OWNED_BY_EXPERIMENT:
            continue
        hint = hints[f.name]
        # YAML has no tuples: a list is fine where the trainer wants a tuple.
        strict = typing.get_origin(hint) is not tuple
        out[f.name] = TypeAdapter(hint, config=ConfigDict(strict=strict, allow_inf_nan=False))
    return out


def override_names(trainer: TrainerPlugin) -> tuple[str, ...]:
    """Config fields an experiment may override."""
    return tuple(_adapters(trainer.config_class))


def check_overrides(trainer: TrainerPlugin, overrides: dict[str, Any]
                    ) -> tuple[dict[str, Any], list[InitErrorDetails]]:
    """Names and types of ``overrides``; returns the converted values and located errors."""
    adapters = _adapters(trainer.config_class)
    values: dict[str, Any] = {}
    errors: list[InitErrorDetails] = []
    for key, value in overrides.items():
        if key in OWNED_BY_EXPERIMENT:
            errors.append(spec_error((key,), f"{key!r} cannot be overridden: "
                                             f"{OWNED_BY_EXPERIMENT[key]}", value))
        elif key not in adapters:
            hint = did_you_mean(key, adapters) or f"; valid keys: {choices(adapters)}"
            errors.append(spec_error((key,), f"unknown {trainer.name}-trainer setting {show(key)}"
                                             f"{hint}", value))
        else:
            try:
                values[key] = adapters[key].validate_python(value)
            except ValidationError as e:
                errors.extend(relocate(e, (key,)))
    return values, errors


def check_train_config(trainer: TrainerPlugin, *, preset: str, overrides: dict[str, Any],
                       steps: int, checkpoint_every: int, seed: int) -> list[InitErrorDetails]:
    """Build the config the experiment implies; errors located under ``target``."""
    settings = config_settings(trainer, preset=preset, steps=steps,
                               checkpoint_every=checkpoint_every, seed=seed)
    try:
        trainer.make_config(Path("."), **settings, **overrides)
    except ValueError as e:
        flag = getattr(e, "flag", None)
        if not isinstance(flag, str):
            return [spec_error(("overrides",), f"the {trainer.name} trainer rejects these "
                                               f"settings: {e}", overrides)]
        field = flag.removeprefix("--").replace("-", "_")
        message = str(e).removeprefix(f"{flag}: ")
        if field in overrides:
            return [spec_error(("overrides", field), message, overrides[field])]
        if field == "preset":
            return [spec_error(("preset",), message, preset)]
        return [spec_error(("overrides",), f"{flag.removeprefix('--')}: {message}",
                           overrides)]
    except Exception as e:  # the types were checked; anything left is still the user's value
        return [spec_error(("overrides",), f"the {trainer.name} trainer rejects these "
                                           f"settings: {type(e).__name__}: {e}", overrides)]
    return []
