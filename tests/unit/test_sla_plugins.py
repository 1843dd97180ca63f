"""A team's own SLA, registered under the ``faultlab.slas`` entry-point group, is an SLA like
the built-ins: experiments state it under ``expect`` (validated, with the closest-key
suggestion for a typo), the judge judges it from the run's records, and it shows in the
verdict, the report, ``faultlab list slas``, the schema and the SLA reference.

The team's package is a tiny distribution written into a temporary site directory (a module
and its ``.dist-info`` with ``entry_points.txt``, as pip would install it); faultlab runs in a
subprocess with that directory on its path, since the registry is read once per process.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from faultlab import registry
from faultlab.sla import Sla, campaign_slas, slas
from faultlab.spec import Expect
from faultlab.spec.expect import ExpectBase
from tests.unit.team_site import run_with, team_package

TEAM_MODULE = '''
from dataclasses import dataclass

from faultlab.sla import Evidence, Sla


@dataclass(frozen=True, kw_only=True)
class MaxLoss(Sla):
    """The largest loss any step recorded."""

    def measure(self, ev: Evidence) -> float | None:
        losses = [e["loss"] for e in ev.events if e.get("kind") == "step" and "loss" in e]
        return max(losses) if losses else None

    def explain(self, ev: Evidence, measured, bound):
        if measured is not None and not self.holds(measured, bound):
            worst = max((e for e in ev.events if e.get("kind") == "step" and "loss" in e),
                        key=lambda e: e["loss"])
            return measured, f"step {worst['step']} recorded loss {worst['loss']:g}"
        return measured, ""


MAX_LOSS = MaxLoss(key="max_loss", value=float, gt=0, kind="max", unit="loss",
                   description="the largest loss any step recorded",
                   doc="Upper bound on the loss of any step.")
'''

JUDGE = '''
import json, sys
from faultlab.judge import judge
from faultlab.observe import FaultRecord, compute_metrics
from faultlab.report._format import sla_bound
from faultlab.spec import experiment_from_dict

def ev(t, kind, **kw):
    return {"t": t, "kind": kind, "pid": 10, "rank": 0, "world_size": 1, **kw}

exp = experiment_from_dict({
    "name": "x", "target": {"trainer": "reference"},
    "faults": [{"id": "kill", "type": "rank_kill", "target": {"rank": 0},
                "trigger": {"at_step": 3}}],
    "expect": {"completes": True, "max_loss": 10}})
fault = [FaultRecord(id="kill#1", type="rank_kill", injected_t=3.5, undone_t=None,
                     target="rank 0", details={})]
out = {}
for name, spike in (("calm", 2.0), ("spike", 50.0), ("silent", None)):
    events = [ev(0, "start", resumed_from_step=0)]
    for s in range(1, 6):
        step = ev(s, "step", step=s, step_time_s=0.1)
        if spike is not None:
            step["loss"] = spike if s == 4 else 1.0 + 0.1 * s
        events.append(step)
    events.append(ev(6, "exit", reason="completed"))
    results = judge(exp, compute_metrics(events, fault), None, timed_out=False, faults=fault,
                    events=events)
    out[name] = [[r.name, r.bound, r.measured, r.passed, r.note, r.describe()]
                 for r in results if r.name == "max_loss"]
out["bound"] = sla_bound("max_loss", 10)
json.dump(out, sys.stdout)
'''


@pytest.fixture(scope="module")
def team_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return team_package(tmp_path_factory.mktemp("site"), "team_slas", TEAM_MODULE,
                        "faultlab.slas", "max_loss = team_slas:MAX_LOSS")


def run(site: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run_with(site, *args, check=check)


def experiment(site: Path, name: str, expect: str) -> Path:
    path = site / name
    path.write_text(textwrap.dedent(f"""\
        name: team
        target: {{trainer: reference}}
        faults:
          - id: kill
            type: rank_kill
            target: {{rank: 0}}
            trigger: {{at_step: 3}}
        expect: {expect}
        """))
    return path


def test_the_builtins_are_entry_points_listed_in_their_declared_order() -> None:
    # every built-in SLA, a campaign's too, is an entry point of faultlab's own distribution
    eps = registry.registered("sla")
    builtin = {k for k, ep in eps.items() if ep.dist is not None and ep.dist.name == "faultlab"}
    declared = {**slas(), **campaign_slas()}
    assert builtin == {k for k, s in declared.items() if type(s).__module__.startswith(
        "faultlab.")} and len(builtin) == 40
    # the order is the declarations' own (order, then key), the built-ins first: no two share
    # a number (the key would then decide, silently)
    for table in (slas(), campaign_slas()):
        assert list(table) == sorted(table, key=lambda k: (table[k].order, k))
    assert len({declared[k].order for k in builtin}) == len(builtin)
    assert list(slas())[:3] == ["completes", "max_restarts", "detection_latency_s"]
    assert list(slas())[-1] == "peers_released_within_s"  # examples/plugin's, after them
    assert list(campaign_slas()) == ["ettr", "detection_rate", "attribution_accuracy",
                                     "false_positives_per_hour", "recovery_time_p95_s"]
    # besides one field per SLA, Expect has detected_by (which signals the detection SLAs count)
    assert list(slas()) == [k for k in Expect.model_fields if k not in ExpectBase.model_fields]
    assert list(ExpectBase.model_fields) == ["detected_by"]
    assert all(isinstance(s, Sla) for s in slas().values())


def test_a_team_sla_validates_and_a_typo_gets_the_closest_key(team_site: Path) -> None:
    good = experiment(team_site, "good.yaml", "{completes: true, max_loss: 10}")
    out = run(team_site, "-m", "faultlab.cli", "validate", str(good))
    assert out.returncode == 0, out.stdout + out.stderr
    typo = experiment(team_site, "typo.yaml", "{max_los: 10}")
    out = run(team_site, "-m", "faultlab.cli", "validate", str(typo), check=False)
    assert out.returncode == 2
    assert "did you mean 'max_loss'?" in out.stdout + out.stderr
    bad = experiment(team_site, "bad.yaml", "{max_loss: -1}")
    out = run(team_site, "-m", "faultlab.cli", "validate", str(bad), check=False)
    assert out.returncode == 2 and "expect.max_loss" in out.stdout + out.stderr
    assert "must be > 0, got -1" in out.stdout + out.stderr


def test_a_team_sla_is_judged_from_the_events(team_site: Path) -> None:
    out = json.loads(run(team_site, "-c", JUDGE).stdout)
    assert out["calm"] == [["max_loss", 10.0, 2.0, True, "",
                            "max_loss: measured 2.0, required <= 10.0"]]
    assert out["spike"] == [["max_loss", 10.0, 50.0, False, "step 4 recorded loss 50",
                             "max_loss: measured 50.0, required <= 10.0 (step 4 recorded loss "
                             "50)"]]
    assert out["silent"][0][2:4] == [None, False]
    assert out["silent"][0][4] == "not measured: the run ended without the events it needs"
    assert out["bound"] == "≤ 10"


def test_a_team_sla_is_listed_documented_and_in_the_schema(team_site: Path) -> None:
    listed = run(team_site, "-m", "faultlab.cli", "list", "slas").stdout
    assert "max_loss  (an upper bound)" in listed
    assert "the largest loss any step recorded" in listed
    assert listed.index("same_resume_point") < listed.index("max_loss")  # after the built-ins
    page = run(team_site, "-c", "from faultlab import reference; "
                                "print(reference.slas_page(), reference.yaml_page())").stdout
    assert "\n### max_loss\n" in page and "| [`max_loss`](#max_loss) | loss | max |" in page
    assert "- **measured by:** `team_slas.MaxLoss.measure`" in page
    assert "| `max_loss` |" in page  # the experiment YAML reference
    schema = json.loads(run(team_site, "-m", "faultlab.cli", "schema").stdout)
    field = schema["$defs"]["Expect"]["properties"]["max_loss"]
    assert field["description"] == "Upper bound on the loss of any step."
    assert {"type": "number", "exclusiveMinimum": 0} in field["anyOf"]


@pytest.mark.parametrize(("entry", "message"), [
    ("max_loss = team_slas:MaxLoss", "is not a faultlab.sla.Sla"),
    ("min_loss = team_slas:MAX_LOSS", "declares key='max_loss'; they must match"),
    ("max_loss = team_slas:NOPE", "failed to import: AttributeError"),
])
def test_a_broken_team_sla_is_an_error(team_site: Path, tmp_path: Path, entry: str,
                                       message: str) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "team_slas.py").write_text(TEAM_MODULE)
    (site / "broken-0.1.dist-info").mkdir()
    (site / "broken-0.1.dist-info" / "METADATA").write_text("Name: broken\nVersion: 0.1\n")
    (site / "broken-0.1.dist-info" / "entry_points.txt").write_text(f"[faultlab.slas]\n{entry}\n")
    out = run(site, "-c", "from faultlab.sla import slas; slas()", check=False)
    assert out.returncode != 0 and message in out.stderr
    # one error path (faultlab.registry): the plugin's distribution, its entry point, the fix
    said = " ".join(out.stderr.split())
    assert f"SLA plugin 'broken 0.1' (entry point {entry} in faultlab.slas)" in said
    assert "or uninstall broken" in said


def test_a_team_sla_may_not_take_a_builtin_key(tmp_path: Path) -> None:
    (tmp_path / "team_slas.py").write_text(TEAM_MODULE.replace('key="max_loss"', 'key="goodput"'))
    (tmp_path / "t-0.1.dist-info").mkdir()
    (tmp_path / "t-0.1.dist-info" / "METADATA").write_text("Name: t\nVersion: 0.1\n")
    (tmp_path / "t-0.1.dist-info" / "entry_points.txt").write_text(
        "[faultlab.slas]\ngoodput = team_slas:MAX_LOSS\n")
    out = run(tmp_path, "-c", "from faultlab.sla import slas; slas()", check=False)
    said = " ".join(out.stderr.split())
    assert "SLA 'goodput' is registered twice: by SLA plugin 'faultlab " in said
    assert "(entry point goodput = faultlab.sla.builtin:GOODPUT in faultlab.slas) and by SLA " \
           "plugin 't 0.1' (entry point goodput = team_slas:MAX_LOSS" in said
