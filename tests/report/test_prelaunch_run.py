"""`faultlab run` on a suite of two shipped experiments, one of them a campaign, end to end: one
report folder, built from the real runs' journals and events, and re-rendered by `faultlab
report`. The whole pre-launch suite runs in `make demo`.

The campaign is experiments/campaign_reference.yaml, which `make test` runs here instead of as
an item of its own (the Makefile's SHIPPED list leaves it out): its verdict must be pass in the
suite's report, and its section is checked against the scores its comment gives (its schedule's
seed 36 on the step clock: 5 arrivals of every type, 4 detected, 3 of 4 attributed, 13 steps
lost, no false positive, the same under any load). A tiny campaign of one arrival ran here
before, beside that item: one more faulted run of 100 steps (about 20 CPU-s) for what the
shipped campaign shows as well.

The experiment is rank_hang (SIGSTOP rank 1; the trainer's watchdog must notice). The same run
is also where the trainer's watchdog is checked against a real job (its records and stack
dump), and where a shipped experiment's journal is checked through the CLI: one run of this job
is enough for all three. The campaign's job is rank_hang's (seed 0, 40 steps; its schedule has
a seed of its own, campaign.seed). The golden runs come from the session's golden-run cache
(tests/conftest.py): rank_hang's is that of 15 more shipped experiments of the job, and the
campaign's, which counts its alarms, that of the straggler experiments, which count them too
with the same monitor settings (faultlab.engine.golden.golden_key).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from markupsafe import escape
from pytest_faultlab._items import hang_guard_s

from faultlab.observe.phases import PHASES
from faultlab.report.prelaunch import REPORT_FILES
from faultlab.runtime.events import read_events
from faultlab.spec import load_campaign, load_experiment
from faultlab.testing import assert_no_job_processes

REPO = Path(__file__).resolve().parents[2]
RANK_HANG = REPO / "experiments" / "rank_hang.yaml"
CAMPAIGN = REPO / "experiments" / "campaign_reference.yaml"

# each run and golden run bounded by its experiment's own run.timeout_s (hang_guard_s), and the
# two experiments of the suite run one after the other
GUARD_S = (hang_guard_s(load_experiment(RANK_HANG))
           + hang_guard_s(load_campaign(CAMPAIGN)[0], campaign=True))  # type: ignore[index]

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(GUARD_S + 60)]


Cli = Callable[..., tuple[int, str]]
"""The ``cli`` fixture (tests/conftest.py): ``faultlab ARGS`` in this process."""


# campaign_reference's job (seed, steps, checkpoint interval, topology), so its golden run is
# the one the suite computed (cached: nothing launches), with a rate on
# the wall clock that leaves no step room; `mtbf_s` on line 7
TOO_FAST = """\
name: too_fast
seed: 0
target: {trainer: reference, preset: tiny}
topology: {nodes: 2, procs_per_node: 1}
run: {steps: 40, checkpoint_every: 10, timeout_s: 300}
campaign:
  mtbf_s: 0.01         # the wall clock: checked against the golden run's step time
  duration_s: 15
  mix:
    - {type: rank_kill, weight: 1, params: {signal: KILL}}
expect:
  completes: true
  detection_rate: 1
  ettr: 0.05
"""


def test_a_one_experiment_suite_writes_one_report_folder(tmp_path: Path, golden_cache: Path,
                                                         cli: Cli) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"""\
suite:
  name: smoke
  experiments: [{RANK_HANG}, {CAMPAIGN}]
  plan: {{num_gpus: 64, gpus_per_node: 8, mtbf_per_node_h: 2000, step_time_s: 2,
          checkpoint_size_gb: 50, storage_bandwidth_gb_s: 5}}
""")
    reports = tmp_path / "reports"
    rc, out = cli("run", suite, "--report-dir", reports, "--golden-cache", golden_cache)
    assert rc == 0, out
    [folder] = reports.glob("smoke-*")
    assert "pre-launch report: PASS" in out and str(folder / "report.html") in out
    camp_run, run = sorted((folder / "runs").iterdir())  # campaign_reference-..., rank_hang-...
    assert (run.name.split("-")[0], camp_run.name.split("-")[0]) == ("rank_hang",
                                                                      "campaign_reference")
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
    rc, out = cli("report", folder)
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

    check_a_refused_rate_fails_its_entry_only(tmp_path, golden_cache, cli)


def check_campaign_section(folder: Path, report: dict, camp_run: Path) -> None:  # type: ignore[type-arg]
    """The campaign's row and section carry its real figures, the same in all three files."""
    from faultlab.report.campaign import summary_rows

    row = next(r for r in report["scorecard"] if r["experiment"] == "campaign_reference")
    assert (row["kind"], row["verdict"]) == ("campaign", "pass")
    assert {s["name"] for s in row["slas"]} >= {"completes", "detection_rate", "ettr",
                                                "attribution_accuracy"}
    assert row["report_html"] == f"runs/{camp_run.name}/report.html"
    [section] = [e for e in report["experiments"] if e["kind"] == "campaign"]
    journal = json.loads((camp_run / "journal.json").read_text())
    assert section["campaign"] == journal["campaign"]  # the journal's object, whole
    score = section["campaign"]["score"]
    # the scores campaign_reference.yaml's comment gives, fixed by its seed and the step clock:
    # 5 of 5 injected, one compound (a rank_kill drawn onto the io_error's step 22), detected
    # 4 of 5 (that kill's reaction is the io_error's), attributed 3 of 4 (a NaN gradient names
    # no rank under FSDP2), 13 steps lost, no false positive, and the job came back from each
    # and finished
    assert (score["scheduled"], score["injected"], score["compound"]) == (5, 5, 1)
    injections = score["injections"]
    assert [(i["type"], i["at_step"], i["detected"], i["attributed"]) for i in injections] == [
        ("grad_nan", 13, True, False), ("collective_error", 19, True, True),
        ("io_error", 22, False, None), ("rank_kill", 22, True, True), ("gpu_oom", 32, True, True)]
    assert score["lost_steps"] == 13
    assert score["detection_rate"] == pytest.approx(4 / 5, abs=1e-4)  # the journal's 4 digits
    assert score["attribution_accuracy"] == pytest.approx(3 / 4, abs=1e-4)
    assert 0 < score["ettr"] < 1 and score["false_positives"] == 0
    mix = {"rank_kill", "grad_nan", "collective_error", "io_error", "gpu_oom"}
    assert {i["type"] for i in injections} == mix  # every type
    marked = section["campaign"]["marked"]
    assert sorted(m["fault_id"] for m in marked) == \
        sorted(i["fault_id"] for i in injections)
    assert all(m["t"] > 0 for m in marked)
    assert section["campaign"]["series"]["steps"][-1][1] == 40  # rank 0 reached the end
    headline = dict(summary_rows(score))
    md = (folder / "report.md").read_text().split("## campaign_reference: PASS")[1]
    html = (folder / "report.html").read_text().split('id="exp-campaign_reference"')[1]
    for label in ("ETTR measured", "ETTR projected", "gap (projected − measured)",
                  "detection rate", "false positives", "recovery p50 / p95"):
        assert f"| {label} | {headline[label]} |" in md
        assert f"<th>{label}</th><td>{escape(headline[label])}</td>" in html
    assert "#### Per fault type" in md and all(f"\n| {kind} | " in md for kind in mix)
    assert "<svg" in html and all(m["fault_id"] in html.split("</svg>")[0] for m in marked)
    assert f'<a href="runs/{camp_run.name}/report.html">' in html
    assert (camp_run / "report.html").is_file()


def check_a_refused_rate_fails_its_entry_only(tmp_path: Path, golden_cache: Path,
                                              cli: Cli) -> None:
    """A campaign whose rate leaves no step room (known only once its golden run measured
    the step time; here campaign_reference's, cached, so nothing launches)
    fails its entry with the located reason; the suite still writes its report instead of
    stopping."""
    camp = tmp_path / "too_fast.yaml"
    camp.write_text(TOO_FAST)
    suite = tmp_path / "refused.yaml"
    suite.write_text("""\
suite:
  name: refused
  experiments: [too_fast.yaml]
  plan: {num_gpus: 64, gpus_per_node: 8, mtbf_per_node_h: 2000, step_time_s: 2,
         checkpoint_size_gb: 50, storage_bandwidth_gb_s: 5}
""")
    reports = tmp_path / "refused-reports"
    rc, out = cli("run", suite, "--report-dir", reports, "--golden-cache", golden_cache)
    assert rc == 1, out
    [folder] = reports.glob("refused-*")
    assert not any((folder / "runs").iterdir())  # nothing launched
    report = json.loads((folder / "report.json").read_text())
    [row] = report["scorecard"]
    assert (row["kind"], row["verdict"], report["verdict"]) == ("campaign", "fail", "fail")
    assert row["error"].startswith(f"{camp}:7 campaign.mtbf_s: 0.01 s between faults is not "
                                   f"longer than one training step")
    assert "invalid campaign" in out and "pre-launch report: FAIL" in out
