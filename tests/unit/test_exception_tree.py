"""Every exception faultlab raises is in ``faultlab.errors``' tree (issue 55).

- A module of faultlab defines no exception class: each is defined in ``faultlab/errors.py``
  and imported from there where it is raised (its old name there keeps working). ``errors``
  imports nothing of faultlab (``test_import_rules.py``), so "re-exported there" can only mean
  "defined there".
- A plugin of faultlab (``plugins/``: pytest, Chaos Toolkit) may define one, since faultlab never
  imports its plugins; it derives from a class of ``errors.py`` and ``errors.py``'s docstring
  names it in the tree.
- ``reference_trainer`` is not faultlab but one trainer among any: its errors (``ConfigError``,
  ``PreflightError``) are a trainer's own, and faultlab turns a trainer's ``ValueError`` into
  its own ``TargetError`` (``faultlab/targets/local.py``).

The check reads the source: a class is an exception when one of its bases is a built-in
exception or, by name, another exception class of the scanned files.
"""

from __future__ import annotations

import builtins
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ERRORS = Path("faultlab/errors.py")


_CLASS = re.compile(r"^[ \t]*class[ \t]+(\w+)[ \t]*\(([^)]*)\)[ \t]*:", re.M)
"""A class statement with bases (over several lines too): read with a regular expression, not
``ast``, which costs 20 times more for the same answer here."""


@dataclass(frozen=True)
class Found:
    path: Path
    line: int
    name: str
    bases: frozenset[str]
    """The last part of each base's name (``errors.TargetError`` → ``TargetError``)."""


def _classes(root: Path) -> list[Found]:
    found = []
    for top in ("faultlab", "plugins"):
        for path in sorted((root / top).rglob("*.py")):
            text = path.read_text()
            for m in _CLASS.finditer(text):
                bases = frozenset(b.split("[")[0].strip().rpartition(".")[2]
                                  for b in m.group(2).split(",") if "=" not in b)
                found.append(Found(path.relative_to(root), text.count("\n", 0, m.start()) + 1,
                                   m.group(1), bases - {""}))
    return found


def exception_classes(root: Path) -> list[Found]:
    """Every exception class defined in faultlab and its plugins under ``root`` (a checkout)."""
    classes = _classes(root)
    names = {n for n, v in vars(builtins).items()
             if isinstance(v, type) and issubclass(v, BaseException)}
    grew = True
    while grew:
        before = len(names)
        names |= {c.name for c in classes if c.bases & names}
        grew = len(names) > before
    return [c for c in classes if c.bases & names]


def outside_the_tree(root: Path) -> list[str]:
    """Every exception class outside ``errors.py``'s tree, as ``file:line: why``."""
    found = exception_classes(root)
    in_errors = {c.name for c in found if c.path == ERRORS}
    doc = (root / ERRORS).read_text().partition('"""\n\n')[0]  # its docstring, and a little
    problems = []
    for c in found:
        where = f"{c.path}:{c.line}: class {c.name}"
        if c.path == ERRORS:
            continue
        if c.path.parts[0] == "faultlab":
            problems.append(f"{where}: define it in {ERRORS} (in the tree of its docstring) and "
                            f"import it here from faultlab.errors")
        elif not (c.bases & in_errors) or f" {c.name} " not in doc:
            problems.append(f"{where}: a plugin's exception derives from a class of {ERRORS} "
                            f"and is named in the tree of its docstring")
    return problems


def test_every_exception_is_in_the_tree_of_errors_py() -> None:
    assert outside_the_tree(REPO) == []
    names = {c.name for c in exception_classes(REPO)}
    assert {"FaultlabError", "TargetError", "PlanError", "ExperimentFailed"} <= names


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    errors = '"""The tree:\n\n    FaultlabError\n    └── PluginFailed    a plugin\'s\n"""\n' \
             "class FaultlabError(Exception): ...\n"
    for name, text in {"faultlab/errors.py": errors, "plugins/p/__init__.py": "",
                       **files}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


@pytest.mark.parametrize("name,source,expected", [
    ("faultlab/engine/x.py", "import os\nclass Boom(ValueError):\n    pass\n",
     "faultlab/engine/x.py:2: class Boom: define it in faultlab/errors.py"),
    ("faultlab/targets/y.py", "from faultlab import errors\n\n"
     "class Gone(errors.FaultlabError): ...\n",
     "faultlab/targets/y.py:3: class Gone: define it in faultlab/errors.py"),
    ("plugins/p/a.py", "class PluginFailed(Exception): ...\n",
     "plugins/p/a.py:1: class PluginFailed: a plugin's exception derives from a class of"),
    ("plugins/p/b.py", "from faultlab.errors import FaultlabError\n"
     "class Unnamed(FaultlabError): ...\n",
     "plugins/p/b.py:2: class Unnamed: a plugin's exception derives from a class of"),
])
def test_an_exception_outside_the_tree_is_reported_where_it_is(
        tmp_path: Path, name: str, source: str, expected: str) -> None:
    found = outside_the_tree(_tree(tmp_path, {name: source}))
    assert len(found) == 1 and found[0].startswith(expected), found


def test_a_subclass_of_a_subclass_counts_and_the_tree_passes(tmp_path: Path) -> None:
    """An exception two steps from a built-in is found; one in errors.py, a plugin's named in
    the docstring and a plain class pass."""
    root = _tree(tmp_path, {
        "faultlab/a.py": "class Base(KeyError): ...\n",
        "faultlab/b.py": "from faultlab.a import Base\nclass Deep(Base): ...\n"
                         "class Plain: ...\n",
        "plugins/p/c.py": "from faultlab.errors import FaultlabError\n"
                          "class PluginFailed(FaultlabError): ...\n",
    })
    assert [p.split(": ")[0] for p in outside_the_tree(root)] == [
        "faultlab/a.py:1", "faultlab/b.py:2"]
