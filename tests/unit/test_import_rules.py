"""The import rules of the layout (each package's ``__init__`` docstring states its own).

- No module of faultlab or of its plugins imports ``reference_trainer``: the reference trainer is
  one trainer among any, reached through the ``faultlab.trainers`` entry point.
- ``faultlab.runtime`` (the in-rank API) imports nothing else of faultlab but its errors
  (``faultlab.errors``, the standard library only), so a rank's exceptions are in the tree.
- ``reference_trainer`` imports nothing of faultlab but ``faultlab.runtime``, as a user's trainer
  would.
- The plugins (pytest, Chaos Toolkit) import no private name of faultlab: a job starts through
  ``faultlab.engine.session.JobSession``, as every job of the engine does.
- The SLA declarations (``faultlab.sla``) sit beneath the spec and the judge, which both read
  them, and import nothing of faultlab but its errors and its plugin registry
  (``faultlab.registry``, which every layer may use to load an entry point).
- The data flow spec → engine → targets + faults → observe → judge → report points one way:
  ``ALLOWED`` lists, per package of faultlab, the packages it may import.
- Each package's ``__init__`` docstring says what it may import, in a sentence that starts
  "It may import", naming exactly the packages of ``ALLOWED``.
- No import cycles, between faultlab's packages (``faultlab.spec``, ``faultlab.faults``, ...;
  ``cli``, ``errors`` and the other top-level modules count as packages) or between its files,
  and no list of exceptions (``cycles``). What two packages both need lives beneath both: the
  fault contract and registry (``faultlab.fault_api``) beneath the spec and the faults, a rank's
  link to its node's relay (``runtime/uplink.py``) beneath the emitter and the relay.

The check reads the source (``ast``), so an import inside a function counts as much as one at
the top; ``if TYPE_CHECKING:`` imports count too (they are still a dependency of the code).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# faultlab package → faultlab packages it may import (itself always). Top-level modules
# (cli, side_by_side, terminal, errors, reaper, testing) are listed like packages.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "registry": {"errors"},
    "fault_api": {"errors", "registry"},
    "runtime": {"errors"},
    "sla": {"errors", "registry"},
    "spec": {"errors", "registry", "fault_api", "sla"},
    "faults": {"errors", "fault_api", "spec", "runtime", "metadata", "targets", "storage"},
    "storage": {"errors"},
    "targets": {"errors", "registry", "spec", "observe", "runtime"},
    "metadata": {"errors"},
    "observe": {"errors", "spec", "runtime"},
    "judge": {"errors", "sla", "spec", "observe"},
    "engine": {"errors", "spec", "faults", "targets", "runtime", "observe", "judge", "report",
               "metadata", "storage"},
    "report": {"errors", "spec", "faults", "observe", "judge"},
    "side_by_side": {"errors", "spec", "engine", "observe", "report", "terminal"},
    "terminal": {"engine", "judge", "report"},
    "cli": {"errors", "spec", "engine", "faults", "targets", "observe", "judge", "report",
            "metadata", "side_by_side", "terminal"},
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


def _import_graph(root: Path) -> dict[str, dict[str, tuple[Path, int]]]:
    """Module of faultlab → the faultlab modules it imports, each with where (file, line) it
    first does: every import counts (at the top, in a function, under ``TYPE_CHECKING``,
    relative ones resolved). An import names the deepest module that exists: ``from
    faultlab.runtime import events`` is an import of ``faultlab.runtime.events``, ``from
    faultlab.spec import Experiment`` one of ``faultlab.spec`` (its ``__init__``)."""
    files: dict[str, Path] = {}
    for path in sorted((root / "faultlab").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def resolve(name: str) -> str | None:
        parts = name.split(".")
        while parts and ".".join(parts) not in files:
            parts.pop()
        return ".".join(parts) if parts else None

    graph: dict[str, dict[str, tuple[Path, int]]] = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        out = graph.setdefault(module, {})
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                names = [f"{base}.{a.name}" for a in node.names]
            for name in names:
                target = resolve(name)
                if target and target != module:
                    out.setdefault(target, (path, node.lineno))
    return graph


def _package(module: str) -> str:
    """``faultlab.spec.model`` → ``spec``; ``faultlab.cli`` → ``cli``; ``faultlab`` →
    ``__init__`` (the names of ``ALLOWED``)."""
    return module.split(".")[1] if "." in module else "__init__"


def _cycle_in(graph: dict[str, dict[str, tuple[Path, int]]],
              members: set[str]) -> list[str]:
    """A shortest cycle through the first of ``members`` (a strongly connected component),
    as its nodes in order, the first one repeated at the end."""
    start = min(members)
    before: dict[str, str] = {}
    todo = [start]
    while todo:
        nxt = []
        for node in todo:
            for succ in sorted(graph.get(node, {})):
                if succ == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(before[path[-1]])
                    return [*reversed(path), start]
                if succ in members and succ not in before:
                    before[succ] = node
                    nxt.append(succ)
        todo = nxt
    raise AssertionError(f"no cycle through {start}")  # a component of one has no cycle


def _components(graph: dict[str, dict[str, tuple[Path, int]]]) -> list[set[str]]:
    """The strongly connected components of more than one node (Tarjan's, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, {}))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, succs = work[-1]
            succ = next(succs, None)
            if succ is not None:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph.get(succ, {})))))
                elif succ in on_stack:
                    low[node] = min(low[node], index[succ])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.add(member)
                    if member == node:
                        break
                if len(members) > 1:
                    found.append(members)
    return found


def cycles(root: Path) -> list[str]:
    """Every import cycle of faultlab under ``root`` (a checkout), between packages and between
    files, one line each: the members, then one cycle through them, each step as the file and
    line of the import that makes it."""
    graph = _import_graph(root)
    packages: dict[str, dict[str, tuple[Path, int]]] = {}
    for module, targets in sorted(graph.items()):
        for target, where in targets.items():
            if _package(module) != _package(target):
                packages.setdefault(_package(module), {}).setdefault(_package(target), where)
    found: list[str] = []
    for kind, g in (("packages", packages), ("files", graph)):
        for members in sorted(_components(g), key=min):
            loop = _cycle_in(g, members)
            steps = "; ".join(f"{g[a][b][0].relative_to(root)}:{g[a][b][1]} imports "
                              f"{b if kind == 'files' else 'faultlab.' + b}"
                              for a, b in zip(loop, loop[1:], strict=False))
            rest = sorted(members - set(loop))
            also = f" (also in it: {', '.join(rest)})" if rest else ""
            found.append(f"import cycle between {kind} {' -> '.join(loop)}: {steps}{also}")
    return found


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


def test_no_import_cycles_between_packages_or_files() -> None:
    assert cycles(REPO) == []


_MAY_IMPORT = re.compile(r"\bIt may import (.*?)(?:[.;:](?:\s|$)|$)", re.S)


def docstring_drift(root: Path) -> list[str]:
    """Each package of faultlab whose ``__init__`` docstring does not say, in a sentence that
    starts "It may import", exactly the packages ``ALLOWED`` lets it import (each written
    ````faultlab.x````), as ``file: what``."""
    found = []
    for init in sorted((root / "faultlab").glob("*/__init__.py")):
        package = init.parent.name
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        said = _MAY_IMPORT.search(doc)
        names = set(re.findall(r"``faultlab\.(\w+)``", said.group(1))) if said else None
        allowed = ALLOWED.get(package, set())
        if names != allowed:
            want = ", ".join(f"``faultlab.{n}``" for n in sorted(allowed)) or "nothing"
            found.append(f"{init.relative_to(root)}: the docstring says "
                         f"{sorted(names) if names is not None else 'nothing'} of what it may "
                         f"import; write 'It may import {want}.' (ALLOWED)")
    return found


def test_each_package_docstring_says_what_it_may_import() -> None:
    assert docstring_drift(REPO) == []


def test_a_docstring_that_drifts_from_the_rules_is_reported(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "faultlab/judge/__init__.py": '"""It may import ``faultlab.errors`` and '
                                      '``faultlab.spec``; never the engine."""\n',
        "faultlab/sla/__init__.py": '"""The SLAs. It may import ``faultlab.errors`` and '
                                    '``faultlab.registry``."""\n',
        "faultlab/report/__init__.py": '"""Reports."""\n',
    })
    assert [line.split(": ")[0] for line in docstring_drift(root)] == [
        "faultlab/judge/__init__.py", "faultlab/report/__init__.py"]
    assert "says ['errors', 'spec'] of what it may import; write 'It may import " \
           "``faultlab.errors``, ``faultlab.observe``, ``faultlab.sla``, ``faultlab.spec``.'" \
           in docstring_drift(root)[0]


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
     "faultlab/runtime/z.py:1: imports faultlab.spec: faultlab.runtime may import only errors"),
    ("faultlab/spec/w.py", "from faultlab.engine import run_experiment\n",
     "faultlab/spec/w.py:1: imports faultlab.engine: faultlab.spec may import only errors, "
     "fault_api"),
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


def test_a_deliberate_cycle_is_reported_naming_its_files(tmp_path: Path) -> None:
    """``a`` and ``b`` import each other through two files (the import back is inside a
    function, where it is still a dependency): a cycle between the packages and between the
    files, each step named by the file and line of its import."""
    root = _tree(tmp_path, {
        "faultlab/a/__init__.py": "",
        "faultlab/a/x.py": "import os\nfrom faultlab.b.y import f\n",
        "faultlab/b/__init__.py": "",
        "faultlab/b/y.py": "def f():\n    from faultlab.a import x\n    return x\n",
    })
    assert cycles(root) == [
        "import cycle between packages a -> b -> a: faultlab/a/x.py:2 imports faultlab.b; "
        "faultlab/b/y.py:2 imports faultlab.a",
        "import cycle between files faultlab.a.x -> faultlab.b.y -> faultlab.a.x: "
        "faultlab/a/x.py:2 imports faultlab.b.y; faultlab/b/y.py:2 imports faultlab.a.x",
    ]


def test_a_cycle_between_packages_alone_is_reported(tmp_path: Path) -> None:
    """No file imports itself back, but ``spec`` needs ``faults`` (for a type check only) and
    ``faults`` needs ``spec`` through other files: the packages still depend on each other."""
    root = _tree(tmp_path, {
        "faultlab/spec/__init__.py": "",
        "faultlab/spec/model.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                  "    from faultlab.faults.base import Fault\n",
        "faultlab/faults/__init__.py": "",
        "faultlab/faults/base.py": "",
        "faultlab/faults/io.py": "from faultlab.spec._base import show\n",
        "faultlab/spec/_base.py": "",
        "faultlab/cli.py": "from .spec import model\n",
    })
    assert cycles(root) == [
        "import cycle between packages faults -> spec -> faults: faultlab/faults/io.py:1 "
        "imports faultlab.spec; faultlab/spec/model.py:3 imports faultlab.faults",
    ]


def test_a_relative_import_counts(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "faultlab/runtime/__init__.py": "",
        "faultlab/runtime/events.py": "from . import relay\n",
        "faultlab/runtime/relay.py": "from .events import EventLog\n",
    })
    assert cycles(root) == [
        "import cycle between files faultlab.runtime.events -> faultlab.runtime.relay -> "
        "faultlab.runtime.events: faultlab/runtime/events.py:1 imports faultlab.runtime.relay; "
        "faultlab/runtime/relay.py:1 imports faultlab.runtime.events",
    ]
