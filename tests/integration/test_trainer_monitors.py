"""The reference trainer's silent-failure monitors (reference_trainer/monitors.py) in one real
job: three HSDP replicas (``--replicate 3`` on 3 nodes of 1 rank, one shard each) and a test
double of corrupted updates (tests/integration/diverge_rank.py): rank 2's replica moves by a
relative 1e-3 in one element after its 6th optimizer step, invisible in the loss, and its
output head is scaled by 100 after its 10th. The replicas agree bitwise at every step before
(a false alarm would show); the fingerprint names rank 2 in step 7's stats, once for the whole
episode; the spike check names rank 2 by its own loss in step 11 (and may see the gradient
norm, which names nobody), and nothing else fires. Each finding is also a log line a declared
``log_pattern`` can match."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from scenarios import Outcome, Scenario, explain

from faultlab.runtime.events import read_events
from faultlab.targets.launcher import LocalJob
from reference_trainer.config import train_argv

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

DOUBLE = Path(__file__).with_name("diverge_rank.py")


def test_three_replicas_name_the_ranks_whose_updates_diverged(tmp_path: Path) -> None:
    scenario = Scenario("hsdp-3-diverge", steps=12, nodes=3, train={"replicate": 3})
    cfg = scenario.config(tmp_path)
    job = LocalJob(command=[sys.executable, str(DOUBLE), "2:6", "2:10:100", "--",
                            *train_argv(cfg)],
                   run_dir=tmp_path, nodes=3, procs_per_node=1, max_restarts=0)
    with job:
        result = job.wait(timeout_s=300)
    events = read_events(tmp_path / "events")
    anomalies = [e for e in events if e["kind"] == "anomaly"]
    with explain(Outcome(job=job, result=result, events=events, t_fault=None)):
        assert result.ok
        starts = [e for e in events if e["kind"] == "start" and e["rank"] == 0]
        assert "3 replicas of 1 shard(s), majority attribution" in \
            starts[0]["monitors"]["fingerprint"]
        found = [(a["what"], a["step"], a.get("suspect_rank"), a.get("ranks")) for a in anomalies]
        assert found[0] == ("sdc_suspected", 7, 2, [2])
        spikes = {("loss_spike", 11, None, (2,))}
        assert {(w, s, r, tuple(n) if n else n) for w, s, r, n in found[1:]} in \
            (spikes, spikes | {("grad_norm_spike", 11, None, None)})
        assert all(a["rank"] == 0 for a in anomalies)
        assert anomalies[0]["disagreeing_ranks"] == [0, 1, 2]
        assert any(e["kind"] == "final_digest" for e in events)
        log = "".join(p.read_text() for p in sorted((tmp_path / "logs").glob("*.log")))
        lines = re.findall(r"SDC: fingerprint of rank (\d+) disagrees at step (\d+)", log)
        assert lines == [("2", "7")]
        assert "loss spike at step 11 on ranks [2]" in log

