"""The shipped Chaos Toolkit experiments through the real ``chaos run`` CLI, against real jobs.

One run must complete without deviation, its variant with an impossible SLA must deviate;
after each, no process of the job may be left. Both run in a temporary working directory (the
run context puts the job under ``reports/chaos`` there) and share one golden-run cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from faultlab.testing import assert_no_job_processes

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = REPO / "experiments" / "chaostoolkit"
CHAOS = Path(sys.executable).parent / "chaos"

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def chaos_run(experiment: Path, cwd: Path, golden_cache: Path) -> tuple[dict[str, Any], str]:
    """``chaos run EXPERIMENT`` in ``cwd``; its journal and its output."""
    journal = cwd / "journal.json"
    proc = subprocess.run(
        [str(CHAOS), "--no-version-check", "--no-log-file", "run", "--journal-path",
         str(journal), str(experiment)], cwd=cwd, capture_output=True, text=True, timeout=540,
        env={**os.environ, "FAULTLAB_GOLDEN_CACHE": str(golden_cache), "PYTHONUNBUFFERED": "1"})
    out = proc.stdout + proc.stderr
    assert journal.exists(), f"chaos run wrote no journal (exit {proc.returncode}):\n{out}"
    return json.loads(journal.read_text()), out


def outputs(journal: dict[str, Any]) -> dict[str, Any]:
    return {r["activity"]["name"]: r.get("output") for r in journal["run"]}


def test_rank_kill_experiment_completes_without_deviation(tmp_path: Path,
                                                          golden_cache: Path) -> None:
    journal, out = chaos_run(EXPERIMENTS / "rank_kill.json", tmp_path, golden_cache)
    assert journal["status"] == "completed" and journal["deviated"] is False, out
    assert "Experiment ended with status: completed" in out
    ran = outputs(journal)
    assert ran["kill-rank-1"]["type"] == "rank_kill"
    assert ran["job-completes"] is True
    assert ran["latest-checkpoint-valid"] is True
    assert ran["final-state-equals-golden"] is True, out
    after = journal["steady_states"]["after"]
    assert after["steady_state_met"] is True
    assert "faultlab run context: stopped the job" in out
    assert_no_job_processes(tmp_path)


def test_impossible_sla_makes_chaos_report_the_deviation(tmp_path: Path,
                                                         golden_cache: Path) -> None:
    journal, out = chaos_run(EXPERIMENTS / "rank_kill_deviation.json", tmp_path, golden_cache)
    assert journal["deviated"] is True, out
    assert "Experiment ended with status: deviated" in out
    [failed] = [p for p in journal["steady_states"]["after"]["probes"] if not p["tolerance_met"]]
    assert failed["activity"]["name"] == "recovered-within-0.01s" and failed["output"] is False
    assert "recovered_within: after rank_kill-1 (rank_kill on rank 0) the job" in out
    assert_no_job_processes(tmp_path)  # the run context stopped the job despite the deviation
