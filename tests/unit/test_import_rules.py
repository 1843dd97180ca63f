"""The import rules of the layout (each package's ``__init__`` docstring states its own).

- No module of faultlab or of its plugins imports ``reference_trainer``: the reference trainer is
  one trainer among any, reached through the ``faultlab.trainers`` entry point.
- ``faultlab.runtime`` (the in-rank API) imports nothing else of faultlab.
- ``reference_trainer`` imports nothing of faultlab but ``faultlab.runtime``, as a user's trainer
  would.
- The plugins (pytest, Chaos Toolkit) import no private name of faultlab: a job starts through
  ``faultlab.engine.session.JobSession``, as every job of the engine does.
- The data flow spec → engine → targets + faults → observe → judge → report points one way:
  ``ALLOWED`` lists, per package of faultlab, the packages it may import.

The check reads the source (``ast``), so an import inside a function counts as much as one at
the top; ``if TYPE_CHECKING:`` imports count too (they are still a dependency of the code).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# faultlab package → faultlab packages it may import (itself always). Top-level modules
# (cli, errors, reaper, testing) are listed like packages.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "runtime": set(),
    "spec": {"errors", "faults"},
    "faults": {"errors", "spec", "runtime", "metadata", "targets", "storage"},
    "storage": {"errors"},
    "targets": {"errors", "spec", "observe", "runtime"},
    "metadata": {"errors"},
    "observe": {"errors", "spec", "runtime"},
    "judge": {"errors", "spec", "observe"},
    "engine": {"errors", "spec", "faults", "targets", "runtime", "observe", "judge", "report",
               "metadata", "storage"},
    "report": {"errors", "spec", "faults", "observe", "judge"},
    "cli": {"errors", "spec", "engine", "faults", "targets", "observe", "judge", "report",
            "metadata"},
    "reaper": {"targets", "storage"},
    "testing": {"errors", "targets"},
    "reference": {"errors", "spec", "faults", "targets", "engine", "observe", "judge", "cli"},
    "__init__": set(),
}
"""Which faultlab packages each one may import (its own modules always)."""

ENGINE_API = {"session", "golden", "runner", "campaign", "repeat", "RunView", "NullView",
              "RunResult", "run_experiment", "judge", "SLAResult"}
"""What of ``faultlab.engine`` its plugins may import: the package's own names and the modules
that start, run and judge a job; never a piece of how the engine does it (its runtime plan,
hub, storage mount)."""


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every absolute import in ``path`` (``from a import b`` counts as
    ``a.b`` too, so ``from faultlab import runtime`` is an import of ``faultlab.runtime``)."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def violations(root: Path) -> list[str]:
    """Every broken rule under ``root`` (a checkout), as ``file:line: what``."""
    found: list[str] = []

    def check(path: Path, ok: object) -> None:
        reported: set[int] = set()
        for line, module in _imports(path):
            why = ok(module)  # type: ignore[operator]
            if why and line not in reported:  # one report per import statement
                reported.add(line)
                found.append(f"{path.relative_to(root)}:{line}: imports {module}: {why}")

    for path in sorted((root / "faultlab").rglob("*.py")):
        rel = path.relative_to(root / "faultlab").with_suffix("")
        package = rel.parts[0]

        def ok(module: str, package: str = package) -> str | None:
            top = module.split(".")[0]
            if top == "reference_trainer":
                return "faultlab never imports a trainer (use faultlab.spec.trainers)"
            if top in ("chaosfaultlab", "pytest_faultlab"):
                return "faultlab never imports its plugins"
            if top != "faultlab" or module == "faultlab" or module.count(".") == 0:
                return None
            target = module.split(".")[1]
            if target in ("__version__",) or target == package:
                return None
            if target not in ALLOWED.get(package, set()):
                return f"faultlab.{package} may import only " \
                       f"{', '.join(sorted(ALLOWED.get(package, set()))) or 'itself'}"
            return None

        check(path, ok)
    def plugin_ok(module: str) -> str | None:
        parts = module.split(".")
        if parts[0] == "reference_trainer":
            return "plugins reach the trainer through faultlab, never directly"
        if parts[0] == "faultlab" and any(p.startswith("_") and not p.startswith("__")
                                          for p in parts[1:]):
            return "plugins use faultlab's public names only"
        if parts[:2] == ["faultlab", "engine"] and len(parts) > 2 and \
                parts[2] not in ENGINE_API:
            return (f"plugins reach the engine through {', '.join(sorted(ENGINE_API))} only "
                    f"(a job starts through faultlab.engine.session.JobSession)")
        return None

    for path in sorted((root / "plugins").rglob("*.py")):
        check(path, plugin_ok)
    for path in sorted((root / "reference_trainer").rglob("*.py")):
        def trainer_ok(module: str) -> str | None:
            parts = module.split(".")
            if parts[0] != "faultlab" or len(parts) == 1 or parts[1] == "runtime":
                return None
            return "a trainer may use faultlab.runtime only, as a user's trainer would"

        check(path, trainer_ok)
    return found


def test_the_tree_keeps_the_import_rules() -> None:
    assert violations(REPO) == []


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name in ("faultlab/__init__.py", "plugins/p/__init__.py",
                 "reference_trainer/__init__.py", *files):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(files.get(name, ""))
    return tmp_path


@pytest.mark.parametrize("name,source,expected", [
    ("faultlab/engine/x.py", "import reference_trainer.config\n",
     "faultlab/engine/x.py:1: imports reference_trainer.config: faultlab never imports a "
     "trainer"),
    ("faultlab/targets/y.py", "def f():\n    from reference_trainer import launch\n",
     "faultlab/targets/y.py:2: imports reference_trainer: faultlab never imports a trainer"),
    ("faultlab/runtime/z.py", "from faultlab.spec import Experiment\n",
     "faultlab/runtime/z.py:1: imports faultlab.spec: faultlab.runtime may import only itself"),
    ("faultlab/spec/w.py", "from faultlab.engine import run_experiment\n",
     "faultlab/spec/w.py:1: imports faultlab.engine: faultlab.spec may import only errors, "
     "faults"),
    ("reference_trainer/t.py", "from faultlab.targets.launcher import LocalJob\n",
     "reference_trainer/t.py:1: imports faultlab.targets.launcher: a trainer may use "
     "faultlab.runtime only"),
    ("plugins/p/a.py", "from reference_trainer.checkpoint import verify_checkpoint\n",
     "plugins/p/a.py:1: imports reference_trainer.checkpoint: plugins reach the trainer"),
])
def test_a_deliberate_violation_is_reported_where_it_is(tmp_path: Path, name: str, source: str,
                                                        expected: str) -> None:
    found = violations(_tree(tmp_path, {name: source}))
    assert found and found[0].startswith(expected), found


def test_allowed_imports_pass(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "reference_trainer/t.py": "from faultlab import runtime\nimport faultlab.runtime.x\n",
        "faultlab/engine/x.py": "from faultlab.targets import make_target\nimport torch\n",
        "faultlab/runtime/z.py": "from faultlab.runtime.plan import load_plan\n",
    })
    assert violations(root) == []
