"""pydantic's errors → faultlab's ``Problem`` s: a YAML path, a line and a message for people.

A pydantic location (``("faults", 1, "trigger", "at_step")``) is followed through the data
itself, so parts that are not in the document (union tags, ``[key]``) drop out and the path
is exactly what the user wrote. Messages say what was expected and show the value with
``!r``; an unknown key gets the closest valid key at that place, or the list of them.
"""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from faultlab.errors import Problem
from faultlab.fault_api import fault_types
from faultlab.spec._base import SPEC_ERROR, SpecModel, choices, did_you_mean, render_path, show
from faultlab.spec._yaml import Key, YamlDoc
from faultlab.spec.faults import FaultSpec

__all__: list[str] = []

_EXPECTED = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "float_type": "a number", "float_parsing": "a number", "finite_number": "a finite number",
    "bool_type": "true or false", "bool_parsing": "true or false",
    "string_type": "a string", "string_unicode": "a string", "str_type": "a string",
    "list_type": "a list", "tuple_type": "a list", "set_type": "a list",
    "dict_type": "a mapping", "model_type": "a mapping", "model_attributes_type": "a mapping",
    "dataclass_type": "a mapping", "none_required": "null",
}
_BOUNDS = {"greater_than": ("gt", ">"), "greater_than_equal": ("ge", ">="),
           "less_than": ("lt", "<"), "less_than_equal": ("le", "<=")}


def problems_from(exc: ValidationError, doc: YamlDoc, root: type[BaseModel],
                  file: Path | None) -> list[Problem]:
    out: list[Problem] = []
    for key, err in _one_per_value(doc.data, exc.errors(include_url=False)):
        message = _message(err, key, doc.data, root)
        out.append(Problem(file, doc.line_of(key), render_path(key), message))
    return out


_MAPPING_ERRORS = {"model_type", "dict_type", "model_attributes_type", "dataclass_type"}


def _one_per_value(data: Any, errors: list[ErrorDetails]) -> list[tuple[Key, ErrorDetails]]:
    """Each error with its place in the document; where a value of a union type (a number or
    a mapping: ``resume_time_s``) failed every member, the member's error that fits what was
    written is kept (a mapping's for a mapping, else the scalar's), and the rest at the same
    place drop out: one message per value, not one per member."""
    keyed = [(_data_key(data, err), err) for err in errors]

    def fits(item: tuple[Key, ErrorDetails]) -> bool:
        err = item[1]
        return (err["type"] in _MAPPING_ERRORS) == isinstance(err["input"], dict) or \
            err["type"] not in _MAPPING_ERRORS and err["type"] != "literal_error"

    best: dict[Key, tuple[Key, ErrorDetails]] = {}
    for item in keyed:  # in document order; at one place, the first error that fits
        if item[0] not in best or (fits(item) and not fits(best[item[0]])):
            best[item[0]] = item
    return list(best.values())


def _data_key(data: Any, err: ErrorDetails) -> Key:
    """The error's location as keys and indices that exist in ``data``."""
    loc, kind = err["loc"], err["type"]
    key: list[Any] = []
    cur: Any = data
    present = True
    for n, part in enumerate(loc):
        last = n == len(loc) - 1
        if kind == "invalid_key" and last and isinstance(cur, dict):
            part = err["input"]  # pydantic spells a None key as 'None'
        if present and isinstance(cur, dict) and _has(cur, part):
            cur = cur[part]
            key.append(part)
        elif present and isinstance(cur, list) and isinstance(part, int) and 0 <= part < len(cur):
            cur = cur[part]
            key.append(part)
        elif last and kind in ("missing", "extra_forbidden"):
            key.append(part)
            present = False
        # else: a part that names no place in the document (a union tag, "[key]"): skip it
    return tuple(key)


def _has(d: dict[Any, Any], part: Any) -> bool:
    try:
        return part in d
    except TypeError:
        return False


def _message(err: ErrorDetails, key: Key, data: Any, root: type[BaseModel]) -> str:
    kind, value, ctx = err["type"], err["input"], err.get("ctx") or {}
    got = f"got {show(value)}"
    if kind == SPEC_ERROR:
        return str(ctx["message"])
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    if kind == "extra_forbidden":
        return _unknown_key(key, data, root)
    if kind == "missing":
        return "required key is missing"
    if kind == "invalid_key" or (err["loc"] and err["loc"][-1] == "[key]"):
        return f"keys must be strings, {got}"
    if kind in _EXPECTED:
        expected = _EXPECTED[kind]
        if expected == "a mapping":
            keys = _valid_keys(key, data, root)
            if keys:
                expected += f" with keys {choices(keys)}"
        return f"expected {expected}, {got}"
    if kind in _BOUNDS:
        name, op = _BOUNDS[kind]
        bound = ctx.get(name)
        if isinstance(bound, float) and bound.is_integer():
            bound = int(bound)
        return f"must be {op} {bound}, {got}"
    if kind in ("literal_error", "enum"):
        options = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        return f"expected one of {choices(options)}, {got}{did_you_mean(value, options)}"
    if kind == "string_too_short":
        return f"must not be empty, {got}"
    if kind == "too_short":
        n = ctx.get("min_length", 1)
        return "must not be empty" if n == 1 else f"needs at least {n} items, {got}"
    if kind == "too_long":
        return f"takes at most {ctx.get('max_length')} items, {got}"
    if kind == "recursion_loop":
        return "the value refers to itself (a recursive YAML alias)"
    msg = str(err["msg"])
    return f"{msg[:1].lower()}{msg[1:]}, {got}"


def _unknown_key(key: Key, data: Any, root: type[BaseModel]) -> str:
    name = key[-1] if key else None
    keys = _valid_keys(key[:-1], data, root)
    text = f"unknown key {show(name)}"
    if not keys:
        fault = _fault_owning_params(key[:-1], data)
        return f"{text}: {fault} takes no params" if fault else text
    return text + (did_you_mean(name, keys) or f"; valid keys: {choices(keys)}")


def _fault_owning_params(key: Key, data: Any) -> str | None:
    """The fault type whose ``params`` mapping is at ``key`` (``faults[i].params``)."""
    if len(key) != 3 or key[0] != "faults" or key[2] != "params":
        return None
    try:
        fault_type = data["faults"][key[1]]["type"]
    except (KeyError, IndexError, TypeError):
        return None
    return fault_type if isinstance(fault_type, str) and fault_type in fault_types() else None


def _valid_keys(key: Key, data: Any, root: type[BaseModel]) -> tuple[str, ...]:
    """Keys a mapping at ``key`` may hold, found by following the schema along the data."""
    ann: Any = root
    cur: Any = data
    for part in key:
        ann = _strip(ann)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            if ann is FaultSpec and part == "params" and isinstance(cur, dict):
                fault_type = cur.get("type")
                fault = fault_types().get(fault_type) if isinstance(fault_type, str) else None
                ann = fault.Params if fault else None
            elif isinstance(part, str) and part not in ann.model_fields and \
                    hasattr(ann, "block_model"):  # a target's settings block (Topology)
                ann = ann.block_model(part)
            else:
                field = ann.model_fields.get(part) if isinstance(part, str) else None
                ann = field.annotation if field else None
        elif typing.get_origin(ann) in (list, tuple):
            ann = typing.get_args(ann)[0]
        elif typing.get_origin(ann) is dict:
            ann = typing.get_args(ann)[1]
        else:
            return ()
        cur = cur[part] if isinstance(cur, dict | list) and _has_part(cur, part) else None
    ann = _strip(ann)
    if isinstance(ann, type) and issubclass(ann, SpecModel):
        return ann.valid_keys()
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return tuple(ann.model_fields)
    return ()


def _has_part(cur: dict[Any, Any] | list[Any], part: Any) -> bool:
    if isinstance(cur, list):
        return isinstance(part, int) and 0 <= part < len(cur)
    return _has(cur, part)


def _strip(ann: Any) -> Any:
    """``Annotated[X, ...]`` and ``X | None`` → ``X``."""
    while True:
        origin = typing.get_origin(ann)
        if origin is typing.Annotated:
            ann = typing.get_args(ann)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(ann) if a is not type(None)]
            if len(args) != 1:
                return ann
            ann = args[0]
        else:
            return ann
