"""The reference trainer reads in one sitting: it is the file a newcomer reads first to learn
what a trainer owes faultlab (issue 55). No function of ``reference_trainer/`` runs past one
screen, and ``train.py`` defines its phases in the order its module docstring tells them."""

from __future__ import annotations

import ast
from pathlib import Path

from reference_trainer import train

PACKAGE = Path(__file__).resolve().parents[2] / "reference_trainer"
MAX_FUNCTION_LINES = 60
# set-up, resume, the step, the checkpoint, the exit: what ``train`` calls, in that order
PHASES = ["main", "train", "join_job", "build", "resume", "train_step", "checkpoint", "finish"]


def test_no_function_of_the_reference_trainer_is_longer_than_a_screen() -> None:
    too_long = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    too_long.append(f"{path.name}:{node.lineno} {node.name}: {lines} lines")
    assert too_long == [], (f"over {MAX_FUNCTION_LINES} lines: split it into named steps, as "
                            f"train.py's phases are")


def test_train_py_defines_its_phases_in_the_order_its_docstring_tells_them() -> None:
    tree = ast.parse(Path(train.__file__).read_text())
    defined = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert [name for name in defined if name in PHASES] == PHASES
    doc = train.__doc__ or ""
    doc = doc[doc.find("A rank's life"):]  # the numbered phases, after what a trainer owes
    told = sorted(PHASES, key=lambda name: doc.find(f"``{name}``"))
    assert all(f"``{name}``" in doc for name in PHASES), "a phase the docstring does not name"
    assert told == PHASES, "the docstring tells the phases in another order than the file"
    undocumented = [name for name in PHASES if not getattr(train, name).__doc__]
    assert undocumented == []
