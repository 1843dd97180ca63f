"""NVRx ft_launcher as a team's launch line: what it starts besides the ranks (a rank monitor per
rank, spawned by ft_launcher) is the job's too, and goes when faultlab is killed."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from faultlab.testing import assert_no_job_processes, job_processes, stopped_job_processes
from tests.integration.test_faultlab_run import Faultlab

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# rank 1 stopped, and a heartbeat timeout long enough that ft_launcher does not end the hang
# before faultlab is killed: every process of the job is still there, one of them stopped
HUNG = """\
name: nvrx_killed_faultlab
target:
  command: [python, examples/nvrx_ft/train.py, --steps, "16", --ckpt-every, "4",
            --ckpt-dir, "{run_dir}/checkpoints"]
  launch: [ft_launcher, --nnodes, "{nnodes}", --nproc-per-node, "1", --rdzv-backend, c10d,
           --rdzv-endpoint, "{rdzv_endpoint}", --max-restarts, "2",
           --ft-rank-heartbeat-timeout, "120"]
topology: {nodes: 2, procs_per_node: 1, max_restarts: 2}
run: {steps: 16, timeout_s: 200}
faults:
  - id: freeze-rank-1
    type: rank_hang
    target: {rank: 1}
    trigger: {at_step: 5}
    duration_s: 120
expect:
  completes: true
"""


def _rank_monitors(folder: Path) -> list[psutil.Process]:
    """ft_launcher's rank monitors: children of an ft_launcher forked from it (its command
    line), where a rank is ``python -u train.py ...``."""
    out = []
    for p in job_processes(folder):
        try:
            parent = p.parent()
            if parent is not None and "bin/ft_launcher" in " ".join(parent.cmdline()) \
                    and "bin/ft_launcher" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:
            continue
    return out


def test_killed_faultlab_leaves_no_ft_launcher_rank_monitor_or_rank(tmp_path: Path) -> None:
    exp = tmp_path / "hung.yaml"
    exp.write_text(HUNG)
    fl = Faultlab("run", exp, "--report-dir", tmp_path)
    try:
        fl.wait_for("injected freeze-rank-1")
        assert stopped_job_processes(tmp_path)
        monitors = _rank_monitors(tmp_path)
        assert len(monitors) == 2, [" ".join(p.cmdline()) for p in job_processes(tmp_path)]
        time.sleep(1.0)  # the guard's pid file is refreshed every 0.5 s
    finally:
        fl.proc.kill()  # no clean-up code of faultlab's can run (and a failed check above
    fl.wait(timeout_s=30)  # leaves nothing running either: the guard reaps the job)
    assert_no_job_processes(tmp_path)
    assert not any(p.is_running() for p in monitors)
