"""`faultlab run` on a suite of one shipped experiment, end to end: one report folder, built
from the real run's journal and events, and re-rendered by `faultlab report`. The whole
pre-launch suite runs in `make demo`.

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

from faultlab.observe.phases import PHASES
from faultlab.report.prelaunch import REPORT_FILES
from faultlab.runtime.events import read_events
from faultlab.testing import assert_no_job_processes

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]


def faultlab(*args: str | Path) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "faultlab.cli", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=280,
                          env={**os.environ, "COLUMNS": "200"})
    return proc.returncode, proc.stdout + proc.stderr


def test_a_one_experiment_suite_writes_one_report_folder(tmp_path: Path,
                                                         golden_cache: Path) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"""\
suite:
  name: smoke
  experiments: [{REPO / "experiments" / "rank_hang.yaml"}]
  plan: {{num_gpus: 64, gpus_per_node: 8, mtbf_per_node_h: 2000, step_time_s: 2,
          checkpoint_size_gb: 50, storage_bandwidth_gb_s: 5}}
""")
    reports = tmp_path / "reports"
    rc, out = faultlab("run", suite, "--report-dir", reports, "--golden-cache", golden_cache)
    assert rc == 0, out
    [folder] = reports.glob("smoke-*")
    assert "pre-launch report: PASS" in out and str(folder / "report.html") in out
    [run] = (folder / "runs").iterdir()
    assert run.name.split("-")[0] == "rank_hang"
    report = json.loads((folder / "report.json").read_text())
    assert report["verdict"] == "pass"
    [row] = report["recovery"]["rows"]
    assert list(row["phases"]) == list(PHASES)
    assert all(v is not None and v >= 0 for v in row["phases"].values())
    assert sum(row["phases"].values()) == pytest.approx(row["recovery_time_s"])
    cost = report["checkpoint_cost"]
    assert cost["num_saves"] >= 4 and cost["size_on_disk_bytes"]["median"] > 1_000_000
    assert report["projection"]["results"]["goodput"] > 0
    assert report["experiments"][0]["loss"]["golden"]  # rank_hang asserts bitwise equality

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
