"""A team's campaign SLA, registered under the ``faultlab.slas`` entry-point group as a
``faultlab.sla.CampaignSla``, is a campaign SLA like the built-ins (``ettr`` ...): a campaign's
``expect`` takes it (validated, located), an experiment's does not, ``judge_campaign`` judges it
against the campaign's score, and the SLA reference and the verdict's bound show it.

The team's package is a tiny distribution in a temporary site directory (``team_site``), and
faultlab runs in a subprocess with it on its path, since the registry is read once per process.
The score is a real one: ``score_campaign`` over the kill timeline of ``test_campaign``.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.unit.team_site import run_with, team_package

REPO = Path(__file__).resolve().parents[2]

TEAM_MODULE = '''
from dataclasses import dataclass

from faultlab.sla import CampaignSla


@dataclass(frozen=True, kw_only=True)
class WorstLostSteps(CampaignSla):
    def measure_score(self, score):
        lost = [i.lost_steps for i in score.injections if i.lost_steps is not None]
        return max(lost) if lost else None


WORST_LOST_STEPS = WorstLostSteps(
    key="worst_lost_steps", value=int, ge=0, kind="max", unit="steps",
    unmeasured="no injection took the job down",
    description="the most steps one injection cost",
    doc="Upper bound on the steps any one injection cost.")
'''

CAMPAIGN = """\
name: team_campaign
seed: 7
target: {{trainer: reference, preset: tiny}}
topology: {{nodes: 2, procs_per_node: 1}}
run: {{steps: 40, checkpoint_every: 5, timeout_s: 100}}
campaign:
  mtbf_steps: 12
  mix:
    - {{type: rank_kill, weight: 1, target: random}}
expect: {expect}
"""

JUDGE = f'''
import json, sys
sys.path.insert(0, {str(REPO)!r})
from faultlab.engine.campaign import judge_campaign
from faultlab.observe.records import FaultRecord
from faultlab.report._format import sla_bound
from faultlab.spec import load_document
from tests.unit.test_campaign import kill_timeline, score

kill = FaultRecord(id="c000-rank_kill", type="rank_kill", injected_t=20.0, target="rank 1")
s = score(kill_timeline(), [kill])
out = {{"lost": [i.lost_steps for i in s.injections], "bound": sla_bound("worst_lost_steps", 4)}}
for name in ("tight.yaml", "loose.yaml"):
    campaign = load_document(name)
    out[name] = [[r.name, r.bound, r.measured, r.passed, r.note]
                 for r in judge_campaign(campaign, s)]
nothing = score(kill_timeline()[:5], [])
out["unmeasured"] = [[r.name, r.measured, r.passed, r.note]
                     for r in judge_campaign(load_document("loose.yaml"), nothing)]
json.dump(out, sys.stdout)
'''


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = team_package(tmp_path_factory.mktemp("site"), "team_campaign_slas", TEAM_MODULE,
                        "faultlab.slas", "worst_lost_steps = team_campaign_slas:WORST_LOST_STEPS")
    for name, expect in (("tight.yaml", "{completes: true, ettr: 0.1, worst_lost_steps: 4}"),
                         ("loose.yaml", "{worst_lost_steps: 6}"),
                         ("typo.yaml", "{worst_lost_step: 6}"),
                         ("negative.yaml", "{worst_lost_steps: -1}")):
        (site / name).write_text(CAMPAIGN.format(expect=expect))
    (site / "experiment.yaml").write_text(textwrap.dedent("""\
        name: not_a_campaign
        target: {trainer: reference}
        expect: {completes: true, worst_lost_steps: 6}
        """))
    return site


def test_a_team_campaign_sla_is_judged_against_the_campaigns_score(site: Path) -> None:
    run = run_with(site, "-c", JUDGE, check=False)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["lost"] == [5]  # the kill cost steps 6..10, redone after resuming from 5
    # the campaign's own SLAs in their declared order: the built-ins (order 510 ...), then the
    # team's (order 1000 by default)
    assert [r[0] for r in out["tight.yaml"]] == ["ettr", "worst_lost_steps"]
    assert out["tight.yaml"][1] == ["worst_lost_steps", 4, 5, False, ""]
    assert out["loose.yaml"] == [["worst_lost_steps", 6, 5, True, ""]]
    assert out["unmeasured"] == [["worst_lost_steps", None, False,
                                  "no injection took the job down"]]
    assert out["bound"] == "≤ 4"


def test_a_team_campaign_sla_validates_with_locations_and_only_in_a_campaign(
        site: Path) -> None:
    ok = run_with(site, "-m", "faultlab.cli", "validate", "loose.yaml", check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    for name, said in (("typo.yaml", "did you mean 'worst_lost_steps'?"),
                       ("negative.yaml", "must be >= 0, got -1"),
                       ("experiment.yaml", "worst_lost_steps")):
        out = run_with(site, "-m", "faultlab.cli", "validate", name, check=False)
        text = " ".join((out.stdout + out.stderr).split())
        assert out.returncode == 2 and said in text, text
        assert f"{name}:" in text  # located in the file
    page = run_with(site, "-c", "from faultlab import reference; "
                                "print(reference.slas_page())").stdout
    campaign_part = page[page.index("\n## Campaign SLAs\n"):]
    assert "\n### worst_lost_steps\n\nthe most steps one injection cost.\n" in campaign_part
    assert "\n### worst_lost_steps\n" not in page[:page.index("\n## Campaign SLAs\n")]
