"""A worker that dies of a corrupted heap, under a real torchrun agent: the agent's log is what
``native_crash`` reads (the format of torch 2.13's elastic agent, not a copy of it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from faultlab.observe.launch_findings import native_crash


def test_the_agents_line_for_a_worker_glibc_aborted_is_read(tmp_path: Path) -> None:
    # What glibc does when it finds a tcache chunk overwritten: print its check, then abort.
    worker = tmp_path / "worker.py"
    worker.write_text("import os, sys\n"
                      "sys.stderr.write('malloc(): unaligned tcache chunk detected\\n')\n"
                      "sys.stderr.flush()\n"
                      "os.abort()\n")
    log = tmp_path / "node0.log"
    with log.open("w") as out:
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               "--nproc-per-node", "1", "--max-restarts", "0", str(worker)],
                              stdout=out, stderr=subprocess.STDOUT, timeout=120, check=False)
    assert done.returncode != 0
    (finding,) = native_crash({"node0": log.read_text()})
    assert "local rank 0 on node0 (pid " in finding.text
    assert "died of SIGABRT, glibc: 'malloc(): unaligned tcache chunk detected'" in finding.text
