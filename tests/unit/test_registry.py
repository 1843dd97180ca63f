"""The one registry (``faultlab.registry``): every entry-point group, built-ins included, read
by one module, with one error that names the plugin's distribution, its entry point and the fix.
The plugin tests (``test_sla_plugins``, ``test_context_capabilities``) cover a team's broken
package; this covers the registry's own contract on what is installed."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from faultlab import registry
from faultlab.errors import PluginError

REPO = Path(__file__).resolve().parents[2]


def test_every_group_is_listed_by_name_sorted_and_the_builtins_are_faultlabs() -> None:
    assert registry.GROUPS == {"fault": "faultlab.faults", "sla": "faultlab.slas",
                               "target": "faultlab.targets", "trainer": "faultlab.trainers"}
    for kind in registry.GROUPS:
        names = list(registry.registered(kind))
        assert names and names == sorted(names), kind
    targets = registry.registered("target")
    assert {"local", "docker", "slurm"} <= set(targets)
    assert targets["local"].value == "faultlab.targets.local:LocalTarget"
    assert targets["local"].dist is not None and targets["local"].dist.name == "faultlab"
    assert registry.registered("sla")["completes"].value == "faultlab.sla.builtin:COMPLETES"


def test_listing_a_group_imports_nothing_of_it() -> None:
    code = ("import sys; from faultlab import registry; registry.registered('fault'); "
            "registry.registered('target'); "
            "print(sorted(m for m in sys.modules if m.startswith(('faultlab.faults', "
            "'faultlab.targets'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_an_unknown_name_lists_the_known_ones_and_the_fix() -> None:
    with pytest.raises(PluginError) as e:
        registry.load("target", "k8s")
    said = str(e.value)
    assert "no target registered as 'k8s'; the faultlab.targets entry points: " in said
    assert ", ".join(registry.registered("target")) in said  # docker, local, slurm ...
    assert '[project.entry-points."faultlab.targets"] k8s = "module:attr"' in said
    with pytest.raises(ValueError, match="no plugin kind 'faults'; the kinds: fault, sla"):
        registry.registered("faults")


def test_a_refused_object_names_the_distribution_the_entry_point_and_the_fix() -> None:
    with pytest.raises(PluginError) as e:
        registry.load("sla", "goodput", check=lambda sla: f"has kind={sla.kind!r}, not 'max'")
    said = str(e.value)
    assert said.startswith("SLA plugin 'faultlab ")
    assert "(entry point goodput = faultlab.sla.builtin:GOODPUT in faultlab.slas) has " \
           "kind='min', not 'max'; fix faultlab.sla.builtin:GOODPUT (or the entry point in " \
           "faultlab's pyproject.toml, then reinstall it" in said
    assert said.endswith("or uninstall faultlab")
    assert registry.load("sla", "goodput", check=lambda sla: None).key == "goodput"


def test_no_module_but_the_registry_reads_an_entry_point_group() -> None:
    readers = []
    for path in sorted((REPO / "faultlab").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(
                    node.func, "attr", None)) == "entry_points":
                readers.append(str(path.relative_to(REPO)))
    assert readers == ["faultlab/registry.py"]
