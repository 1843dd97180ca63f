"""`faultlab run SUITE` end to end on a suite of one cheap shipped experiment (rank_kill): one
report folder, built from the real run's journal and events, and re-rendered by `faultlab
report`. The golden run comes from the session's golden-run cache (tests/conftest.py), shared
with tests/integration; the whole pre-launch suite runs in `make demo`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from faultlab.observe.phases import PHASES
from faultlab.report.prelaunch import REPORT_FILES
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
  experiments: [{REPO / "experiments" / "rank_kill.yaml"}]
  plan: {{num_gpus: 64, gpus_per_node: 8, mtbf_per_node_h: 2000, step_time_s: 2,
          checkpoint_size_gb: 50, storage_bandwidth_gb_s: 5}}
""")
    reports = tmp_path / "reports"
    rc, out = faultlab("run", suite, "--report-dir", reports, "--golden-cache", golden_cache)
    assert rc == 0, out
    [folder] = reports.glob("smoke-*")
    assert "pre-launch report: PASS" in out and str(folder / "report.html") in out
    assert [p.name.split("-")[0] for p in (folder / "runs").iterdir()] == ["rank_kill"]
    report = json.loads((folder / "report.json").read_text())
    assert report["verdict"] == "pass"
    [row] = report["recovery"]["rows"]
    assert list(row["phases"]) == list(PHASES)
    assert all(v is not None and v >= 0 for v in row["phases"].values())
    assert sum(row["phases"].values()) == pytest.approx(row["recovery_time_s"])
    cost = report["checkpoint_cost"]
    assert cost["num_saves"] >= 4 and cost["size_on_disk_bytes"]["median"] > 1_000_000
    assert report["projection"]["results"]["goodput"] > 0
    assert report["experiments"][0]["loss"]["golden"]  # rank_kill asserts bitwise equality

    before = (folder / "report.md").read_text()
    rc, out = faultlab("report", folder)
    assert rc == 0, out
    assert all((folder / name).is_file() for name in REPORT_FILES)
    assert (folder / "report.md").read_text().split("## Scorecard")[1] == \
        before.split("## Scorecard")[1]
    assert_no_job_processes(reports)
