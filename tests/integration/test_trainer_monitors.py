"""The reference trainer's cross-replica fingerprint (reference_trainer/monitors.py) in a real
job: three HSDP replicas (``--replicate 3`` on 3 nodes of 1 rank, one shard each), one of which
diverges after its 6th optimizer step (tests/integration/diverge_rank.py, a test double of a
corrupted update). The replicas agree bitwise at every step before it (a false alarm would
show), the monitor names the diverged rank in the next step's stats, once, and says so in the
log in the line a declared ``log_pattern`` matches."""

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


def test_three_replicas_name_the_rank_whose_update_diverged(tmp_path: Path) -> None:
    scenario = Scenario("hsdp-3-diverge", steps=12, nodes=3, train={"replicate": 3})
    cfg = scenario.config(tmp_path)
    job = LocalJob(command=[sys.executable, str(DOUBLE), "2", "6", "--", *train_argv(cfg)],
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
        assert [(a["what"], a["step"], a.get("suspect_rank"), a.get("ranks")) for a in anomalies] \
            == [("sdc_suspected", 7, 2, [2])]
        assert anomalies[0]["rank"] == 0 and anomalies[0]["disagreeing_ranks"] == [0, 1, 2]
        assert any(e["kind"] == "final_digest" for e in events)
        log = "".join(p.read_text() for p in sorted((tmp_path / "logs").glob("*.log")))
        found = re.findall(r"SDC: fingerprint of rank (\d+) disagrees at step (\d+)", log)
        assert found == [("2", "7")]

