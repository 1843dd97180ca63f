"""The type checker's half of ``make lint``: mypy against a ratchet, and the ``type: ignore`` rules.

``python scripts/lint_types.py`` runs mypy over what ``[tool.mypy] files`` in pyproject.toml
names and compares what it finds with ``scripts/mypy_ratchet.json``, the committed ceiling:

- ``errors``: mypy errors allowed per file. A file with more fails the lint and every error of
  that file is printed as ``path:line: message [code]`` (mypy cannot say which one is new).
- ``type_ignores``: ``# type: ignore`` comments allowed outside ``tests/``. More fails.

A ceiling above what was found fails too, saying what to lower: run
``python scripts/lint_types.py --lower`` and commit the file it rewrites, so that the ceiling
follows every fix down and never lets a fixed error come back. ``--lower`` never raises a
ceiling: a new error is fixed, not recorded.

Every ``type: ignore`` anywhere in the repository (tests included) must name its error code
(``# type: ignore[attr-defined]``): a bare one hides every error of its line, present and
future. ``tests/unit/test_lint_types.py`` runs that check and the comparison's logic.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
import tokenize
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RATCHET = REPO / "scripts" / "mypy_ratchet.json"
SKIP_DIRS = {".git", ".venv", "reports", "site", "build", "runs", "node_modules", "__pycache__"}
ERROR = re.compile(r"^(?P<path>[^:\s][^:]*):(?P<line>\d+): error: (?P<message>.*)$")
IGNORE = re.compile(r"#\s*type:\s*ignore(?P<codes>\[[^\]]*\])?")


def python_files(root: Path = REPO) -> Iterator[Path]:
    """Every ``.py`` file of the repository, without virtual environments, caches and output."""
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if not any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel[:-1]):
            yield path


def type_ignores(path: Path) -> Iterator[tuple[int, bool]]:
    """(line, names its code) of each ``type: ignore`` comment of ``path``: comments only, read
    with ``tokenize``, so the words inside a string do not count."""
    source = path.read_text(encoding="utf-8")
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            for match in IGNORE.finditer(tok.string):
                codes = (match.group("codes") or "").strip("[] ")
                yield tok.start[0], bool(codes)


def ignores_without_code(root: Path = REPO) -> list[str]:
    """``path:line`` of every ``type: ignore`` that names no error code."""
    return [f"{path.relative_to(root)}:{line}" for path in python_files(root)
            for line, coded in type_ignores(path) if not coded]


def count_type_ignores(root: Path = REPO) -> int:
    """``type: ignore`` comments outside ``tests/``."""
    return sum(1 for path in python_files(root) if path.relative_to(root).parts[0] != "tests"
               for _ in type_ignores(path))


def run_mypy() -> list[tuple[str, int, str]]:
    """(path, line, message) of each error mypy reports on the configured files."""
    proc = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary",
                           "--hide-error-context", "--no-pretty"],
                          cwd=REPO, capture_output=True, text=True, check=False)
    if proc.returncode not in (0, 1):  # 2: mypy itself failed (bad config, crash)
        sys.exit(f"mypy failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    errors = []
    for text in proc.stdout.splitlines():
        if match := ERROR.match(text):
            errors.append((match["path"], int(match["line"]), match["message"]))
    return errors


def compare(ceiling: dict[str, int], errors: list[tuple[str, int, str]]
            ) -> tuple[list[str], list[str]]:
    """(what fails: each error of a file over its ceiling; what to lower: files under theirs)."""
    found = Counter(path for path, _, _ in errors)
    over, under = [], []
    for path in sorted(found):
        allowed = ceiling.get(path, 0)
        if found[path] > allowed:
            over.append(f"{path}: {found[path]} mypy errors, {allowed} allowed:")
            over += [f"  {p}:{line}: {message}" for p, line, message in errors if p == path]
    for path in sorted(ceiling):
        if found[path] < ceiling[path]:
            under.append(f"{path}: {found[path]} mypy errors, the ratchet allows {ceiling[path]}")
    return over, under


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lower", action="store_true",
                        help=f"lower {RATCHET.relative_to(REPO)} to what was found (never raise)")
    args = parser.parse_args(argv)
    ratchet = json.loads(RATCHET.read_text())
    errors, ignores = run_mypy(), count_type_ignores()
    over, under = compare(ratchet["errors"], errors)
    bare = ignores_without_code()
    failed = bool(over or bare) or ignores > ratchet["type_ignores"]
    for line in over:
        print(line)
    for where in bare:
        print(f"{where}: `type: ignore` without an error code: name it, "
              "e.g. `# type: ignore[attr-defined]` (mypy prints the code in brackets)")
    if ignores > ratchet["type_ignores"]:
        print(f"{ignores} `type: ignore` outside tests/, the ratchet allows "
              f"{ratchet['type_ignores']}: fix the type instead (a cast through the protocol, "
              "a narrower annotation)")
    if args.lower and not failed:
        found = Counter(path for path, _, _ in errors)
        ratchet = {"errors": {p: n for p, n in sorted(found.items())},
                   "type_ignores": min(ignores, ratchet["type_ignores"])}
        RATCHET.write_text(json.dumps(ratchet, indent=2) + "\n")
        print(f"lowered {RATCHET.relative_to(REPO)}: {len(errors)} mypy errors, "
              f"{ignores} type: ignore outside tests/")
        return 0
    stale = under + ([f"{ignores} `type: ignore` outside tests/, the ratchet allows "
                      f"{ratchet['type_ignores']}"] if ignores < ratchet["type_ignores"] else [])
    if stale and not failed:
        print("\n".join(stale))
        print(f"fewer than the ratchet allows: lower it with `{Path(sys.executable).name} "
              f"scripts/lint_types.py --lower` and commit {RATCHET.relative_to(REPO)}")
        return 1
    if not failed:
        print(f"mypy: {len(errors)} errors, {ignores} `type: ignore` outside tests/ "
              f"(the ratchet: {sum(ratchet['errors'].values())}, {ratchet['type_ignores']})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
