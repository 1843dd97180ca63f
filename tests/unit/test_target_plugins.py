"""A team's own target, registered under the ``faultlab.targets`` entry-point group, is named by
``topology.launcher`` exactly as the built-ins (``local``, ``docker``, ``slurm``, registered the
same way) are: it validates, a typo gets the closest name, the engine builds it through
``make_target``, and what it says of where it computes (``reference_site``) keys its golden runs.

The team's package is a tiny distribution in a temporary site directory (a module and its
``.dist-info``), run in a subprocess: entry points are read once per process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from faultlab.spec.target import launcher_names
from faultlab.targets import target_types
from tests.unit.team_site import run_with, team_package

TEAM_MODULE = '''
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from faultlab.targets.local import LocalTarget


class TaggedSettings(BaseModel):
    """The block topology.tagged: of an experiment."""

    model_config = ConfigDict(extra="forbid", strict=True)
    tag: str = "blue"
    """The tag in every node's environment."""


class TaggedTarget(LocalTarget):
    """Local nodes with the team's tag in every node's environment."""

    settings = TaggedSettings

    def __init__(self, exp, run_dir, node_env=None):
        env = {n: {**(node_env or {}).get(n, {}), "TEAM_TAG": exp.topology.settings.tag}
               for n in (f"node{i}" for i in range(exp.topology.nodes))}
        super().__init__(exp, run_dir, node_env=env)

    @classmethod
    def reference_site(cls, exp):
        return {"pool": exp.topology.settings.tag}

    @classmethod
    def check_launch(cls, target, topology):
        if target.launch is None:
            return []
        return [(("target", "launch"), "tagged nodes start under faultlab's launcher only: "
                 "leave launch unset")]

    def guard_record(self):
        return {"files": [str(self.run_dir / "tag-left")]}

    @classmethod
    def undo_from_guard(cls, record):
        done = []
        for name in record["files"]:
            if Path(name).exists():
                Path(name).unlink()
                done.append(f"removed {Path(name).name}")
        return done
'''

PROBE = '''
import json, sys
from pathlib import Path
from faultlab.engine.golden import golden_key, reference_site
from faultlab.spec import experiment_from_dict
from faultlab.targets import make_target

def exp(launcher):
    return experiment_from_dict({"name": "t", "topology": {"nodes": 1, "launcher": launcher}})

team = make_target(exp("tagged"), Path(sys.argv[1]))
print(json.dumps({"class": type(team).__name__,
                  "env": team.job.node_env["node0"].get("TEAM_TAG"),
                  "site": reference_site(exp("tagged")),
                  "same_key": golden_key(exp("tagged")) == golden_key(exp("local"))}))
'''


@pytest.fixture(scope="module")
def team_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return team_package(tmp_path_factory.mktemp("site"), "team_target", TEAM_MODULE,
                        "faultlab.targets", "tagged = team_target:TaggedTarget")


def run(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_with(site, *args, check=False)


def test_the_builtins_are_entry_points_like_any_target() -> None:
    assert {"local", "docker", "slurm"} <= set(target_types()) and \
        launcher_names() == sorted(target_types())


def test_a_team_target_is_named_by_launcher_built_and_keys_its_golden_runs(
        team_site: Path, tmp_path: Path) -> None:
    doc = team_site / "team.yaml"
    doc.write_text(textwrap.dedent("""\
        name: team
        topology: {nodes: 1, launcher: tagged}
        """))
    out = run(team_site, "-m", "faultlab.cli", "validate", str(doc))
    assert out.returncode == 0, out.stdout + out.stderr
    doc.write_text(doc.read_text().replace("tagged", "taged"))
    out = run(team_site, "-m", "faultlab.cli", "validate", str(doc))
    assert out.returncode == 2 and "unknown launcher 'taged'; did you mean 'tagged'?" in \
        out.stdout + out.stderr, out.stdout + out.stderr
    (team_site / "probe.py").write_text(PROBE)
    out = run(team_site, "probe.py", str(tmp_path / "job"))
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["class"] == "TaggedTarget" and seen["env"] == "blue"
    assert seen["site"]["target"] == "tagged" and seen["site"]["pool"] == "blue"
    assert not seen["same_key"]  # a team's site's reference is its own
    schema = run(team_site, "-m", "faultlab.cli", "schema")
    assert schema.returncode == 0, schema.stderr
    assert "tagged" in json.loads(schema.stdout)["$defs"]["Topology"]["properties"][
        "launcher"]["enum"]


SETTINGS_PROBE = '''
import json, sys
from pathlib import Path
from faultlab.errors import InvalidExperimentError
from faultlab.spec import load_experiment

out = {}
for path in sys.argv[1:]:
    try:
        exp = load_experiment(Path(path))
        out[Path(path).stem] = {"settings": exp.topology.settings.model_dump()}
    except InvalidExperimentError as e:
        out[Path(path).stem] = {"problems": [str(p) for p in e.problems]}
print(json.dumps(out))
'''


def test_a_team_target_has_its_own_settings_launch_check_and_schema(team_site: Path) -> None:
    """``topology.tagged:`` is parsed by ``TaggedTarget.settings`` (defaults where absent),
    its errors located at file:line; a block for another launcher, and a launch line the
    target's ``check_launch`` refuses, are located errors too; the schema has the block."""
    docs = {
        "red": "topology:\n  launcher: tagged\n  tagged: {tag: red}\n",
        "plain": "topology: {launcher: tagged}\n",
        "bad": "topology:\n  launcher: tagged\n  tagged:\n    tag: 5\n",
        "other": "topology:\n  launcher: local\n  tagged: {tag: red}\n",
        "launch": "topology: {launcher: tagged}\ntarget:\n  launch: torchrun\n",
    }
    for name, body in docs.items():
        (team_site / f"{name}.yaml").write_text(f"name: {name}\n{body}")
    (team_site / "settings_probe.py").write_text(SETTINGS_PROBE)
    out = run(team_site, "settings_probe.py", *(str(team_site / f"{n}.yaml") for n in docs))
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["red"] == {"settings": {"tag": "red"}}
    assert seen["plain"] == {"settings": {"tag": "blue"}}
    [bad] = seen["bad"]["problems"]
    assert bad.startswith(f"{team_site / 'bad.yaml'}:5 topology.tagged.tag:") and "5" in bad
    [other] = seen["other"]["problems"]
    assert other.startswith(f"{team_site / 'other.yaml'}:4 topology.tagged:") and \
        "this topology's launcher is 'local'" in other, other
    [launch] = seen["launch"]["problems"]
    assert launch.startswith(f"{team_site / 'launch.yaml'}:4 target.launch:") and \
        "faultlab's launcher only" in launch, launch
    schema = run(team_site, "-m", "faultlab.cli", "schema")
    tagged = json.loads(schema.stdout)["$defs"]["Topology"]["properties"]["tagged"]
    assert tagged["properties"]["tag"]["type"] == "string", tagged


def test_the_guard_undoes_what_a_team_target_recorded_when_faultlab_dies(
        team_site: Path, tmp_path: Path) -> None:
    """The guard (``faultlab.reaper --target-guard``) of a parent that is SIGKILLed loads the
    class registered as the record's launcher and runs its ``undo_from_guard``; a file the
    record names that is already gone is no error."""
    left = tmp_path / "tag-left"
    left.write_text("made by the team's target")
    guard = tmp_path / "target-guard.json"
    guard.write_text(json.dumps({"launcher": "tagged", "record": {
        "files": [str(left), str(tmp_path / "already-gone")]}}))
    pidfile = tmp_path / "pids.json"
    pidfile.write_text("[]")
    parent = subprocess.Popen(["sleep", "600"])
    env = {**os.environ, "PYTHONPATH": str(team_site)}
    reaper = subprocess.Popen([sys.executable, "-m", "faultlab.reaper", "--parent",
                               str(parent.pid), "--pidfile", str(pidfile), "--interval-s",
                               "0.1", "--target-guard", str(guard)],
                              env=env, stderr=subprocess.PIPE, text=True)
    try:
        parent.kill()
        parent.wait()
        assert reaper.wait(timeout=60) == 0
    finally:
        reaper.kill()
    said = reaper.stderr.read() if reaper.stderr else ""
    assert not left.exists(), said
    assert "faultlab reaper: target: removed tag-left" in said, said
