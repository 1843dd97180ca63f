"""A golden run that fails: the experiment is never launched, and the verdict says so.

Before, the run went on to list ``completes`` and ``fault_injected`` as failed for a job that
never ran (issue 45: a team's Slurm entry point that reads ``$SLURM_JOB_ID``, computed on the
login node). The golden run now runs on the experiment's own target through the same job
session as the run; here it is a trainer that exits 3 at once, on local nodes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from faultlab.engine import run_experiment
from faultlab.spec import experiment_from_dict
from faultlab.testing import assert_no_job_processes

pytestmark = pytest.mark.integration


def test_a_failed_golden_run_stops_the_run_before_the_launch(tmp_path: Path) -> None:
    exp = experiment_from_dict({
        "name": "golden_fails",
        "target": {"command": ["python", "-c", "import sys; print('no allocation'); "
                                               "sys.exit(3)"]},
        "topology": {"nodes": 1, "procs_per_node": 1, "max_restarts": 0},
        "run": {"steps": 4, "timeout_s": 60},
        "faults": [{"id": "k", "type": "rank_kill", "target": {"rank": 0},
                    "trigger": {"at_step": 2}}],
        "expect": {"completes": True, "bitwise_equal_to_golden": True}})
    result = run_experiment(exp, report_dir=tmp_path / "reports",
                            golden_cache=tmp_path / "golden")
    assert result.verdict == "fail" and result.slas == [], result.slas
    assert result.error is not None
    assert result.error.startswith("the golden run of 'golden_fails' failed on its target "
                                   "(local; exit codes {'node0': "), result.error
    assert result.error.endswith("; last log line: no allocation; the experiment was never "
                                 "launched: no SLA was measured"), result.error
    # nothing of the experiment's own job was started, and nothing of either is left
    assert not (result.run_folder / "job" / "events").exists()
    assert not list((tmp_path / "golden").glob("*.json"))  # a failure is never cached
    assert_no_job_processes(tmp_path)
