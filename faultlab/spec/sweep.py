"""What ``faultlab sweep`` varies: one place in an experiment document, over a list of values,
each value validated as a whole experiment before anything runs.

    path = parse_param_path("faults[slow-gpu-rank-1].params.factor")
    values = range_values(1.1, 3.0, points=5, scale="linear")   # 1.1, 1.57, 2.05, 2.52, 3
    points = sweep_points(Path("experiments/gpu_slow_straggler.yaml"), path, values)

A path is dotted keys into the YAML document. A list item is named by its index (``faults.0``
or ``faults[0]``) or by its name in brackets: a fault by its ``id`` (or the default id
``<type>-<index>`` of one without), any other list item by its ``id`` or ``name`` (e.g.
``observe.detections[fingerprint].period``). Every key on the way must exist; the last may be
missing when its parent is a mapping (a parameter left at its default), and the experiment's
own validation then says whether the key is known. Every mistake is one located ``Problem``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from faultlab.errors import InvalidExperimentError, Problem
from faultlab.spec._base import render_path, show
from faultlab.spec._yaml import Key, YamlDoc, read_yaml
from faultlab.spec.loader import _check_seed, experiment_from_dict
from faultlab.spec.model import Experiment

__all__ = ["SweepPoint", "parse_param_path", "parse_values", "range_values", "sweep_points"]

Scale = Literal["log", "linear"]
PathPart = str | int
"""One step of a path: a mapping key, a list index, or a list item's name (``"[name]"``)."""

_PART = re.compile(r"\.?([^.\[\]]+)|\[([^\[\]]+)\]")
SIGNIFICANT = 3
"""Digits a range's points keep, so the table reads 1.57, not 1.5750000000000002."""


@dataclass(frozen=True, slots=True)
class SweepPoint:
    index: int
    """1-based, in the order the points run."""
    value: Any
    experiment: Experiment


def parse_param_path(text: str) -> tuple[PathPart, ...]:
    """``faults[sdc-1].params.magnitude`` → ``("faults", "[sdc-1]", "params", "magnitude")``;
    digits are list indices. Raises ValueError saying what is wrong, with an example."""
    parts: list[PathPart] = []
    pos = 0
    while pos < len(text):
        m = _PART.match(text, pos)
        if m is None or (pos and m.group(1) is not None and not text[pos] == "."):
            raise ValueError(f"{text!r} is not a path into the experiment: cannot read it "
                             f"from character {pos + 1} ({text[pos:]!r}); write dotted keys, "
                             f"e.g. faults.0.params.factor or faults[slow-gpu-rank-1].params."
                             f"factor")
        key, name = m.group(1), m.group(2)
        if key is not None:
            parts.append(int(key) if key.isdigit() else key)
        else:
            parts.append(int(name) if name.isdigit() else f"[{name}]")
        pos = m.end()
    if not parts or not isinstance(parts[0], str) or parts[0].startswith("["):
        raise ValueError(f"{text!r} is not a path into the experiment: it starts with a key "
                         f"of the document, e.g. faults.0.params.factor")
    return tuple(parts)


def range_values(lo: float, hi: float, *, points: int, scale: Scale,
                 integers: bool = False) -> list[float] | list[int]:
    """``points`` values from ``lo`` to ``hi`` (both included), evenly spaced on ``scale``,
    each kept to ``SIGNIFICANT`` digits (integers: rounded, repeats dropped)."""
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"the range {lo!r}..{hi!r} must run from a smaller finite number to a "
                         f"larger one, e.g. 1.1..3")
    if points < 2:
        raise ValueError(f"a range needs --points >= 2, got {points!r}; for one value use "
                         f"--values")
    if scale == "log" and not lo > 0:
        raise ValueError(f"a log-spaced range needs LO > 0, got {lo!r}; use --scale linear")
    if scale == "log":
        step = (math.log10(hi) - math.log10(lo)) / (points - 1)
        raw = [10 ** (math.log10(lo) + i * step) for i in range(points)]
    else:
        raw = [lo + i * (hi - lo) / (points - 1) for i in range(points)]
    raw[0], raw[-1] = lo, hi
    if integers:
        return list(dict.fromkeys(round(v) for v in raw))
    return [float(f"{v:.{SIGNIFICANT}g}") for v in raw]


def auto_scale(lo: float, hi: float) -> Scale:
    """Log when the range spans a decade or more (SDC magnitudes, 1e-7..1e-1: linear would
    put all but one point in the last decade), linear otherwise (a slowdown of 1.1..3 reads
    best in even steps)."""
    return "log" if lo > 0 and hi / lo >= 10 else "linear"


def parse_values(text: str) -> list[Any]:
    """``--values 1.2,3,true`` → ``[1.2, 3, True]``: each a number if it reads as one, else a
    YAML scalar (``true``, ``null``, a word)."""
    import yaml

    out: list[Any] = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            raise ValueError(f"{text!r} has an empty value; list them with commas, e.g. "
                             f"--values 1.2,2,3")
        for read in (int, float):
            try:
                out.append(read(item))
                break
            except ValueError:
                continue
        else:
            out.append(yaml.safe_load(item))
    return out


def sweep_points(file: Path, path: Sequence[PathPart], values: Sequence[Any], *,
                 seed: int | None = None) -> list[SweepPoint]:
    """``file``'s experiment with ``path`` set to each of ``values``, every one validated.
    Raises InvalidExperimentError with every problem, each naming its point; nothing runs."""
    _check_seed(seed, file)  # once, not once per point
    doc = _document(file)
    key = _resolve(doc, file, path)
    problems: dict[Problem, list[int]] = {}
    points: list[SweepPoint] = []
    for index, value in enumerate(values, 1):
        data = _with_value(doc.data, key, value)
        try:
            points.append(SweepPoint(index, value,
                                     experiment_from_dict(data, file, seed=seed,
                                                          lines=doc.lines)))
        except InvalidExperimentError as e:
            for p in e.problems:
                problems.setdefault(p, []).append(index)
    if problems:
        raise InvalidExperimentError([_at_points(p, at, values, key)
                                      for p, at in problems.items()])
    return points


def integral_at(file: Path, path: Sequence[PathPart]) -> bool:
    """Whether the document holds an integer (not a bool) at ``path`` now: a range over it
    is then of integers."""
    doc = _document(file)
    cur: Any = doc.data
    for part in _resolve(doc, file, path):
        cur = cur.get(part) if isinstance(cur, dict) else cur[part]
    return isinstance(cur, int) and not isinstance(cur, bool)


# ---------------------------------------------------------------------------- internals


def _document(file: Path) -> YamlDoc:
    try:
        text = file.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidExperimentError([Problem(file, None, "", f"cannot read the file: "
                                              f"{getattr(e, 'strerror', None) or e}")]) from None
    doc = read_yaml(text, file)
    if doc.problems:
        raise InvalidExperimentError(doc.problems)
    if not isinstance(doc.data, dict) or {"suite", "campaign"} & set(doc.data):
        what = "a suite" if isinstance(doc.data, dict) and "suite" in doc.data else \
            "a campaign" if isinstance(doc.data, dict) else "not an experiment"
        raise InvalidExperimentError([Problem(file, doc.line_of(()), "", f"faultlab sweep "
                                              f"runs one experiment; this document is {what}: "
                                              f"sweep one of its experiments instead")])
    return doc


def _resolve(doc: YamlDoc, file: Path, path: Sequence[PathPart]) -> Key:
    """The data key ``path`` names (names of list items turned into indices)."""
    key: list[Any] = []
    cur: Any = doc.data
    for depth, part in enumerate(path):
        last = depth == len(path) - 1
        here = tuple(key)
        if isinstance(cur, dict):
            if isinstance(part, str) and not part.startswith("[") and (part in cur or last):
                key.append(part)
                cur = cur.get(part)
                continue
            raise _bad(doc, file, here, path, f"has no key {show(part)}; its keys: "
                       f"{', '.join(map(str, cur)) or 'none'}")
        if isinstance(cur, list):
            index = _item(cur, part, here)
            if index is None:
                item = show(part) if isinstance(part, int) else f"named {show(part[1:-1])}"
                raise _bad(doc, file, here, path, f"has no item {item}; its items (index "
                           f"[name]): {_items(cur, here)}")
            key.append(index)
            cur = cur[index]
            continue
        raise _bad(doc, file, here, path, f"is a value ({show(cur)}), not a mapping or list: "
                   f"the path ends there")
    if isinstance(cur, dict | list):
        what = "mapping" if isinstance(cur, dict) else "list"
        raise _bad(doc, file, tuple(key), path, f"is a {what}, not one value: "
                   f"sweep one of its keys or items ({_items(cur, tuple(key))})")
    return tuple(key)


def _names(items: list[Any], key: Key) -> list[str | None]:
    """Each list item's name: its ``id`` (a fault's default one too) or ``name``."""
    out: list[str | None] = []
    for i, item in enumerate(items):
        name = item.get("id") or item.get("name") if isinstance(item, dict) else None
        if name is None and key == ("faults",) and isinstance(item, dict) and "type" in item:
            name = f"{item['type']}-{i}"
        out.append(None if name is None else str(name))
    return out


def _item(items: list[Any], part: PathPart, key: Key) -> int | None:
    if isinstance(part, int):
        return part if 0 <= part < len(items) else None
    if not part.startswith("["):
        return None
    names = _names(items, key)
    return names.index(part[1:-1]) if part[1:-1] in names else None


def _items(cur: dict[Any, Any] | list[Any], key: Key) -> str:
    if isinstance(cur, dict):
        return ", ".join(map(str, cur)) or "none"
    names = _names(cur, key)
    return ", ".join(f"{i}" + (f" [{n}]" if n else "") for i, n in enumerate(names)) or "none"


def _bad(doc: YamlDoc, file: Path, key: Key, path: Sequence[PathPart], why: str
         ) -> InvalidExperimentError:
    shown = ".".join(str(p) for p in path).replace(".[", "[")
    where = render_path(key) or "the document"
    return InvalidExperimentError([Problem(file, doc.line_of(key), render_path(key),
                                           f"--param {shown}: {where} {why}")])


def _with_value(data: Any, key: Key, value: Any) -> Any:
    """A copy of ``data`` with ``value`` at ``key`` (the copy shares nothing it changes)."""
    if not key:
        return value
    head, rest = key[0], key[1:]
    if isinstance(data, dict):
        return {**data, head: _with_value(data.get(head), rest, value)}
    copy = list(data)
    copy[head] = _with_value(data[head], rest, value)
    return copy


def _at_points(p: Problem, at: list[int], values: Sequence[Any], key: Key) -> Problem:
    which = ("every point" if len(at) == len(values) else
             ", ".join(f"point {i} ({render_path(key)}={values[i - 1]!r})" for i in at))
    return Problem(p.file, p.line, p.path, f"at {which} of the sweep: {p.message}")
