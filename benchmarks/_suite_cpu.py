"""A pytest plugin that ``bench_suite.py`` loads into every pytest process of the run it measures
(``-p _suite_cpu``, with this folder on ``PYTHONPATH``): each xdist worker moves itself into a
control group of its own inside the run's, so every process a test starts, daemons that
``setsid`` away included, is charged to that worker until it exits; each test's CPU time is the
worker group's usage across the test's setup, call and teardown.

Docker containers (the docker target's nodes, the Slurm test cluster's nodes and the jobs they
run) live in the engine's own control groups, outside the run's. The plugin samples the engine's
parent group at each test's start and end; ``bench_suite.py`` shares that usage out among the
tests that ran while it accrued.

One JSON line per test goes to ``$FAULTLAB_SUITE_CPU_OUT/<worker>.jsonl``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

CGROUP_ENV = "FAULTLAB_SUITE_CGROUP"
OUT_ENV = "FAULTLAB_SUITE_CPU_OUT"
DOCKER_ENV = "FAULTLAB_SUITE_DOCKER_CGROUP"


def usage_s(group: str | os.PathLike[str]) -> float:
    """CPU-seconds (user + system) charged to a control group and its descendants so far:
    ``cpuacct.usage`` (v1, nanoseconds) or ``cpu.stat``'s ``usage_usec`` (v2). A group that
    does not exist (no docker container has started yet) has used 0."""
    path = Path(group)
    try:
        if (path / "cpuacct.usage").exists():
            return int((path / "cpuacct.usage").read_text()) / 1e9
        for line in (path / "cpu.stat").read_text().splitlines():
            key, value = line.split()
            if key == "usage_usec":
                return int(value) / 1e6
    except FileNotFoundError:
        return 0.0
    raise RuntimeError(f"{path}: neither cpuacct.usage nor cpu.stat's usage_usec")


class _Recorder:
    def __init__(self, group: Path, docker_group: str, out: Path) -> None:
        self.group = group
        self.docker_group = docker_group
        self.out = out.open("a", encoding="utf-8")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        t0, cpu0 = time.time(), usage_s(self.group)
        docker0 = usage_s(self.docker_group) if self.docker_group else 0.0
        yield
        docker1 = usage_s(self.docker_group) if self.docker_group else 0.0
        record = {"nodeid": item.nodeid, "t0": t0, "t1": time.time(),
                  "cpu_s": usage_s(self.group) - cpu0, "docker0": docker0, "docker1": docker1}
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()


def pytest_configure(config: pytest.Config) -> None:
    parent, out = os.environ.get(CGROUP_ENV), os.environ.get(OUT_ENV)
    if not parent or not out:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None and config.getoption("numprocesses", None):
        return  # the xdist controller runs no test: its own CPU counts in the run's total only
    for key in (CGROUP_ENV, OUT_ENV):  # a pytest this one starts (pytester) is not measured
        os.environ.pop(key)
    name = worker or "main"
    group = Path(parent) / name
    group.mkdir(exist_ok=True)
    (group / "cgroup.procs").write_text(str(os.getpid()))
    config.pluginmanager.register(
        _Recorder(group, os.environ.get(DOCKER_ENV, ""), Path(out) / f"{name}.jsonl"),
        "faultlab-suite-cpu")
