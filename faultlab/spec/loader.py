"""Load experiment and suite documents; every mistake in them becomes one located problem.

Whatever the input — a missing file, bytes that are not UTF-8, broken YAML, a list instead
of a mapping, a wrong type ten levels down — the only exception that leaves this module for a
user's mistake is ``InvalidExperimentError``, and it lists every problem found, each with its
file, line and YAML path, sorted by line.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from faultlab.errors import InvalidExperimentError, Problem
from faultlab.spec._base import choices, show
from faultlab.spec._problems import problems_from
from faultlab.spec._suite import PlannedSuite
from faultlab.spec._yaml import YamlDoc, read_yaml
from faultlab.spec.campaign import Campaign, compile_campaign
from faultlab.spec.model import Experiment, Suite

__all__ = [
    "experiment_from_dict",
    "load_campaign",
    "load_document",
    "load_experiment",
    "load_experiments",
    "parse_document",
    "parse_experiment",
]

PathLike = str | os.PathLike[str]
_Seeded = TypeVar("_Seeded", Experiment, Campaign)


@dataclass(frozen=True, slots=True)
class _Parsed:
    doc: Experiment | Suite | PlannedSuite | Campaign
    yaml: YamlDoc

    def members(self) -> list[tuple[str, tuple[str | int, ...], str]]:
        """A suite's member files: ``(file as written, YAML key, YAML path)``."""
        if isinstance(self.doc, PlannedSuite):
            return [(m, ("suite", "experiments", i), f"suite.experiments[{i}]")
                    for i, m in enumerate(self.doc.suite.experiments)]
        if isinstance(self.doc, Suite):
            return [(m, ("suite", i), f"suite[{i}]") for i, m in enumerate(self.doc.suite)]
        return []


def parse_document(text: str, file: PathLike | None = None
                   ) -> Experiment | Suite | PlannedSuite | Campaign:
    """Validate YAML ``text`` (from ``file``, used only in messages) as an experiment or,
    if it has a ``suite`` key, a suite (a list of files, or a mapping: a planned suite), or if
    it has a ``campaign`` key, a campaign."""
    return _parse(text, _path(file)).doc


def parse_experiment(text: str, file: PathLike | None = None, *,
                     seed: int | None = None) -> Experiment:
    """Validate YAML ``text`` as one experiment; ``seed`` replaces the document's seed."""
    parsed = _parse(text, _path(file))
    return _experiment(parsed, _path(file), seed)


def experiment_from_dict(data: Mapping[str, Any], file: PathLike | None = None, *,
                         seed: int | None = None,
                         lines: Mapping[tuple[Any, ...], int] | None = None) -> Experiment:
    """Validate already-parsed data (e.g. from a pytest marker) with the same messages;
    ``lines`` (``YamlDoc.lines`` of the text it came from) puts the lines in them."""
    file_ = _path(file)
    parsed = _validate(YamlDoc(_plain(data), dict(lines or {})), file_)
    return _experiment(parsed, file_, seed)


def load_document(path: PathLike) -> Experiment | Suite | PlannedSuite | Campaign:
    """Read and validate one file: an experiment, a campaign, or a suite (its members are not
    loaded)."""
    return _load(Path(path)).doc


def load_campaign(path: PathLike, *, seed: int | None = None
                  ) -> tuple[Campaign, int | None] | None:
    """The campaign in ``path`` (``seed`` replacing its own) and the line of its
    ``campaign.mtbf_s`` or ``mtbf_steps`` (for the error a too high rate gets once the golden
    run measured the step time); None if the file is not a campaign."""
    parsed = _load(Path(path))
    if not isinstance(parsed.doc, Campaign):
        return None
    _check_seed(seed, Path(path))
    key = "mtbf_s" if parsed.doc.campaign.mtbf_s is not None else "mtbf_steps"
    return _with_seed(parsed.doc, seed), parsed.yaml.line_of(("campaign", key))


def load_experiment(path: PathLike, *, seed: int | None = None) -> Experiment:
    """Read and validate one experiment file; a suite file is an error here."""
    return _experiment(_load(Path(path)), Path(path), seed)


def load_experiments(paths: Iterable[PathLike], *,
                     seed: int | None = None) -> list[tuple[Path, Experiment]]:
    """Every experiment of ``paths``, suites expanded in order, all validated before any is
    returned. Raises one ``InvalidExperimentError`` with the problems of every file."""
    _check_seed(seed, None)
    out: list[tuple[Path, Experiment]] = []
    problems: list[Problem] = []
    for path in paths:
        _expand(Path(path), (), None, seed, out, problems)
    if problems:
        raise InvalidExperimentError(problems)
    return out


# ---------------------------------------------------------------------------- internals


@dataclass(frozen=True, slots=True)
class _Ref:
    """Where a suite names a member file: problems reading it are located there."""

    file: Path
    line: int | None
    path: str
    text: str


def _expand(path: Path, chain: tuple[tuple[Path, Path], ...], ref: _Ref | None,
            seed: int | None, out: list[tuple[Path, Experiment]],
            problems: list[Problem]) -> None:
    """Append the experiments of ``path``; ``chain`` holds the suites that led here
    (resolved, as written)."""
    resolved = _resolved(path)
    seen = [r for r, _ in chain]
    if resolved in seen:
        names = [str(shown) for _, shown in chain[seen.index(resolved):]] + [str(path)]
        assert ref is not None  # the first file of a chain has no predecessor
        problems.append(Problem(ref.file, ref.line, ref.path,
                                f"suite cycle: {' -> '.join(names)}; a suite cannot include "
                                f"itself, directly or through another suite"))
        return
    try:
        parsed = _load(path, ref)
    except InvalidExperimentError as e:
        problems.extend(_member_problems(e.problems, ref))
        return
    if isinstance(parsed.doc, Experiment):
        out.append((path, _with_seed(parsed.doc, seed)))
        return
    if isinstance(parsed.doc, Campaign):  # its experiment: the schedule of its seed
        out.append((path, compile_campaign(_with_seed(parsed.doc, seed))))
        return
    for member, key, yaml_path in parsed.members():
        member_ref = _Ref(path, parsed.yaml.line_of(key), yaml_path, member)
        _expand(path.parent / member, (*chain, (resolved, path)), member_ref, seed, out,
                problems)


def _member_problems(problems: list[Problem], ref: _Ref | None) -> list[Problem]:
    """A member's own problems (in its file), led by one at the suite entry that lists it, so
    a suite of many files says which entry to fix or drop."""
    if ref is None or all((p.file, p.line, p.path) == (ref.file, ref.line, ref.path)
                          for p in problems):  # unreadable: already located at the entry
        return problems
    return [Problem(ref.file, ref.line, ref.path,
                    f"{ref.text!r} is invalid: {len(problems)} problem(s) in that file, "
                    f"listed next; fix them, or remove this entry to leave it out of the "
                    f"suite"), *problems]


def _load(path: Path, ref: _Ref | None = None) -> _Parsed:
    try:
        raw = path.read_bytes()
    except OSError as e:
        reason = e.strerror or str(e)
        if ref is not None:
            raise InvalidExperimentError([Problem(
                ref.file, ref.line, ref.path,
                f"cannot read {ref.text!r} (looked for {str(path)!r}): {reason}; paths in a "
                f"suite are relative to the suite file")]) from None
        raise InvalidExperimentError([Problem(path, None, "",
                                              f"cannot read the file: {reason}")]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise InvalidExperimentError([Problem(path, line, "", f"not UTF-8 text: byte "
                                              f"{raw[e.start:e.start + 1]!r} at offset "
                                              f"{e.start} ({e.reason})")]) from None
    return _parse(text, path)


def _parse(text: str, file: Path | None) -> _Parsed:
    doc = read_yaml(text, file)
    if doc.problems and doc.data is None:
        raise InvalidExperimentError(_sorted(doc.problems))
    if not doc.lines:  # no YAML node at all: nothing but blanks and comments
        raise InvalidExperimentError([Problem(file, 1, "", "the document is empty; an "
                                              "experiment needs at least a name")])
    return _validate(doc, file)


def _validate(doc: YamlDoc, file: Path | None) -> _Parsed:
    data = doc.data
    if not isinstance(data, dict):
        raise InvalidExperimentError(_sorted([*doc.problems, Problem(
            file, doc.line_of(()), "", f"expected a mapping with keys "
                                       f"{choices(Experiment.valid_keys())} (or a suite: "
                                       f"{choices(Suite.valid_keys())}), got {show(data)}")]))
    root: type[BaseModel] = Experiment
    if "suite" in data:
        root = PlannedSuite if isinstance(data["suite"], dict) else Suite
    elif "campaign" in data:
        root = Campaign
    try:
        model = root.model_validate(data)
    except ValidationError as e:
        raise InvalidExperimentError(_sorted([*doc.problems,
                                              *problems_from(e, doc, root, file)])) from None
    if doc.problems:  # duplicate keys: the document is valid only by accident
        raise InvalidExperimentError(_sorted(doc.problems))
    return _Parsed(model, doc)  # type: ignore[arg-type]


def _experiment(parsed: _Parsed, file: Path | None, seed: int | None) -> Experiment:
    if isinstance(parsed.doc, Campaign):
        _check_seed(seed, file)
        return compile_campaign(_with_seed(parsed.doc, seed))
    if isinstance(parsed.doc, Suite | PlannedSuite):
        raise InvalidExperimentError([Problem(
            file, parsed.yaml.line_of(("suite",)), "suite",
            "this document is a suite (a list of experiment files), not one experiment; "
            "load it with load_experiments()")])
    _check_seed(seed, file)
    return _with_seed(parsed.doc, seed)


def _check_seed(seed: object, file: Path | None) -> None:
    if seed is None:
        return
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
        raise InvalidExperimentError([Problem(file, None, "seed", f"the seed override "
                                              f"(--seed) must be an integer in "
                                              f"[0, 2**63), got {show(seed)}")])


def _with_seed(exp: _Seeded, seed: int | None) -> _Seeded:
    """``exp`` with every seed it has replaced (a campaign's schedule's own too, so that
    ``--seed`` always draws another schedule)."""
    if seed is None:
        return exp
    if isinstance(exp, Campaign) and exp.campaign.seed is not None:
        return exp.model_copy(update={"seed": seed, "campaign": exp.campaign.model_copy(
            update={"seed": seed})})
    return exp.model_copy(update={"seed": seed})


def _sorted(problems: list[Problem]) -> list[Problem]:
    unique = list(dict.fromkeys(problems))  # a union's members may report the same thing
    return sorted(unique, key=lambda p: (p.line is None, p.line or 0))


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # a symlink loop: compare as written
        return path.absolute()


def _path(file: PathLike | None) -> Path | None:
    return None if file is None else Path(file)


def _plain(data: Any) -> Any:
    """A ``Mapping`` that is not a dict (e.g. a MappingProxy) validated as a dict."""
    if isinstance(data, Mapping) and not isinstance(data, dict):
        return dict(data)
    return data
