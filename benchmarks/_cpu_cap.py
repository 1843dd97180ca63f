"""Cap a test run at N CPUs, its Docker containers included: a 2-core machine made into the
slowest machine of its kind (``bench_suite.py --cpus 1``).

Where the cgroup v1 ``cpu`` controller is a hierarchy of its own (not mounted with ``cpuacct``,
as on the 2-core development machine), one group ``faultlab-cap-<pid>`` gets the bandwidth
``cpu.cfs_quota_us = N * cpu.cfs_period_us``; the pytest command enters its child ``suite`` and
a thread moves every process of every Docker container into its child ``docker`` within a tenth
of a second of the container's start (Docker creates a container's groups under its own parent;
only the ``cpu`` hierarchy's membership changes, so the ``cpuacct`` figures ``bench_suite.py``
reads, and ``docker stats``, stay where they were). The suite, the Slurm cluster's nodes, the
docker nodes and every job inside them then share N CPUs, as on a machine with N.

Elsewhere (cgroup v2, or ``cpu`` mounted with ``cpuacct``) moving a container's processes would
move its accounting too: the run's group and Docker's parent group are each capped at N instead,
which lets the two together use up to 2N while containers run (``describe`` says so).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

PERIOD_US = 100_000
MOVE_EVERY_S = 0.1


def _v1_cpu_root() -> Path | None:
    """The v1 ``cpu`` hierarchy's root when it is not shared with ``cpuacct``."""
    cpu, cpuacct = Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/cpuacct")
    if not (cpu / "cpu.cfs_quota_us").exists():
        return None
    if cpuacct.exists() and os.path.samefile(cpu, cpuacct):
        return None
    return cpu


def _write_quota(group: Path, cpus: float) -> None:
    quota = max(1000, round(cpus * PERIOD_US))
    if (group / "cpu.cfs_quota_us").exists():
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(quota))
    else:
        (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")


def _throttled_s(group: Path) -> float:
    try:
        for line in (group / "cpu.stat").read_text().splitlines():
            key, value = line.split()
            if key == "throttled_time":  # v1: nanoseconds
                return int(value) / 1e9
            if key == "throttled_usec":
                return int(value) / 1e6
    except (OSError, ValueError):
        pass
    return 0.0


class CpuCap:
    """The cap for one run: ``enter(pid)`` in the child before it runs the suite, ``close()``
    after it (``throttled_s`` then holds how long the cap held the run back)."""

    def __init__(self, cpus: float, run_group: Path, docker_cpuacct_group: Path,
                 move_containers: bool = True) -> None:
        if not cpus > 0:
            raise SystemExit(f"bench_suite: --cpus must be > 0, not {cpus!r}")
        self.cpus = cpus
        self.move_containers = move_containers
        self.throttled_s = 0.0
        self._stop = threading.Event()
        self._mover: threading.Thread | None = None
        root = _v1_cpu_root()
        if root is not None:
            self.shared = True
            self.group = root / f"faultlab-cap-{os.getpid()}"
            self.group.mkdir()
            _write_quota(self.group, cpus)
            (self.group / "suite").mkdir()
            (self.group / "docker").mkdir()
            self.docker_src = root / docker_cpuacct_group.name  # the engine's parent group
            if move_containers:
                self._mover = threading.Thread(target=self._move_containers, daemon=True,
                                               name="cpu-cap-mover")
                self._mover.start()
        else:
            self.shared = False
            self.group = run_group
            self.docker_src = docker_cpuacct_group
            _write_quota(self.group, cpus)
            if move_containers and self.docker_src.exists():
                _write_quota(self.docker_src, cpus)

    def describe(self) -> str:
        if self.shared:
            return (f"{self.group} (cpu.cfs_quota_us {round(self.cpus * PERIOD_US)} per "
                    f"{PERIOD_US}), Docker's containers moved into it")
        return (f"{self.group} and Docker's {self.docker_src} each capped at {self.cpus:g} "
                f"(together up to {2 * self.cpus:g} while containers run)")

    def enter(self, pid: str) -> None:
        """Put process ``pid`` (the suite's command, before it execs) under the cap."""
        if self.shared:
            (self.group / "suite" / "cgroup.procs").write_text(pid)

    def _move_containers(self) -> None:
        target = self.group / "docker" / "cgroup.procs"
        while not self._stop.wait(MOVE_EVERY_S):
            if not self.docker_src.is_dir():
                continue
            for procs in self.docker_src.rglob("cgroup.procs"):
                try:
                    pids = procs.read_text().split()
                except OSError:  # the container's group went away meanwhile
                    continue
                for pid in pids:
                    try:
                        target.write_text(pid)
                    except OSError:  # the process ended meanwhile
                        pass

    def close(self) -> None:
        """Stop moving containers; remove the cap's groups (their processes, if any are left,
        back to the root group, where ``bench_suite.py`` still names them)."""
        self._stop.set()
        if self._mover is not None:
            self._mover.join()
        self.throttled_s = _throttled_s(self.group)
        if not self.shared:
            for g in (self.group, self.docker_src) if self.move_containers else (self.group,):
                if g.exists():
                    _lift(g)
            return
        root = self.group.parent
        for child in ("suite", "docker"):
            for pid in (self.group / child / "cgroup.procs").read_text().split():
                try:
                    (root / "cgroup.procs").write_text(pid)
                except OSError:
                    pass
            (self.group / child).rmdir()
        self.group.rmdir()


def _lift(group: Path) -> None:
    """No bandwidth limit on ``group`` any more."""
    if (group / "cpu.cfs_quota_us").exists():
        (group / "cpu.cfs_quota_us").write_text("-1")
    elif (group / "cpu.max").exists():
        (group / "cpu.max").write_text(f"max {PERIOD_US}")
