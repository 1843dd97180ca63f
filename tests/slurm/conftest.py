"""What the tests of the local Slurm test cluster share."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from faultlab.testing import require_docker_engine


@pytest.fixture(scope="session")
def slurm_host() -> None:
    """Skip (fail under ``FAULTLAB_REQUIRE_DOCKER=1``, as in CI) unless this host can run the
    local Slurm test cluster: a Docker engine and root."""
    require_docker_engine()
    if os.geteuid() != 0:
        if os.environ.get("FAULTLAB_REQUIRE_DOCKER") == "1":
            pytest.fail("FAULTLAB_REQUIRE_DOCKER=1 but the Slurm test cluster needs root",
                        pytrace=False)
        pytest.skip("the Slurm test cluster needs root (daemons, munge key, containers)")


REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "slurm-cluster.sh"
LAB = Path("/var/lib/faultlab-slurm")


@contextlib.contextmanager
def cluster_up(nfs: bool = False) -> Iterator[Path]:
    """The local test cluster, 3 nodes (``nfs``: the shared directory behind an NFS client
    layer per node and for the submit host), with this process's ``SLURM_CONF`` and
    ``FAULTLAB_SLURM_SHARED`` pointing at it; taken down afterwards. Yields the shared
    directory."""
    env = {k: v for k, v in os.environ.items() if k != "FAULTLAB_SLURM_NFS"}
    if nfs:
        env["FAULTLAB_SLURM_NFS"] = "1"
    up = subprocess.run(["bash", str(SCRIPT), "up", "3"], capture_output=True, text=True,
                        timeout=300, check=False, env=env)
    assert up.returncode == 0, up.stdout + up.stderr
    print(up.stdout.strip().splitlines()[-1])
    assert f"shared directory: {'nfs' if nfs else 'coherent'}" in up.stdout, up.stdout
    saved = {k: os.environ.get(k) for k in ("SLURM_CONF", "FAULTLAB_SLURM_SHARED")}
    os.environ["SLURM_CONF"] = str(LAB / "etc" / "slurm" / "slurm.conf")
    os.environ["FAULTLAB_SLURM_SHARED"] = str(LAB / "shared")
    try:
        yield LAB / "shared"
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        subprocess.run(["bash", str(SCRIPT), "down"], capture_output=True, timeout=120,
                       check=False)


def _slurm(*cmd: str) -> str:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=60,
                          check=True).stdout


def _assert_nothing_left(job_ids: list[int]) -> None:
    """No job of the test still queued or running, every node idle (none down or drained by a
    fault), and no process of any job on any node."""
    from faultlab.targets.slurm.slurmcli import TERMINAL, show_job

    for job_id in job_ids:
        job = show_job(job_id)
        assert job is None or job["JobState"] in TERMINAL, job
    deadline = time.monotonic() + 30  # a machine started again takes a moment to answer
    while True:
        states = dict(line.split() for line in _slurm("sinfo", "-h", "-N", "-o",
                                                      "%N %T").splitlines())
        if set(states.values()) == {"idle"} or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert set(states.values()) == {"idle"}, states
    # A node relay is outside the job's process tree (a session of its own, reparented when
    # the rank that started it ends), so Slurm's linuxproc tracking does not end it with the
    # job: it leaves by its own rules, once it sees its agent gone (every WATCH_S) or, with no
    # agent to watch, ORPHAN_S after its last rank and hub. The node can turn idle before that
    # (seen once at -n 3: a relay still there when ps ran right after the job ended).
    from faultlab.runtime.relay import ORPHAN_S, WATCH_S

    deadline = time.monotonic() + ORPHAN_S + 10 * WATCH_S
    for node in states:
        while True:
            ps = subprocess.run(["docker", "exec", node, "ps", "-eo", "args"],
                                capture_output=True, text=True, timeout=30, check=True).stdout
            jobs = [line for line in ps.splitlines() if "python" in line]  # agents, ranks
            if not jobs or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert jobs == [], f"{node}:\n{ps}{_relay_logs(jobs)}"


def _relay_logs(lines: list[str]) -> str:
    """The log of every node relay among ``lines`` (``ps`` rows): why it did not leave."""
    out = []
    for line in lines:
        m = re.search(r"faultlab\.runtime\.relay --run-dir (\S+) --node (\S+)", line)
        if m:
            log = Path(m.group(1)) / "logs" / f"relay-{m.group(2)}.log"
            text = log.read_text() if log.is_file() else "(no log)"
            pids = subprocess.run(["docker", "exec", m.group(2), "ps", "-eo",
                                   "pid,ppid,stat,lstart,args"], capture_output=True, text=True,
                                  timeout=30).stdout
            out.append(f"\n--- {log}:\n{text[-3000:]}\n--- {m.group(2)} processes:\n{pids}")
    return "".join(out)
