"""A team's own launch line on local nodes: each node's line in a session of its own, its
workers in sessions of theirs (torchrun starts them so), and ``node_kill`` taking the node's
whole process tree, workers included, as a machine loss does."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from faultlab.spec.launch import TORCHRUN_DEFAULT
from faultlab.targets.launcher import LocalJob

pytestmark = pytest.mark.integration


def _workers(job: LocalJob, node: str, timeout_s: float = 60) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [p for p in psutil.Process(job.agent_pid(node)).children(recursive=True)
                 if "time.sleep" in " ".join(p.cmdline())]
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{node}: no worker within {timeout_s} s\n{job.log_tail()}")


def test_a_node_kill_takes_the_teams_launcher_and_its_workers(tmp_path: Path) -> None:
    with LocalJob(command=[sys.executable, "-c", "import time; time.sleep(300)"],
                  run_dir=tmp_path, nodes=2, max_restarts=0,
                  launch_line=(*TORCHRUN_DEFAULT, "--no-python")) as job:
        victims = _workers(job, "node1")  # not node 0: its agent holds the c10d store, and
        survivors = _workers(job, "node0")  # its loss would take node 1's workers as well
        agent = job.agent_pid("node1")
        # torchrun puts each worker in a session of its own: the agent's group would miss it
        assert all(os.getsid(w.pid) != os.getsid(agent) for w in victims)
        killed = job.kill_node("node1", signal.SIGKILL)
        assert agent in killed and {w.pid for w in victims} <= set(killed)
        gone, alive = psutil.wait_procs([psutil.Process(agent), *victims], timeout=10)
        assert not alive, alive
        assert all(w.is_running() for w in survivors)  # the other node is untouched
    assert not any(w.is_running() for w in survivors)  # and stop() reaped it
