"""No launcher name and no target's module outside ``faultlab/targets/``.

A target is a plugin the way a fault is: what it offers (``offers``), its settings
(``settings``, the block ``topology.<launcher>:``), its launch-line check (``check_launch``)
and its guard clean-up (``guard_record``, ``undo_from_guard``) are declarations on its class,
read through the registry by whatever name ``topology.launcher`` gives. So the spec, the
engine, the faults, the guard, the cli and the pytest plugin never branch on a launcher's name
(``launcher == "slurm"``) nor import a target's module (``faultlab.targets.docker.netns``): a
built-in target could be deleted, and a team's added, without them noticing.

``violations(root)`` reads the source (``ast``) of ``faultlab/`` outside ``faultlab/targets/``
and of ``plugins/pytest_faultlab``, and reports, as ``file:line: what``:

- a launcher name used as a launcher: a string constant that is one (``LAUNCHER_NAMES``)
  compared with an expression that names a launcher, given to a function that takes one
  (``launcher_class("slurm")``), assigned to or defaulted into a name with ``launcher`` in it,
  or the value of a ``"launcher"`` key;
- an import of a target's module (``faultlab.targets.<impl>``: a module or package of
  ``faultlab/targets/`` that defines a ``...Target`` class; ``base``, the contract, is not
  one, nor is the launcher machinery the cli's ``faultlab launch`` runs).

``NAMED_ON_PURPOSE`` holds the few places that name one target because they are that target's
own user-facing command or helper, each with why; the test fails if one of them stops naming it
(the entry goes when the need does). The Chaos Toolkit extension (``plugins/chaosfaultlab``)
attaches to a running job by its Slurm job id or its run directory, which are what those two
targets take: it is outside this check.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

TAKES_A_LAUNCHER = ("launcher_class", "launcher_offers", "target_type", "require_target",
                    "launch_line", "launchers_offering")
"""Functions whose string argument is a launcher's name."""

NAMED_ON_PURPOSE: dict[tuple[str, str], str] = {
    ("faultlab/spec/target.py", '"local"'):
        "Topology.launcher's default, the YAML's and the schema's: the one name the spec holds",
    ("faultlab/testing.py", '"docker"'):
        "require_docker_engine, the docker target's test helper (the Slurm test cluster's "
        "nodes are containers too): require_target of that launcher",
    ("faultlab/cli.py", "faultlab.targets.docker"):
        "`faultlab docker clean`, the docker target's own command: removes what runs left in "
        "the engine",
}
"""(file, what it names) → why that file names one target on purpose."""


def launcher_names(root: Path) -> set[str]:
    """Every name a built-in target has: its ``faultlab.targets`` entry point (pyproject) and
    its module under ``faultlab/targets`` (``attach`` is registered by no entry point)."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    registered = set(project.get("entry-points", {}).get("faultlab.targets", {}))
    return registered | target_modules(root)


def target_modules(root: Path) -> set[str]:
    """The modules and packages of ``faultlab/targets`` that define a ``...Target`` class
    (outside ``base.py``, the contract): the targets' own code."""
    found = set()
    targets = root / "faultlab" / "targets"
    for path in targets.rglob("*.py"):
        if path == targets / "base.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        if any(isinstance(n, ast.ClassDef) and n.name.endswith("Target") for n in tree.body):
            found.add(path.relative_to(targets).parts[0].removesuffix(".py"))
    return found


def _names_launcher(node: ast.AST) -> bool:
    return "launcher" in ast.unparse(node)


def _constant(node: ast.AST | None, names: set[str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
        return node.value
    return None


def _launcher_uses(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """``(line, name)`` of each launcher name used as a launcher in ``tree``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for side in sides:
                name = _constant(side, names)
                if name and any(_names_launcher(o) for o in sides if o is not side):
                    found.append((node.lineno, name))
        elif isinstance(node, ast.Call):
            func = ast.unparse(node.func).rsplit(".", 1)[-1]
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                name = _constant(arg, names)
                if name and (func in TAKES_A_LAUNCHER or
                             any(k.value is arg and "launcher" in (k.arg or "")
                                 for k in node.keywords)):
                    found.append((node.lineno, name))
        elif isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            name = _constant(node.value, names)
            if name and any(_names_launcher(t) for t in targets):
                found.append((node.lineno, name))
        elif isinstance(node, ast.arguments):
            params = [*node.posonlyargs, *node.args]
            pairs = [*zip(params[len(params) - len(node.defaults):], node.defaults,
                          strict=True),
                     *((a, d) for a, d in zip(node.kwonlyargs, node.kw_defaults, strict=True)
                       if d is not None)]
            for param, default in pairs:
                name = _constant(default, names)
                if name and "launcher" in param.arg:
                    found.append((default.lineno, name))
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                name = _constant(value, names)
                if name and isinstance(key, ast.Constant) and key.value == "launcher":
                    found.append((value.lineno, name))
    return found


def _target_imports(tree: ast.AST, impls: set[str]) -> list[tuple[int, str]]:
    """``(line, module)`` of each import of a target's module."""
    found = []
    for node in ast.walk(tree):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        for module in modules:
            parts = module.split(".")
            if parts[:2] == ["faultlab", "targets"] and len(parts) > 2 and parts[2] in impls:
                found.append((node.lineno, ".".join(parts[:3])))
                break
    return found


def _checked_files(root: Path) -> list[Path]:
    files = [p for p in sorted((root / "faultlab").rglob("*.py"))
             if "targets" not in p.relative_to(root / "faultlab").parts[:1]]
    return files + sorted((root / "plugins" / "pytest_faultlab").rglob("*.py"))


def findings(root: Path) -> list[tuple[str, int, str]]:
    """``(file, line, what it names)`` of every launcher name and target import outside
    ``faultlab/targets/``, those named on purpose included."""
    names, impls = launcher_names(root), target_modules(root)
    out = []
    for path in _checked_files(root):
        rel = str(path.relative_to(root))
        tree = ast.parse(path.read_text(), rel)
        out += [(rel, line, repr(name).replace("'", '"')) for line, name in
                sorted(set(_launcher_uses(tree, names)))]
        out += [(rel, line, module) for line, module in _target_imports(tree, impls)]
    return out


def violations(root: Path) -> list[str]:
    """``findings`` but those named on purpose, as ``file:line: what``."""
    return [f"{rel}:{line}: names {what} outside faultlab/targets/ (declare it on the target "
            f"class, reach it through the registry or a capability protocol)"
            for rel, line, what in findings(root) if (rel, what) not in NAMED_ON_PURPOSE]


def test_no_launcher_name_or_target_module_outside_the_targets() -> None:
    assert violations(REPO) == []


def test_each_place_named_on_purpose_still_names_it() -> None:
    """An entry of ``NAMED_ON_PURPOSE`` that no longer matches is stale: remove it."""
    found = {(rel, what) for rel, _line, what in findings(REPO)}
    assert set(NAMED_ON_PURPOSE) <= found, set(NAMED_ON_PURPOSE) - found


def test_the_builtin_names_and_modules_are_found() -> None:
    assert {"local", "docker", "slurm", "attach"} <= launcher_names(REPO)
    assert target_modules(REPO) == {"local", "docker", "slurm", "attach"}


@pytest.mark.parametrize("source, what", [
    ('if exp.topology.launcher == "slurm":\n    pass\n', '"slurm"'),
    ('if "docker" != topology.launcher:\n    pass\n', '"docker"'),
    ('cls = launcher_class("docker")\n', '"docker"'),
    ('def f(launcher: str = "local"):\n    pass\n', '"local"'),
    ('run(launcher="slurm")\n', '"slurm"'),
    ('doc = {"topology": {"launcher": "slurm"}}\n', '"slurm"'),
    ("from faultlab.targets.docker.netns import run_in\n", "faultlab.targets.docker"),
    ("import faultlab.targets.slurm.guard\n", "faultlab.targets.slurm"),
    ("def f():\n    from faultlab.targets.slurm import SlurmTarget\n",
     "faultlab.targets.slurm"),
])
def test_a_deliberate_violation_is_reported_where_it_is(tmp_path: Path, source: str,
                                                        what: str) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "faultlab"\n[project.entry-points."faultlab.targets"]\n'
        'local = "faultlab.targets.local:LocalTarget"\n'
        'docker = "faultlab.targets.docker:DockerTarget"\n'
        'slurm = "faultlab.targets.slurm:SlurmTarget"\n')
    for name, body in {"faultlab/targets/base.py": "class Target: ...\n",
                       "faultlab/targets/docker/__init__.py": "class DockerTarget: ...\n",
                       "faultlab/targets/slurm/target.py": "class SlurmTarget: ...\n",
                       "faultlab/targets/launcher.py": "class LocalJob: ...\n",
                       "plugins/pytest_faultlab/__init__.py": "",
                       "faultlab/engine/x.py": source}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(body)
    lines = [line for rel, line, w in findings(tmp_path) if rel == "faultlab/engine/x.py"
             and w == what]
    assert lines == [source.count("\n", 0, source.index(what.strip('"'))) + 1], \
        findings(tmp_path)


def test_a_name_that_is_not_a_launcher_use_passes(tmp_path: Path) -> None:
    """A launcher's name elsewhere (a subcommand, a word in ``__all__``, a message) and the
    targets' contract and launcher machinery are not what the check is about."""
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "faultlab"\n')
    (tmp_path / "faultlab/targets").mkdir(parents=True)
    (tmp_path / "faultlab/targets/attach.py").write_text("class AttachedTarget: ...\n")
    (tmp_path / "plugins/pytest_faultlab").mkdir(parents=True)
    (tmp_path / "faultlab/x.py").write_text(
        '__all__ = ["attach"]\nsub.add_parser("attach")\nprint(f"attach {launcher}")\n'
        "from faultlab.targets.base import Target\nfrom faultlab.targets import make_target\n")
    assert findings(tmp_path) == []
