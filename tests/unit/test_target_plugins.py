"""A team's own target, registered under the ``faultlab.targets`` entry-point group, is named by
``topology.launcher`` exactly as the built-ins (``local``, ``docker``, ``slurm``, registered the
same way) are: it validates, a typo gets the closest name, the engine builds it through
``make_target``, and what it says of where it computes (``reference_site``) keys its golden runs.

The team's package is a tiny distribution in a temporary site directory (a module and its
``.dist-info``), run in a subprocess: entry points are read once per process.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from faultlab.spec.target import launcher_names
from faultlab.targets import target_types
from tests.unit.team_site import run_with, team_package

TEAM_MODULE = '''
from faultlab.targets.local import LocalTarget


class TaggedTarget(LocalTarget):
    """Local nodes with the team's tag in every node's environment."""

    def __init__(self, exp, run_dir, node_env=None):
        env = {n: {**(node_env or {}).get(n, {}), "TEAM_TAG": "blue"}
               for n in (f"node{i}" for i in range(exp.topology.nodes))}
        super().__init__(exp, run_dir, node_env=env)

    @classmethod
    def reference_site(cls, exp):
        return {"pool": "blue"}
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
