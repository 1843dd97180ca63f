"""Every repository path the docs or the code's comments name exists (issue 55 item 6).

Where it looks:

- Markdown (every ``*.md`` of the checkout: ``README.md``, ``docs/``, the examples' and the
  reference trainer's READMEs), all of its text;
- Python files, their comments and docstrings only (a string the code uses may name a file of
  a test's own tree, as ``test_import_rules.py`` does);
- YAML, shell, ``sbatch``, TOML, the Makefile and ``.ci/run``, their ``#`` comments only.

What counts as a path:

- a token that starts with a top-level folder of the repository (``TOPS``: ``faultlab/``,
  ``tests/``, ``docs/``, ...) right after a space, a backtick, a quote or a bracket: not after
  a letter, ``/``, ``.``, ``$``, ``~``, ``{`` or ``-`` (a URL, an absolute path, ``$LAB/...``,
  a path in another folder are not ours); a ``:NN`` or ``:NN-MM`` after it is a line, and the
  file must be that long;
- the target of a relative Markdown link (``[text](../guides/x.md#part)``, an image too),
  resolved from the file's folder.

A token is found when it exists from the repository's root or from the file's own folder (an
example's README names its own ``experiments/<name>.yaml`` so). Inside ``docs/`` the pages
``docs/gen_reference.py`` generates at build time count as present (the site has them; a README
outside the site, read on its own, does not). Skipped, as not a path of this repository: a
token with a glob (``*``), a placeholder (``<name>``, ``{run_dir}``) or an ellipsis (``...``),
and the few in ``ELSEWHERE``, each a path of another repository, named as such where it
appears.
"""

from __future__ import annotations

import io
import os
import re
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

TOPS = ("faultlab", "tests", "docs", "examples", "experiments", "benchmarks", "scripts",
        "reference_trainer", "plugins", ".ci")
"""The repository's top-level folders: a path that starts with one of them is checked."""

SKIP_DIRS = {".git", ".venv", "site", "reports", "__pycache__", "node_modules", ".pytest_cache",
             ".mypy_cache", ".ruff_cache"}
"""Folders of a checkout that are not the repository's text (build outputs, caches)."""

ELSEWHERE = {
    "docs/source/fault_tolerance/integration/heartbeats.rst":
        "NVRx's heartbeats integration guide, in NVIDIA/nvidia-resiliency-ext's repository "
        "(examples/nvrx_ft names the repository beside it)",
}
"""Paths of other repositories that the text names as such: not ours to find."""

_TOKEN = re.compile(r"(?<![\w/.$~{-])((?:" + "|".join(map(re.escape, TOPS))
                    + r")/[\w./+-]*)(?::(\d+)(?:-(\d+))?)?")
_LINK = re.compile(r"\]\(([^()\s]+?)(?:#[^()\s]*)?\)")
_COMMENT = re.compile(r"(?:^|\s)#(.*)$", re.M)
_COMMENTED = {".yaml", ".yml", ".sh", ".sbatch", ".toml", ".j2"}
_COMMENTED_NAMES = {"Makefile", "run"}
_STATEMENT_START = (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)


def _docs_and_comments(path: Path, text: str) -> list[tuple[int, str]]:
    """``(first line, text)`` of each part of ``path`` where a path is a pointer: all of a
    Markdown file, the docstrings and comments of Python, the comments of the others."""
    if path.suffix == ".md":
        return [(1, text)]
    if not _TOKEN.search(text):  # nothing to find, and tokenize is the test's main cost
        return []
    if path.suffix in _COMMENTED or path.name in _COMMENTED_NAMES:
        return [(text.count("\n", 0, m.start()) + 1, m.group(1))
                for m in _COMMENT.finditer(text)]
    parts: list[tuple[int, str]] = []
    before, depth = tokenize.NEWLINE, 0
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            parts.append((tok.start[0], tok.string))
        elif tok.type == tokenize.STRING and depth == 0 and before in _STATEMENT_START:
            parts.append((tok.start[0], tok.string))  # a statement of its own: a docstring
        elif tok.type == tokenize.OP:
            depth += (tok.string in "([{") - (tok.string in ")]}")
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            before = tok.type
    return parts


def _files(root: Path) -> list[Path]:
    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        found += [Path(folder, n) for n in sorted(names)
                  if Path(n).suffix in (".md", ".py", *_COMMENTED) or n in _COMMENTED_NAMES]
    return found


def _generated(root: Path) -> set[Path]:
    """The files ``docs/gen_reference.py`` writes into the site (relative to ``docs/``)."""
    gen = root / "docs" / "gen_reference.py"
    text = gen.read_text() if gen.exists() else ""
    return {root / "docs" / p for p in re.findall(r"\"([\w/.-]+\.(?:md|json))\"", text)}


def _missing(root: Path, path: Path, target: str, generated: set[Path]) -> bool:
    for base in (root, path.parent):
        where = (base / target).resolve()
        if where.exists() or (where in generated and root / "docs" in path.parents):
            return False
    return True


def _too_short(root: Path, path: Path, target: str, line: int) -> bool:
    for base in (root, path.parent):
        if (base / target).is_file():
            return (base / target).read_text(errors="replace").count("\n") + 1 < line
    return False


def dangling(root: Path) -> list[str]:
    """Every path named in the docs or the code's comments under ``root`` (a checkout) that is
    not there, as ``file:line: path``."""
    generated = _generated(root)
    found: list[str] = []
    for path in _files(root):
        text = path.read_text(errors="replace")
        rel = path.relative_to(root)
        for first, part in _docs_and_comments(path, text):
            for m in _TOKEN.finditer(part):
                target = m.group(1).rstrip(".,;:-")
                after = part[m.end(1):m.end(1) + 1]
                if after in "*<{" and after or "..." in target or target in ELSEWHERE:
                    continue
                line = first + part.count("\n", 0, m.start())
                if _missing(root, path, target, generated):
                    found.append(f"{rel}:{line}: {target}")
                elif m.group(2) and _too_short(root, path, target, int(m.group(3) or m.group(2))):
                    found.append(f"{rel}:{line}: {m.group(0)} (the file is shorter)")
            if path.suffix != ".md":
                continue
            for m in _LINK.finditer(part):
                target = m.group(1)
                if "://" in target or target.startswith(("mailto:", "/", "#")):
                    continue
                if _missing(root, path, target, generated):
                    found.append(f"{rel}:{first + part.count(chr(10), 0, m.start())}: {target}")
    return list(dict.fromkeys(found))  # a linked path is a token too: once


def test_every_path_the_docs_name_exists() -> None:
    assert dangling(REPO) == []


def _checkout(tmp_path: Path, files: dict[str, str]) -> Path:
    base = {"faultlab/real.py": '"""Three\nlines."""\n',
            "docs/gen_reference.py": 'PAGES = {"reference/faults.md": None}\n'}
    for name, text in {**base, **files}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_a_dangling_path_is_reported_where_it_is_named(tmp_path: Path) -> None:
    root = _checkout(tmp_path, {
        "README.md": "See `faultlab/gone.py` and [the faults](docs/reference/faults.md).\n",
        "docs/guide.md": "# Guide\n\n[real](../faultlab/real.py), [lost](other.md#part), "
                         "[faults](reference/faults.md), `faultlab/real.py:3` and "
                         "faultlab/real.py:9 (too far).\n",
        "faultlab/mod.py": '"""Reads ``tests/unit/test_gone.py``."""\n\n'
                           'FIXTURE = "tests/unit/test_gone.py"  # see benchmarks/gone.py\n',
        "experiments/x.yaml": "# Run: faultlab run experiments/y.yaml\nname: x\n",
    })
    assert dangling(root) == [
        "README.md:1: faultlab/gone.py",
        "README.md:1: docs/reference/faults.md",  # generated into the site, not the repository
        "docs/guide.md:3: faultlab/real.py:9 (the file is shorter)",
        "docs/guide.md:3: other.md",
        "experiments/x.yaml:1: experiments/y.yaml",
        "faultlab/mod.py:1: tests/unit/test_gone.py",
        "faultlab/mod.py:3: benchmarks/gone.py",  # the string the code uses is not a pointer
    ]


def test_globs_placeholders_urls_and_others_paths_are_not_ours(tmp_path: Path) -> None:
    root = _checkout(tmp_path, {
        "docs/a.md": "`tests/*.py`, `experiments/<name>.yaml`, `{run_dir}/ckpt`, "
                     "`$LAB/shared/x`, https://example.org/docs/x.md, /srv/faultlab/x, "
                     "`docs/source/fault_tolerance/integration/heartbeats.rst` in NVRx's "
                     "repository, `faultlab/...`, [top](#a-heading) and `faultlab/real.py`.\n",
        "examples/p/README.md": "Run `experiments/own.yaml`.\n",
        "examples/p/experiments/own.yaml": "name: own\n",
    })
    assert dangling(root) == []
