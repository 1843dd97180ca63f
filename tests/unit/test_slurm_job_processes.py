"""Which of a Slurm node's processes ``faultlab.targets.slurm.node`` may signal: the job's (by
``FAULTLAB_RUN_DIR``) and their descendants, topmost first, never a stranger."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from faultlab.targets.slurm.node import job_processes

# A "rank" that starts a child with an empty environment (as a worker reads in the middle of
# execve) and says both pids once the child runs.
RANK = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); "
                          "time.sleep(60)"], env={}, stdout=subprocess.PIPE, text=True)
assert child.stdout.readline() == "up\\n"
print(child.pid, flush=True)
time.sleep(60)
"""


def test_the_job_is_its_named_processes_and_their_children_topmost_first(
        tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    rank = subprocess.Popen([sys.executable, "-c", RANK], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "FAULTLAB_RUN_DIR": run_dir})
    stranger = subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
        env={**os.environ, "FAULTLAB_RUN_DIR": run_dir + "-other"})
    child = None
    try:
        assert rank.stdout is not None and stranger.stdout is not None
        child = int(rank.stdout.readline())
        assert stranger.stdout.readline() == "up\n"
        assert job_processes(run_dir) == [rank.pid, child]
        assert job_processes(run_dir + "-other") == [stranger.pid]
    finally:
        for proc in (rank, stranger):
            proc.kill()
            proc.wait()
        if child is not None:
            os.kill(child, 9)  # orphaned now: init reaps it


def test_the_node_command_imports_no_more_than_the_standard_library_needs() -> None:
    """It runs on every node of every job (each node's task) and for every fault on a node
    (a step there): importing the slurm package's spec, pydantic and numpy for it cost each
    such process 0.45 CPU-s."""
    code = ("import sys, faultlab.targets.slurm.node; "
            "print(sorted(m for m in ('pydantic', 'numpy', 'torch', 'faultlab.spec') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
