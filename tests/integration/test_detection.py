"""Declared detection signals on a real job: the reference trainer with a collective_delay
straggler on rank 1 (experiments/collective_delay_straggler.yaml's fault), judged by the
trainer's own straggler anomaly (``anomaly:straggler``) and by two declared signals the engine
watches live: a file that appears (the step-20 checkpoint, which the fault-free golden run
writes too: a false alarm, counted on the cached golden run with the signals as they are now)
and a log pattern nothing prints. One run and its golden run (cached, shared with the shipped
experiment's key)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from faultlab.testing import assert_no_job_processes

pytestmark = [pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]

EXPERIMENT = r"""
name: straggler_detections
seed: 0
target: {trainer: reference, preset: tiny}
topology: {nodes: 2, procs_per_node: 1}
run: {steps: 40, checkpoint_every: 10, timeout_s: 240}
observe:
  detections:
    - name: ckpt20
      file: 'checkpoints/step_00000020'
    - name: sdc_line
      log_pattern: 'SDC: fingerprint of rank (?P<rank>\d+) disagrees'
faults:
  - id: slow-rank-1
    type: collective_delay
    target: {rank: 1}
    trigger: {at_step: 10}
    params: {delay_ms: 150, ops: [all_reduce], num_steps: 12}
expect:
  completes: true
  detected_by: ['anomaly:straggler']
  straggler_detected_within_s: {s: 1, cold_starts: 1}
  detected_within_steps: 11         # named inside the fault's 12-step window
  detection_attributed: true
  false_alarms: 0
"""


def test_a_straggler_is_scored_by_the_declared_signals(tmp_path: Path,
                                                       golden_cache: Path) -> None:
    exp = tmp_path / "straggler_detections.yaml"
    exp.write_text(EXPERIMENT)
    proc = subprocess.run([sys.executable, "-m", "faultlab.cli", "run", str(exp),
                           "--report-dir", str(tmp_path / "reports"),
                           "--golden-cache", str(golden_cache)],
                          cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    (folder,) = (tmp_path / "reports").glob("straggler_detections-*")
    journal = json.loads((folder / "journal.json").read_text())
    section = journal["detection"]
    onset = section["onset"]
    assert (onset["fault_id"], onset["ranks"], onset["step"]) == ("slow-rank-1", [1], 10)
    signals = {s["name"]: s for s in section["signals"]}
    straggler = signals["anomaly:straggler"]
    assert straggler["detected"] and straggler["attribution"] == "exact"
    assert straggler["ranks"] == [1] and straggler["false_alarms"] == 0
    assert 0 < straggler["within_steps"] <= 11
    # the checkpoint file was seen live, after the onset, naming nobody; the golden run wrote
    # one too: a monitor that fires without a fault
    ckpt = signals["ckpt20"]
    assert ckpt["detected"] and ckpt["attribution"] == "none" and ckpt["step"] >= 20
    assert ckpt["false_alarms"] == 1 and ckpt["evidence"].endswith("step_00000020")
    assert signals["sdc_line"] == {**signals["sdc_line"], "detected": False,
                                   "false_alarms": 0, "attribution": None}
    assert "## Detection" in (folder / "report.md").read_text()
    assert "detection" in out and "anomaly:straggler" in out
    assert_no_job_processes(tmp_path)
