"""Helpers for users' own tests of their training stack (and for faultlab's).

    from faultlab.testing import assert_no_job_processes

    def test_my_experiment(tmp_path):
        ...  # run an experiment with report_dir=tmp_path
        assert_no_job_processes(tmp_path)   # nothing of the job survived, nothing is frozen
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil

__all__ = ["assert_no_job_processes", "job_processes", "require_docker_engine",
           "require_target", "stopped_job_processes"]


def job_processes(folder: Path) -> list[psutil.Process]:
    """Live processes of any job whose run directory lies under ``folder``: the ranks and
    agents (by ``FAULTLAB_RUN_DIR``) and anything else whose command line names the folder
    (the rendezvous store, faultlab's guard)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "environ"]):
        try:
            env = p.info["environ"] or {}
            cmd = " ".join(p.info["cmdline"] or [])
        except psutil.Error:
            continue
        if str(folder) in env.get("FAULTLAB_RUN_DIR", "") or str(folder) in cmd:
            found.append(p)
    return found


def assert_no_job_processes(folder: Path, timeout_s: float = 15.0) -> None:
    """Fail unless, within ``timeout_s``, no process of a job under ``folder`` is alive
    (processes that are exiting get that long to go)."""
    deadline = time.monotonic() + timeout_s
    left = job_processes(folder)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = job_processes(folder)
    described = []
    for p in left:
        try:
            described.append((p.pid, p.status(), " ".join(p.cmdline())[:120]))
        except psutil.Error:
            continue
    assert described == [], f"processes of the job under {folder} are still alive"


def stopped_job_processes(folder: Path, timeout_s: float = 10.0) -> list[psutil.Process]:
    """The processes of a job under ``folder`` that are stopped (``SIGSTOP``: a hang fault), as
    soon as there is one, or none after ``timeout_s``. A stop shows only once the victim has
    been scheduled and taken the signal, which on a loaded machine is not at once after the
    fault said it was injected."""
    deadline = time.monotonic() + timeout_s
    while True:
        stopped = []
        for p in job_processes(folder):
            try:
                if p.status() == psutil.STATUS_STOPPED:
                    stopped.append(p)
            except psutil.Error:  # gone in between
                continue
        if stopped or time.monotonic() >= deadline:
            return stopped
        time.sleep(0.05)


def require_target(launcher: str) -> None:
    """Skip the calling test (with the reason) where the target registered as ``launcher``
    says no job of it can start on this machine (its class's optional ``unavailable()``: the
    docker target's, where no Docker engine answers); fail it instead where the environment
    sets ``FAULTLAB_REQUIRE_<LAUNCHER>=1`` (``make test`` sets ``FAULTLAB_REQUIRE_DOCKER`` under
    CI)."""
    import pytest

    from faultlab.targets import target_type

    check = getattr(target_type(launcher), "unavailable", None)
    problem = None if check is None else check()
    if problem is None:
        return
    required = f"FAULTLAB_REQUIRE_{launcher.upper()}"
    if os.environ.get(required) == "1":
        pytest.fail(f"{required}=1 but {problem}{_engine_log_tail()}", pytrace=False)
    pytest.skip(f"{launcher} launcher: {problem}")


def require_docker_engine() -> None:
    """``require_target`` of the docker target: skip where no Docker engine answers, fail
    where ``FAULTLAB_REQUIRE_DOCKER=1`` (the local Slurm test cluster's nodes are containers
    too)."""
    require_target("docker")


# Where scripts/docker-engine.sh (``make test``) sends containerd's and dockerd's output.
ENGINE_LOG = Path("/var/log/faultlab-dockerd.log")


def _engine_log_tail(lines: int = 3) -> str:
    """The last lines of the engine log ``make test`` started, so that a CI failure says why the
    engine is not there (it once said: a stale containerd socket made the start script skip
    containerd); empty where there is no such log."""
    try:
        tail = ENGINE_LOG.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return f"; the end of {ENGINE_LOG}: " + " | ".join(line.strip() for line in tail)
