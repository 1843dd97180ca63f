"""The package's public names are exactly its ``__all__``, and each resolves."""

from __future__ import annotations

import re
import subprocess
import sys

import faultlab


def test_every_name_in_all_resolves() -> None:
    for name in faultlab.__all__:
        assert getattr(faultlab, name) is not None, name
    assert sorted(dir(faultlab)) == sorted(faultlab.__all__)


def test_importing_faultlab_does_not_import_torch() -> None:
    # `faultlab validate` must stay fast: torch is imported only when a run needs it.
    code = "import sys, faultlab, faultlab.spec, faultlab.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"


def _docstring_tree() -> list[tuple[str, str | None]]:
    """``(class name, its parent)`` for each class drawn in the tree of ``faultlab.errors``'
    docstring, in order (the root's parent: None)."""
    import faultlab.errors

    tree: list[tuple[str, str | None]] = []
    stack: list[str] = []
    for line in (faultlab.errors.__doc__ or "").splitlines():
        match = re.match(r"^    ((?:[│ ]   )*)(?:[├└]── )?([A-Z]\w+)  ", line)
        if match is None:
            continue
        depth = len(match.group(1)) // 4 + (1 if "──" in line else 0)
        del stack[depth:]
        tree.append((match.group(2), stack[-1] if stack else None))
        stack.append(match.group(2))
    return tree


def test_the_docstring_tree_of_errors_is_every_exception_with_its_parent() -> None:
    """Each exception class of ``faultlab.errors`` (and each a plugin defines in the tree) is
    drawn once, under the class it derives from; each of errors is in its ``__all__``."""
    import pytest_faultlab

    import faultlab.errors

    drawn = _docstring_tree()
    tree = dict(drawn)
    assert len(tree) == len(drawn) >= 20, drawn
    classes = {name: getattr(faultlab.errors, name, None) or getattr(pytest_faultlab, name)
               for name in tree}
    defined = {name for name, value in vars(faultlab.errors).items()
               if isinstance(value, type) and issubclass(value, BaseException)
               and value.__module__ == "faultlab.errors"}
    assert defined <= set(tree) and defined <= set(faultlab.errors.__all__)
    assert tree["FaultlabError"] is None and tree["NoParameterError"] == "ActionError"
    for name, cls in classes.items():
        parent = tree[name]
        bases = [b.__name__ for b in cls.__bases__ if issubclass(b, faultlab.errors.FaultlabError)]
        assert bases == ([parent] if parent else []), (name, bases, parent)
