"""A fault states what the engine and the observers do for it as capabilities its class
declares (``Fault.slows_job``, ``fails_saves`` ...), never as a type name they recognise: the
engine copies them into the fault's ``FaultRecord`` (and the journal), the observers read the
record. A team's fault that declares one gets the behaviour the built-ins get, and
``faultlab list faults`` and the fault reference show what it declares.

The team's package is installed as pip would, into a temporary site directory
(``tests/unit/team_site.py``), and faultlab runs in a subprocess with it on its path.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from faultlab.faults import CAPABILITIES, Fault, fault_types
from tests.unit.team_site import run_with, team_package

REPO = Path(__file__).resolve().parents[2]

TEAM_MODULE = '''
from typing import ClassVar

from faultlab.faults import Fault


class TeamSlowFault(Fault):
    """Slow one rank's data loader down (the team's own straggler)."""

    type = "team_slow"
    family = "team"
    targets = ("rank",)
    slows_job: ClassVar[bool] = True

    def inject(self, ctx, victim):
        return {"ranks": [victim.value]}


class TeamQuietFault(Fault):
    """The same fault without the declaration."""

    type = "team_quiet"
    family = "team"
    targets = ("rank",)

    def inject(self, ctx, victim):
        return {"ranks": [victim.value]}
'''

RUN = '''
import dataclasses, json, sys
from faultlab.engine.runner import _fire
from faultlab.engine.view import NullView
from faultlab.judge import judge
from faultlab.observe import compute_metrics
from faultlab.spec import experiment_from_dict

class Stream:
    def of_kind(self, kind):
        return []

class Target:  # what _fire reads of a target; the team's inject needs nothing of it
    stream = Stream()

def ev(t, kind, **kw):
    return {"t": t, "kind": kind, "pid": 10, "rank": 0, "world_size": 2, **kw}

events = [ev(90 + i, "step", step=i, step_time_s=0.1 if i < 6 else 0.3) for i in range(1, 10)]
events.append(ev(98.25, "anomaly", what="straggler", straggler_rank=1, step=8))
events.append(ev(100, "exit", reason="completed"))
out = {}
for fault_type in ("team_slow", "team_quiet"):
    exp = experiment_from_dict({
        "name": "x", "target": {"trainer": "reference"},
        "faults": [{"id": "slow", "type": fault_type, "target": {"rank": 1},
                    "trigger": {"at_step": 5}}],
        "expect": {"straggler_detected_within_s": 5}})
    record = _fire(exp, 0, 1, Target(), NullView()).record
    record = dataclasses.replace(record, injected_t=95.5)  # when the events have it
    metrics = compute_metrics(events, [record])
    results = judge(exp, metrics, None, timed_out=False, faults=[record], events=events)
    out[fault_type] = {
        "capabilities": list(record.capabilities),
        "journal": record.to_dict()["capabilities"],
        "straggler_detected_s": metrics.faults[0].straggler_detected_s,
        "within": metrics.straggler_detected_within_s,
        "sla": [[r.name, r.passed] for r in results if r.name == "straggler_detected_within_s"],
    }
json.dump(out, sys.stdout)
'''


@pytest.fixture(scope="module")
def team_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return team_package(tmp_path_factory.mktemp("site"), "team_faults", TEAM_MODULE,
                        "faultlab.faults", "team_slow = team_faults:TeamSlowFault\n"
                        "team_quiet = team_faults:TeamQuietFault")


def test_a_team_fault_declaring_slows_job_is_measured_as_the_built_in_stragglers_are(
        team_site: Path) -> None:
    done = run_with(team_site, "-c", RUN, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout)
    slow, quiet = out["team_slow"], out["team_quiet"]
    # The engine copied the declaration into the record, and the journal keeps it.
    assert slow["capabilities"] == slow["journal"] == ["slows_job"]
    assert quiet["capabilities"] == quiet["journal"] == []
    # The timeline measured it as it measures collective_delay: the job named rank 1.
    assert slow["straggler_detected_s"] == pytest.approx(2.75)
    assert slow["within"] == pytest.approx(2.75)
    assert slow["sla"] == [["straggler_detected_within_s", True]]
    # Without the declaration nothing is measured, whatever the fault's name or details.
    assert quiet["straggler_detected_s"] is None and quiet["within"] is None
    assert quiet["sla"] != [["straggler_detected_within_s", True]]


def test_a_team_fault_shows_its_capabilities_in_the_listing_and_the_reference(
        team_site: Path) -> None:
    listed = run_with(team_site, "-m", "faultlab.cli", "list", "faults").stdout
    slow = listed[listed.index("team_slow  ("):].splitlines()
    quiet = listed[listed.index("team_quiet  ("):].splitlines()
    assert slow[2].strip() == "capabilities: slows_job"
    assert "capabilities" not in quiet[2]
    page = run_with(team_site, "-c", "from faultlab.reference import faults_page; "
                    "print(faults_page())").stdout
    slow_section = page[page.index("### team_slow"):].split("\n### ")[0]
    quiet_section = page[page.index("### team_quiet"):].split("\n### ")[0]
    assert "#capabilities))**:** `slows_job`" in slow_section
    assert "capabilities" not in quiet_section


def test_every_capability_is_a_declared_attribute_off_by_default() -> None:
    for name in CAPABILITIES:
        assert getattr(Fault, name) is False, name
        assert name in Fault.__annotations__, name
    assert set(CAPABILITIES) == {name for name, kind in Fault.__annotations__.items()
                                 if "ClassVar[bool]" in str(kind)} - {"reversible",
                                                                     "step_gated"}


BUILTIN_CAPABILITIES = {
    "collective_delay": ("slows_job",),
    "sdc": ("corrupts_silently",),
    "gpu_slow": ("slows_job",),
    "network_throttle": ("slows_job",),
    "io_error": ("fails_saves", "mounts_storage"),
    "disk_full": ("fails_saves", "mounts_storage"),
    "io_hang": ("fails_saves", "hangs_saves", "mounts_storage"),
    "io_latency": ("mounts_storage",),
    "stale_shared_fs": ("mounts_storage", "needs_exact_mount"),
    "node_kill": ("loses_node",),
    "node_pause": ("loses_node",),
    "network_partition": ("loses_node",),
    "spot_preemption": ("loses_node",),
    "slurm_node_down": ("loses_node",),
    "service_kill": ("kills_service",),
}
"""What the built-ins declare: the behaviour the observers gave them by name before."""


def test_the_built_ins_declare_what_the_observers_gave_them_by_name() -> None:
    declared = {name: cls.capabilities() for name, cls in fault_types().items()
                if cls.capabilities()}
    assert declared == BUILTIN_CAPABILITIES


def test_the_observers_and_the_engine_read_only_declared_capabilities() -> None:
    """Every ``declares("...")`` in faultlab names a capability of ``Fault``, and no module
    outside the faults reads a capability with ``getattr`` and a default (an undeclared
    flag)."""
    read: set[str] = set()
    for path in (REPO / "faultlab").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "declares" and node.args \
                    and isinstance(node.args[0], ast.Constant):
                read.add(node.args[0].value)
            if isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) == 3 \
                    and isinstance(node.args[1], ast.Constant):
                assert node.args[1].value not in CAPABILITIES, f"{path}: getattr of a flag"
    assert read and read <= set(CAPABILITIES)
