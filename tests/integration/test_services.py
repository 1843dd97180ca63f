"""A service beside the nodes (``target.services``: torchft's lighthouse) as real processes:
started first with a free port of its own that the nodes are given, untouched by a node's
loss, broken only by ``kill_service``, and never left behind: not by ``stop``, not when the
process that launched the job is SIGKILLed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from faultlab.targets.launcher import LocalJob

pytestmark = pytest.mark.integration

# A service that listens on its port (the standard library's HTTP server), and nodes that only
# print the address they were given and wait.
SERVICE = {"web": (sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "{web_port}")}
LINE = ("env", "WEB=http://127.0.0.1:{web_port}", "NODE_PORT={node_master_port}")
NODE = [sys.executable, "-c", "import os, time; print(os.environ['WEB'], "
        "os.environ['NODE_PORT'], flush=True); time.sleep(300)"]


def _printed(job: LocalJob, node: str, timeout_s: float = 30) -> list[str]:
    log = job.run_dir / "logs" / f"{node}.log"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        words = log.read_text().split() if log.exists() else []
        if len(words) >= 2:
            return words
        time.sleep(0.05)
    raise AssertionError(f"{node} printed nothing within {timeout_s} s\n{job.log_tail()}")


def test_a_service_is_started_first_survives_a_node_kill_and_is_reaped(tmp_path: Path) -> None:
    with LocalJob(command=NODE, run_dir=tmp_path, nodes=2, max_restarts=0, launch_line=LINE,
                  services=SERVICE) as job:
        [service] = json.loads((tmp_path / "launch.json").read_text())["services"]
        port = service["port"]
        # it listened before any node started: the nodes were given its address
        listening = [c for c in psutil.net_connections(kind="tcp")
                     if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN]
        assert [c.pid for c in listening] == [service["pid"]]
        web0, own0 = _printed(job, "node0")
        web1, own1 = _printed(job, "node1")
        assert web0 == web1 == f"http://127.0.0.1:{port}"
        assert own0 != own1  # each node its own world, with a port of its own
        assert service["pid"] in job.pids()
        job.kill_node("node0", signal.SIGKILL)  # a node's loss never touches the service
        psutil.wait_procs([psutil.Process(job.agent_pid("node0"))], timeout=10)
        assert psutil.Process(service["pid"]).is_running()
        web = psutil.Process(service["pid"])
        killed = job.kill_service("web", signal.SIGKILL)
        assert killed == [service["pid"]]
        _gone, alive = psutil.wait_procs([web], timeout=10)  # SIGKILL lands asynchronously
        assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
        assert service["pid"] not in job.pids()
        with pytest.raises(KeyError, match="no service 'lighthouse'; services are web"):
            job.kill_service("lighthouse")
    assert not job.pids()


OWNER = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from faultlab.targets.launcher import LocalJob
    service, line, node, run_dir = json.loads(sys.argv[1])
    job = LocalJob(command=node, run_dir=Path(run_dir), nodes=2, max_restarts=0,
                   launch_line=tuple(line), services={"web": tuple(service)}).start()
    print(json.dumps(sorted(job.pids())), flush=True)
    sys.stdin.read()  # until the test kills this process
""")


def test_a_killed_launcher_leaves_no_service_and_no_node(tmp_path: Path) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER,
         json.dumps([SERVICE["web"], LINE, NODE, str(tmp_path)])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        pids = json.loads(owner.stdout.readline())
        assert len(pids) >= 3  # the service and both nodes
        owner.kill()  # SIGKILL: no clean-up code of the launcher runs
        owner.wait(timeout=10)
        procs = [psutil.Process(p) for p in pids if psutil.pid_exists(p)]
        _gone, alive = psutil.wait_procs(procs, timeout=15)
        assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], alive
    finally:
        if owner.poll() is None:
            owner.kill()
