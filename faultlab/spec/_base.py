"""What every schema model shares: the pydantic configuration, located errors and the small
value checks several sections use.

Validators that need to point at a place other than the field they run on (``faults[1].
target.rank`` from the ``faults`` validator) raise ``located(...)``: pydantic merges the
errors of a ``ValidationError`` raised inside a validator into the outer one, prefixing
their locations, so the loader sees one flat list of located errors.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

__all__: list[str] = []  # private to faultlab.spec

SPEC_ERROR = "spec_error"
"""pydantic error type of faultlab's own messages (``ctx["message"]`` is the text)."""


class SpecModel(BaseModel):
    """Base of every experiment model: unknown keys are errors, values are not coerced.

    ``strict``: YAML already gives typed values, so ``"10"`` (a quoted string) is not an
    integer and ``yes`` is not a number. ``allow_inf_nan=False``: ``.inf`` is never a
    meaningful timeout or bound.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False,
                              use_attribute_docstrings=True)

    yaml_keys: ClassVar[tuple[str, ...] | None] = None
    """Keys a YAML mapping may hold here, when they differ from the model's fields."""

    @classmethod
    def valid_keys(cls) -> tuple[str, ...]:
        return cls.yaml_keys if cls.yaml_keys is not None else tuple(cls.model_fields)


def spec_error(loc: Sequence[str | int], message: str, value: Any) -> InitErrorDetails:
    """One located error with faultlab's own message (``loc`` relative to the validator)."""
    return InitErrorDetails(type=PydanticCustomError(SPEC_ERROR, "{message}",
                                                     {"message": message}),
                            loc=tuple(loc), input=value)


def located(errors: Iterable[InitErrorDetails], title: str = "Experiment") -> ValidationError:
    """A ``ValidationError`` to raise from a validator; pydantic prefixes its locations."""
    return ValidationError.from_exception_data(title, list(errors))


def relocate(exc: ValidationError, prefix: Sequence[str | int]) -> list[InitErrorDetails]:
    """The errors of ``exc`` with ``prefix`` put before their locations."""
    out: list[InitErrorDetails] = []
    for err in exc.errors(include_url=False):
        loc = (*prefix, *err["loc"])
        details = InitErrorDetails(type=err["type"], loc=loc, input=err["input"])
        if "ctx" in err:
            details["ctx"] = err["ctx"]
        try:  # a built-in error type round-trips; anything else keeps its rendered message
            ValidationError.from_exception_data("probe", [details])
        except Exception:
            details = spec_error(loc, err["msg"], err["input"])
        out.append(details)
    return out


def show(value: Any, limit: int = 80) -> str:
    """``repr(value)`` for a message, shortened; never raises (huge ints cannot be printed)."""
    try:
        text = repr(value)
    except Exception:  # int too large to convert, a broken __repr__: say what it is instead
        return f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 4] + " ..."


NAME_RE = re.compile(r"[a-z0-9_-]+")
"""An experiment's or suite's name."""


def as_tuple(value: Any) -> Any:
    """A YAML list as a tuple (the models are frozen); anything else is left to pydantic."""
    return tuple(value) if isinstance(value, list) else value


def slug_name(value: str, what: str, pattern: re.Pattern[str] = NAME_RE) -> str:
    if not pattern.fullmatch(value):
        slug = re.sub(r"[^a-z0-9_-]+", "_", value.lower()).strip("_") or "my_experiment"
        raise ValueError(f"{show(value)} is not a valid {what}: use only lowercase letters, "
                         f"digits, '_' and '-' (e.g. {slug!r})")
    return value


def choices(names: Iterable[object]) -> str:
    return ", ".join(str(n) for n in names)


def did_you_mean(word: object, candidates: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` when a candidate is close to ``word``, else ``""``."""
    if not isinstance(word, str):
        return ""
    candidates = list(candidates)
    same_letters = [c for c in candidates if c.casefold() == word.casefold()]
    close = same_letters or difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def unknown(what: str, value: object, known: Iterable[str], label: str) -> str:
    """``unknown launcher 'torchrn'; did you mean 'torchrun'? known launchers: a, b``."""
    known = list(known)
    hint = did_you_mean(value, known)
    return f"unknown {what} {show(value)}{hint or ';'} {label}: {choices(known)}"


_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def render_path(key: Sequence[Any]) -> str:
    """``("faults", 1, "trigger")`` → ``faults[1].trigger``; odd keys are quoted."""
    out = ""
    for part in key:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        elif isinstance(part, str) and _PLAIN_KEY.fullmatch(part):
            out += f".{part}" if out else part
        else:
            out += f"[{show(part, 40)}]"
    return out
