"""`faultlab sweep` end to end: the shipped straggler experiment at two slowdowns, through the
real CLI and real jobs. The reference trainer's straggler monitor names a 3x straggler and
misses a 1.2x one (below its threshold); the curve says so, and the fault-free golden run is
computed once, whatever the number of points.

One test, two runs (about 30 CPU-seconds; the golden run is the shipped experiment's, shared
through the session's cache with its pytest item)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from faultlab.report.journal import read_journal

pytestmark = [pytest.mark.integration, pytest.mark.timeout(3 * 240 + 120)]
"""A golden run and two runs, each bounded by the experiment's run.timeout_s (240 s)."""

REPO = Path(__file__).resolve().parents[2]
STRAGGLER = REPO / "experiments" / "gpu_slow_straggler.yaml"


def test_a_straggler_sweep_finds_the_monitor_threshold(tmp_path: Path,
                                                       golden_cache: Path) -> None:
    out = tmp_path / "sweep"
    proc = subprocess.run(
        [sys.executable, "-m", "faultlab.cli", "sweep", str(STRAGGLER),
         "--param", "faults[slow-gpu-rank-1].params.factor", "--values", "1.2,3",
         "--out", str(out), "--golden-cache", str(golden_cache)],
        cwd=REPO, capture_output=True, text=True, timeout=3 * 240 + 60,
        env={**os.environ, "COLUMNS": "200"})
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said  # a measurement: the 1.2x point's failed SLA is no error
    record = json.loads((out / "sweep.json").read_text())
    assert [p["value"] for p in record["points"]] == [1.2, 3]
    journals = [read_journal(out / p["run_folder"]) for p in record["points"]]
    # Each point ran its own value, against one golden run that the second read from the cache.
    assert [j["experiment"]["document"]["faults"][0]["params"]["factor"] for j in journals] \
        == [1.2, 3.0]
    assert journals[0]["golden"]["key"] == journals[1]["golden"]["key"]
    assert journals[1]["golden"]["cached"] is True
    # The reference trainer's monitor: 1.2x below its threshold, 3x named, rank 1 exactly.
    slow, fast = (next((s for s in p["signals"] if s["name"] == "anomaly:straggler"), None)
                  for p in record["points"])
    assert all(p["measured"] for p in record["points"]), record["points"]
    assert slow is None or not slow["detected"], slow
    assert fast is not None and fast["detected"] and fast["attribution"] == "exact", fast
    assert fast["ranks"] == [1] and fast["within_steps"] is not None
    (threshold,) = (t for t in record["thresholds"] if t["signal"] == "anomaly:straggler")
    assert threshold["first_noticed"] == 3 and threshold["monotone"]
    assert "anomaly:straggler: noticed from 3 on" in said
    assert (out / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert "| 1.2 | fail |" in (out / "sweep.md").read_text()
