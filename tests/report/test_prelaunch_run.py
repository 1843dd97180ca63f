"""`faultlab run` on a suite of one shipped experiment and one tiny campaign, end to end: one
report folder, built from the real runs' journals and events, and re-rendered by `faultlab
report`. The whole pre-launch suite runs in `make demo`.

The campaign is the least a campaign can be: one arrival (a SIGKILL of rank 1 after step 12, on the
step clock, so it meets the job at the same point under any load). Its seed, steps, checkpoint
interval and topology are campaign_reference.yaml's, so its golden run is the one that shipped item
runs (the session's cache): it costs one faulted run of 100 tiny steps.

The experiment is rank_hang (SIGSTOP rank 1; the trainer's watchdog must notice). The same run
is also where the trainer's watchdog is checked against a real job (its records and stack
dump), and where a shipped experiment's journal is checked through the CLI: `make test` runs
each shipped experiment once more as a pytest item, and one run of this job is enough for all
three. The golden run comes from the session's golden-run cache (tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from markupsafe import escape

from faultlab.observe.phases import PHASES
from faultlab.report.prelaunch import REPORT_FILES
from faultlab.runtime.events import read_events
from faultlab.testing import assert_no_job_processes

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(480)]

REPO = Path(__file__).resolve().parents[2]


def faultlab(*args: str | Path) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "faultlab.cli", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=460,
                          env={**os.environ, "COLUMNS": "200"})
    return proc.returncode, proc.stdout + proc.stderr


# seed 36 with campaign_reference's rate and start: its first arrival, after step 12 on rank 1,
# and no other before step 20.
TINY_CAMPAIGN = """\
name: tiny_campaign
seed: 36
target: {trainer: reference, preset: tiny}
topology: {nodes: 2, procs_per_node: 1}
run: {steps: 100, checkpoint_every: 10, timeout_s: 150}
campaign:
  mtbf_steps: 14        # seed 36: one arrival, a kill of rank 1 after step 12
  start_after_step: 5
  until_step: 20
  mix:
    - {type: rank_kill, weight: 1, params: {signal: KILL}}
expect:
  completes: true
  detection_rate: 1
  ettr: 0.05
"""


def test_a_one_experiment_suite_writes_one_report_folder(tmp_path: Path,
                                                         golden_cache: Path) -> None:
    suite = tmp_path / "suite.yaml"
    (tmp_path / "tiny_campaign.yaml").write_text(TINY_CAMPAIGN)
    suite.write_text(f"""\
suite:
  name: smoke
  experiments: [{REPO / "experiments" / "rank_hang.yaml"}, tiny_campaign.yaml]
  plan: {{num_gpus: 64, gpus_per_node: 8, mtbf_per_node_h: 2000, step_time_s: 2,
          checkpoint_size_gb: 50, storage_bandwidth_gb_s: 5}}
""")
    reports = tmp_path / "reports"
    rc, out = faultlab("run", suite, "--report-dir", reports, "--golden-cache", golden_cache)
    assert rc == 0, out
    [folder] = reports.glob("smoke-*")
    assert "pre-launch report: PASS" in out and str(folder / "report.html") in out
    run, camp_run = sorted((folder / "runs").iterdir())  # rank_hang-..., tiny_campaign-...
    assert (run.name.split("-")[0], camp_run.name.split("-")[0]) == ("rank_hang",
                                                                      "tiny_campaign")
    report = json.loads((folder / "report.json").read_text())
    assert report["verdict"] == "pass"
    [row] = report["recovery"]["rows"]  # rank_hang's: the campaign's stays out of it
    assert list(row["phases"]) == list(PHASES)
    assert all(v is not None and v >= 0 for v in row["phases"].values())
    assert sum(row["phases"].values()) == pytest.approx(row["recovery_time_s"])
    cost = report["checkpoint_cost"]
    assert cost["num_saves"] >= 4 and cost["size_on_disk_bytes"]["median"] > 1_000_000
    assert report["projection"]["results"]["goodput"] > 0
    assert report["experiments"][0]["loss"]["golden"]  # rank_hang asserts bitwise equality
    check_campaign_section(folder, report, camp_run)

    before = (folder / "report.md").read_text()
    rc, out = faultlab("report", folder)
    assert rc == 0, out
    assert all((folder / name).is_file() for name in REPORT_FILES)
    assert (folder / "report.md").read_text().split("## Scorecard")[1] == \
        before.split("## Scorecard")[1]
    assert_no_job_processes(reports)

    # The experiment's own journal and report, as a single `faultlab run` writes them.
    journal = json.loads((run / "journal.json").read_text())
    assert journal["schema_version"] == 1 and journal["verdict"] == "pass"
    assert all(s["passed"] for s in journal["slas"])  # bitwise equal to golden among them
    [fault] = journal["faults"]
    assert fault["injected_t"] > 0 and fault["error"] is None
    assert fault["undone_t"] - fault["injected_t"] < 60  # continued once the job reacted
    assert "# rank_hang: PASS" in (run / "report.md").read_text()

    # The trainer's watchdog: rank 0, blocked on the frozen rank, noticed within watchdog_s
    # plus one check interval and scheduling slack of its last step, dumped every thread's
    # stack and exited, so the job restarted.
    watchdog_s = journal["experiment"]["document"]["target"]["overrides"]["watchdog_s"]
    job = Path(journal["run"]["job_dir"])
    events = read_events(job / "events")
    fired = [e for e in events if e["kind"] == "anomaly" and e["what"] == "watchdog"
             and e["rank"] == 0]
    assert fired and fired[0]["idle_s"] >= watchdog_s
    last_step = max(e["t"] for e in events
                    if e["kind"] == "step" and e["rank"] == 0 and e["t"] < fired[0]["t"])
    assert fired[0]["t"] - last_step <= watchdog_s + 2.0
    assert "most recent call first" in "\n".join(
        p.read_text() for p in (job / "logs").glob("node*.log"))

    check_a_refused_rate_fails_its_entry_only(tmp_path, golden_cache)


def check_campaign_section(folder: Path, report: dict, camp_run: Path) -> None:  # type: ignore[type-arg]
    """The campaign's row and section carry its real figures, the same in all three files."""
    from faultlab.report.campaign import summary_rows

    row = next(r for r in report["scorecard"] if r["experiment"] == "tiny_campaign")
    assert (row["kind"], row["verdict"]) == ("campaign", "pass")
    assert {s["name"] for s in row["slas"]} >= {"completes", "detection_rate", "ettr"}
    assert row["report_html"] == f"runs/{camp_run.name}/report.html"
    [section] = [e for e in report["experiments"] if e["kind"] == "campaign"]
    journal = json.loads((camp_run / "journal.json").read_text())
    assert section["campaign"] == journal["campaign"]  # the journal's object, whole
    score = section["campaign"]["score"]
    # one arrival, a SIGKILL: injected, detected, and the job came back and finished
    assert (score["scheduled"], score["injected"], score["detection_rate"]) == (1, 1, 1.0)
    [inj] = score["injections"]
    assert inj["fault_id"] == "c000-rank_kill" and inj["recovered"] is True
    assert (inj["at_step"], inj["named_ranks"][0], inj["attributed"]) == (12, 1, True)
    assert 0 < score["ettr"] < 1 and score["false_positives"] == 0
    [marked] = section["campaign"]["marked"]
    assert marked["fault_id"] == "c000-rank_kill" and marked["t"] > 0
    assert section["campaign"]["series"]["steps"][-1][1] == 100  # rank 0 reached the end
    headline = dict(summary_rows(score))
    md = (folder / "report.md").read_text().split("## tiny_campaign: PASS")[1]
    html = (folder / "report.html").read_text().split('id="exp-tiny_campaign"')[1]
    for label in ("ETTR measured", "ETTR projected", "gap (projected − measured)",
                  "detection rate", "false positives", "recovery p50 / p95"):
        assert f"| {label} | {headline[label]} |" in md
        assert f"<th>{label}</th><td>{escape(headline[label])}</td>" in html
    assert "#### Per fault type" in md and "| rank_kill | 1 | 1/1 (100%) |" in md
    assert "<svg" in html and "c000-rank_kill" in html.split("</svg>")[0]
    assert f'<a href="runs/{camp_run.name}/report.html">' in html
    assert (camp_run / "report.html").is_file()


def check_a_refused_rate_fails_its_entry_only(tmp_path: Path, golden_cache: Path) -> None:
    """A campaign whose rate leaves no step room (known only once its golden run measured
    the step time; here the tiny campaign's, cached, so nothing launches) fails its entry with
    the located reason; the suite still writes its report instead of stopping."""
    camp = tmp_path / "too_fast.yaml"
    camp.write_text(TINY_CAMPAIGN.replace("name: tiny_campaign", "name: too_fast").replace(
        "  mtbf_steps: 14        # seed 36: one arrival, a kill of rank 1 after step 12\n"
        "  start_after_step: 5\n  until_step: 20\n",
        "  mtbf_s: 0.01         # the wall clock: checked against the golden run's step time\n"
        "  duration_s: 15\n"))
    suite = tmp_path / "refused.yaml"
    suite.write_text("""\
suite:
  name: refused
  experiments: [too_fast.yaml]
  plan: {num_gpus: 64, gpus_per_node: 8, mtbf_per_node_h: 2000, step_time_s: 2,
         checkpoint_size_gb: 50, storage_bandwidth_gb_s: 5}
""")
    reports = tmp_path / "refused-reports"
    rc, out = faultlab("run", suite, "--report-dir", reports, "--golden-cache", golden_cache)
    assert rc == 1, out
    [folder] = reports.glob("refused-*")
    assert not any((folder / "runs").iterdir())  # nothing launched
    report = json.loads((folder / "report.json").read_text())
    [row] = report["scorecard"]
    assert (row["kind"], row["verdict"], report["verdict"]) == ("campaign", "fail", "fail")
    assert row["error"].startswith(f"{camp}:7 campaign.mtbf_s: 0.01 s between faults is not "
                                   f"longer than one training step")
    assert "invalid campaign" in out and "pre-launch report: FAIL" in out
