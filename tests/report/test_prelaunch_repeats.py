"""A pre-launch suite run with ``--repeat N``: the experiment's verdict is its set's, the
scorecard shows the stability, and the report carries each SLA's median and tail over the runs
in JSON, Markdown and HTML; the run shown in the plots is the first that failed (synthetic
folders, no job)."""

from __future__ import annotations

import json
from pathlib import Path

from synthetic import ENVIRONMENT, PLAN, Timing, write_run

from faultlab.judge.repeats import parse_pass_rate, summarize
from faultlab.report.prelaunch import SuiteRun
from faultlab.report.repeats import write_record


def _suite_with_a_set(folder: Path, rate: str) -> Path:
    run = SuiteRun(folder, suite_file=Path("experiments/prelaunch.yaml"),
                   suite={"name": "prelaunch", "description": "With repeats.",
                          "experiments": ["rank_kill.yaml"], "plan": PLAN},
                   experiments=[(Path("experiments/rank_kill.yaml"), "rank_kill",
                                 ["rank_kill"])],
                   environment=ENVIRONMENT)
    set_folder = run.runs_dir / "rank_kill-x3-20261124-030000"
    runs, journals = [], []
    # Three runs, the second slower to import torch and judged against a 1 s bound (fails).
    for i, (passed, import_s) in enumerate([(True, 1.8), (False, 4.8), (True, 2.1)], start=1):
        run_folder = set_folder / "runs" / f"rank_kill-20261124-03000{i}"
        journals.append(write_run(run_folder, "rank_kill", passed=passed,
                                  timing=Timing(import_s=import_s)))
        runs.append({"index": i, "run_folder": f"runs/{run_folder.name}",
                     "verdict": journals[-1]["verdict"], "wall_s": 30.0, "error": None})
    summary = summarize(journals, min_pass_rate=parse_pass_rate(rate))
    write_record(set_folder, {"verdict": summary.verdict,
                              "experiment": {"name": "rank_kill", "file": "rank_kill.yaml",
                                             "seed": 0, "description": None},
                              "started_t": 0.0, "ended_t": 90.0, "wall_s": 90.0,
                              "golden": None, "runs": runs, "summary": summary.to_dict()})
    run.ran(0, set_folder, summary.verdict)
    run.finish()
    return folder


def test_a_repeated_experiment_is_judged_by_its_set(tmp_path: Path) -> None:
    folder = _suite_with_a_set(tmp_path / "prelaunch-20261124-030000", rate="60%")
    report = json.loads((folder / "report.json").read_text())
    exp = report["experiments"][0]
    assert report["verdict"] == "pass" and exp["verdict"] == "pass"  # 2/3 meets 60%
    assert exp["repeats"]["stability"] == "2/3 passed (67%; required 2, min pass rate 60%)"
    # the run shown stands for the set's worst: the one that failed
    assert exp["repeats"]["shown_run"].endswith("/runs/rank_kill-20261124-030002")
    assert exp["run_folder"].endswith("rank_kill-x3-20261124-030000")
    assert report["scorecard"][0]["repeats"]["num_passed"] == 2
    recovery = {s["name"]: s for s in exp["repeats"]["slas"]}["recovery_time_s"]
    assert recovery["num_passed"] == 2 and recovery["tail"] > recovery["median"] > 0

    md = (folder / "report.md").read_text()
    assert "| rank_kill | PASS (2/3) | " in md
    assert f"recovery_time_s median {recovery['median']:.2f} s, p95 {recovery['tail']:.2f} s " \
           f"(≤ 40.00 s) 2/3" in md
    assert "Over 3 runs: 2/3 passed (67%; required 2, min pass rate 60%)." in md
    html = (folder / "report.html").read_text()
    assert "PASS (2/3)" in html and f"p95 {recovery['tail']:.2f} s" in html


def test_the_same_set_fails_when_every_run_must_pass(tmp_path: Path) -> None:
    folder = _suite_with_a_set(tmp_path / "prelaunch-20261124-030000", rate="100%")
    report = json.loads((folder / "report.json").read_text())
    assert report["verdict"] == "fail"
    families = {f["family"]: f["verdict"] for f in report["families"]}
    assert families["process"] == "fail"  # rank_kill's family follows the set
    assert "| rank_kill | FAIL (2/3) | " in (folder / "report.md").read_text()
