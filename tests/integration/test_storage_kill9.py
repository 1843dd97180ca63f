"""Undo is guaranteed even when faultlab itself is killed during ``io_hang`` (issue 23).

A real run: the reference trainer's save hangs in the kernel on the passthrough (its ranks sit
in a FUSE request); faultlab gets SIGTERM (its clean-up path, as for Ctrl-C) or SIGKILL (then
its guard process, ``faultlab.reaper``, and the server's own watch of faultlab's pid). Either
way the hung operations are released, the mount is removed (no "Transport endpoint is not
connected" left behind), no process of the job or of the passthrough is left, and every file
the job wrote is in the checkpoint directory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from faultlab.storage import fuse_unavailable, is_mounted

pytestmark = pytest.mark.integration

EXPERIMENT = """\
name: io_hang_kill9
seed: 0
target: {trainer: reference, preset: tiny}
topology: {nodes: 2, procs_per_node: 1}
run: {steps: 40, checkpoint_every: 5, timeout_s: 300}
faults:
  - {id: hang, type: io_hang, target: all, trigger: {at_step: 6}, duration_s: 600,
     params: {ops: [write, fsync, create]}}
"""


def _in_fuse(pid: int) -> bool:
    """Is some thread of ``pid`` blocked in a FUSE request (in the kernel)?"""
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            if "fuse" in (task / "wchan").read_text() or "fuse" in (task / "stack").read_text():
                return True
        except OSError:
            continue
    return False


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["KILL", "TERM"])
def test_killing_faultlab_during_io_hang_leaves_no_mount_and_no_process(
        tmp_path: Path, sig: signal.Signals) -> None:
    why = fuse_unavailable()
    if why:
        pytest.fail(f"the storage passthrough cannot mount here: {why}")
    (tmp_path / "hang.yaml").write_text(EXPERIMENT)
    engine = subprocess.Popen(
        [sys.executable, "-m", "faultlab.cli", "run", str(tmp_path / "hang.yaml"),
         "--report-dir", str(tmp_path / "reports")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: list[str] = []
    try:
        assert engine.stdout is not None
        for line in engine.stdout:
            out.append(line)
            if "injected hang" in line:
                break
        [run] = (tmp_path / "reports").glob("io_hang_kill9-*")
        ckpt = run / "job" / "checkpoints"
        server_pid = json.loads((run / ".storage" / "storage-guard.json").read_text())["pid"]
        deadline = time.monotonic() + 120
        hung: list[int] = []
        while not hung and time.monotonic() < deadline:  # the save at step 10 sits in the kernel
            job = json.loads((run / ".job-pids.json").read_text())
            hung = [pid for pid in job if _in_fuse(pid)]
            time.sleep(0.2)
        assert hung, "no rank of the job blocked in a FUSE request:\n" + "".join(out[-30:])
        procs = [psutil.Process(pid) for pid in
                 [*json.loads((run / ".job-pids.json").read_text()), server_pid]]
        assert is_mounted(ckpt)
        engine.send_signal(sig)
        engine.wait(60)
        _gone, alive = psutil.wait_procs(procs, timeout=30)
        assert not alive, f"left running after faultlab's {sig.name}: {alive}"
        deadline = time.monotonic() + 10
        while is_mounted(ckpt) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not is_mounted(ckpt)
        os.listdir(ckpt)  # not "Transport endpoint is not connected"
        saved = sorted(p.name for p in ckpt.iterdir())
        assert "step_00000005" in saved, saved  # committed before the hang, through the mount
    finally:
        if engine.poll() is None:
            engine.kill()
