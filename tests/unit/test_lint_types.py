"""``make lint``'s type half (``scripts/lint_types.py``): every ``type: ignore`` of the
repository names its error code, and the ratchet fails a new mypy error with its file:line and
asks for a lower ceiling when errors were fixed. mypy itself runs in ``make lint``, not here."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("lint_types", REPO / "scripts" / "lint_types.py")
assert _spec is not None and _spec.loader is not None
lint_types = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lint_types)


def test_every_type_ignore_names_its_code() -> None:
    bare = lint_types.ignores_without_code()
    assert bare == [], f"`type: ignore` without an error code at {bare}"


def test_type_ignores_are_read_from_comments_only(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text('x = "# type: ignore"\n'
                   "y: int = 'a'  # type: ignore\n"
                   "z: int = 'a'  # type: ignore[assignment]\n"
                   "w: int = 'a'  # noqa: E501  # type:ignore[ assignment ]\n")
    assert list(lint_types.type_ignores(src)) == [(2, False), (3, True), (4, True)]
    assert lint_types.ignores_without_code(tmp_path) == ["m.py:2"]


def test_the_count_leaves_out_tests_and_virtual_environments(tmp_path: Path) -> None:
    for rel in ("pkg/a.py", "tests/unit/b.py", ".venv/lib/c.py", "x.egg-info/d.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("v = f()  # type: ignore[name-defined]\n")
    assert lint_types.count_type_ignores(tmp_path) == 1


def test_a_new_error_fails_with_its_file_and_line() -> None:
    errors = [("faultlab/a.py", 3, "old  [arg-type]"), ("faultlab/a.py", 9, "new  [index]"),
              ("faultlab/b.py", 1, "fine  [misc]")]
    over, under = lint_types.compare({"faultlab/a.py": 1, "faultlab/b.py": 1}, errors)
    assert over == ["faultlab/a.py: 2 mypy errors, 1 allowed:",
                    "  faultlab/a.py:3: old  [arg-type]", "  faultlab/a.py:9: new  [index]"]
    assert under == []


def test_an_error_in_a_file_the_ratchet_does_not_name_fails() -> None:
    over, _ = lint_types.compare({}, [("faultlab/c.py", 5, "x  [misc]")])
    assert over == ["faultlab/c.py: 1 mypy errors, 0 allowed:", "  faultlab/c.py:5: x  [misc]"]


def test_fewer_errors_ask_to_lower_the_ratchet() -> None:
    over, under = lint_types.compare({"faultlab/a.py": 2, "faultlab/gone.py": 1},
                                     [("faultlab/a.py", 3, "x  [misc]")])
    assert over == []
    assert under == ["faultlab/a.py: 1 mypy errors, the ratchet allows 2",
                     "faultlab/gone.py: 0 mypy errors, the ratchet allows 1"]


def test_the_committed_ratchet_names_existing_files() -> None:
    ratchet = json.loads(lint_types.RATCHET.read_text())
    assert set(ratchet) == {"errors", "type_ignores"}
    missing = [path for path in ratchet["errors"] if not (REPO / path).is_file()]
    assert missing == []
    assert all(isinstance(n, int) and n > 0 for n in ratchet["errors"].values())
