"""Declared detection signals on a real job: experiments/collective_delay_straggler.yaml (a
collective_delay straggler on rank 1), which CI runs here rather than as an item of its own (the
Makefile's SHIPPED list leaves it out), with detection SLAs and two declared signals added. Its
own SLAs must pass as shipped; the added ones judge the trainer's own straggler anomaly
(``anomaly:straggler``) and the two signals the engine watches live: a file that appears (the
step-20 checkpoint, which the fault-free golden run writes too: a false alarm, counted on the
cached golden run with the signals as they are now) and a log pattern nothing prints. One run
and its golden run (the shipped experiment's key: observe and expect are not in it)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from faultlab.testing import assert_no_job_processes

pytestmark = [pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "experiments" / "collective_delay_straggler.yaml"

ADDED = r"""
  detected_by: ['anomaly:straggler']
  detected_within_steps: 11         # named inside the fault's 12-step window
  detection_attributed: true
  false_alarms: 0
observe:
  detections:
    - name: ckpt20
      file: 'checkpoints/step_00000020'
    - name: sdc_line
      log_pattern: 'SDC: fingerprint of rank (?P<rank>\d+) disagrees'
"""
"""Appended to the shipped experiment, whose last block is ``expect``: more SLAs, and the
declared signals."""


def test_a_straggler_is_scored_by_the_declared_signals(
        tmp_path: Path, golden_cache: Path, cli: Callable[..., tuple[int, str]]) -> None:
    text = SHIPPED.read_text()
    assert text.rstrip().endswith("straggler_detected_within_s: {s: 1, cold_starts: 1}")
    exp = tmp_path / "collective_delay_straggler.yaml"
    exp.write_text(text.rstrip() + "\n" + ADDED)
    rc, out = cli("run", exp, "--report-dir", tmp_path / "reports", "--golden-cache",
                  golden_cache)
    assert rc == 0, out
    (folder,) = (tmp_path / "reports").glob("collective_delay_straggler-*")
    journal = json.loads((folder / "journal.json").read_text())
    table = "\n".join(f"{s['name']}: {s['result']}, measured {s['measured']!r} ({s['note']})"
                      for s in journal["slas"])
    # the shipped experiment's verdict and each of its SLAs, the added ones too
    assert journal["verdict"] == "pass", table
    assert {s["name"] for s in journal["slas"] if s["passed"]} >= {
        "completes", "max_restarts", "bitwise_equal_to_golden", "straggler_detected_within_s",
        "detected_within_steps", "detection_attributed", "false_alarms"}, table
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
