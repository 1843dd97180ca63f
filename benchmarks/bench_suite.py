"""What the test suite costs in machine time: CPU-seconds (user + system) of ``make test``'s own
pytest command, for the whole run and for each test and file, daemons, Docker containers and
the Slurm test cluster's nodes included.

    python benchmarks/bench_suite.py                      # make test's suite, measured
    python benchmarks/bench_suite.py --load 2             # the same beside two busy loops
    python benchmarks/bench_suite.py --repo /tmp/clone --out suite.json
    python benchmarks/bench_suite.py -- tests/unit -n 2   # other pytest arguments

How it counts. The pytest command runs in a control group of its own (cgroup v1 ``cpuacct`` or
v2), and each xdist worker moves itself into a child group of it (``_suite_cpu.py``, a plugin
loaded with ``-p``): a process stays in its group whatever it does (``setsid``, double fork), so
every trainer, torchrun agent, FUSE server, etcd, slurmctld and browser a test starts is charged
to the worker that ran the test, and a test's CPU time is its worker group's usage across the
test (setup, call, teardown; a session fixture's setup is charged to the first test that needs
it). Docker containers live in the engine's groups: their usage over each interval is shared
equally among the docker and Slurm tests running in it (``DOCKER_USERS``; among all of them when
none is). The engine's own daemons (dockerd, containerd) are counted for the whole run only. At
the end it names every process the run left in its group: a leak, or a fault never undone.
CPU-seconds vary far less between machines of one kind than wall seconds do, and a loaded
machine stretches wall time, not CPU time.

Before it measures, it runs ``make test``'s prerequisites (the venv, chromium, the Docker engine,
fuse3, etcd) unmeasured. Slurm's Debian packages are installed by the cluster's first ``up``,
inside a test: on a machine without them that first run counts the install.

``--load N`` starts N busy loops (outside the measured group) for the whole run: a suite that
passes only on an idle machine has a race (docs/development.md).

``--cpus N`` caps the whole run at N CPUs of the machine's (``--cpus 1`` on a 2-core machine: a
machine half as fast, the slowest of its kind): the pytest command, and every Docker container
the run starts, share one group whose CPU bandwidth is capped (cgroup v1 ``cpu.cfs_quota_us``,
v2 ``cpu.max``; ``_cpu_cap.py``). A test that fails there has a race or a bound tied to one
machine's speed (docs/development.md).

``--processes`` adds a census of the processes the run ended, by kind (ranks, launcher agents,
the rest), from Linux process accounting (``_proc_acct.py``; root): how many torch processes the
suite starts is its floor.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _proc_acct  # noqa: E402
from _cpu_cap import CpuCap  # noqa: E402
from _suite_cpu import CGROUP_ENV, DOCKER_ENV, OUT_ENV, usage_s  # noqa: E402
from _table import print_table  # noqa: E402

PREREQUISITES = [".venv/.faultlab-installed", "chromium", "docker-engine", "fuse", "etcd"]
ENGINE_DAEMONS = ("dockerd", "containerd")


def cgroup_roots() -> tuple[Path, Path]:
    """(where to make the run's group, the Docker engine's parent group) on this host."""
    v1 = Path("/sys/fs/cgroup/cpuacct")
    if (v1 / "cpuacct.usage").exists():
        return v1, v1 / "docker"
    v2 = Path("/sys/fs/cgroup")
    if (v2 / "cgroup.controllers").exists():
        docker = v2 / "system.slice" if (v2 / "system.slice").exists() else v2 / "docker"
        return v2, docker
    raise SystemExit("bench_suite: no cgroup v1 cpuacct hierarchy and no cgroup v2 at "
                     "/sys/fs/cgroup: cannot count a process tree's CPU exactly here")


def pytest_command(repo: Path, extra: list[str]) -> str:
    """``make test``'s pytest line (``make -n`` prints it), or the same line with ``extra`` as
    the arguments after ``pytest``."""
    dry = subprocess.run(["make", "-n", "test"], cwd=repo, capture_output=True, text=True,
                         check=True, env={**os.environ, "CI": os.environ.get("CI", "true")})
    lines = dry.stdout.replace("\\\n", " ").splitlines()  # a recipe's continued lines
    line = " ".join(next(ln for ln in reversed(lines) if " -m pytest " in ln).split())
    if extra:
        line = line[:line.index(" -m pytest ")] + " -m pytest " + " ".join(extra)
    return line


def engine_cpu_s() -> float:
    import psutil

    total = 0.0
    for p in psutil.process_iter(["name", "cpu_times"]):
        if p.info["name"] in ENGINE_DAEMONS and p.info["cpu_times"] is not None:
            total += p.info["cpu_times"].user + p.info["cpu_times"].system
    return total


DOCKER_USERS = re.compile(r"docker|slurm|network_(partition|throttle)")
"""Tests that start containers (their node id says so: tests/docker, tests/slurm, the docker
experiments): a container's usage goes to those of them that ran while it accrued."""


def share_docker(records: list[dict[str, Any]]) -> dict[str, float]:
    """Docker containers' CPU per test: the engine group's usage between consecutive samples,
    shared equally among the tests that ran over the whole of that interval and start
    containers (``DOCKER_USERS``), or among all of them when none does."""
    samples = sorted({(r["t0"], r["docker0"]) for r in records} |
                     {(r["t1"], r["docker1"]) for r in records})
    shares: dict[str, float] = collections.defaultdict(float)
    for (ta, ua), (tb, ub) in itertools.pairwise(samples):
        delta = ub - ua
        if delta <= 0:
            continue
        running = [r["nodeid"] for r in records if r["t0"] <= ta and r["t1"] >= tb]
        running = [n for n in running if DOCKER_USERS.search(n)] or running
        for nodeid in running or ["(between tests)"]:
            shares[nodeid] += delta / max(1, len(running))
    return shares


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def measure(repo: Path, pytest_args: list[str], load: int, log_path: Path | None,
            processes: bool = False, cpus: float | None = None) -> dict[str, Any]:
    """Run the suite in ``repo`` once, in a control group of its own; every figure of it."""
    subprocess.run(["make", "-s", *PREREQUISITES], cwd=repo, check=True)
    command = pytest_command(repo, pytest_args)
    root, docker_group = cgroup_roots()
    group = root / f"faultlab-suite-{os.getpid()}"
    group.mkdir()
    out = Path(tempfile.mkdtemp(prefix="faultlab-suite-cpu-"))
    log_path = log_path or out / "pytest.log"
    env = {**os.environ, "CI": os.environ.get("CI", "true"),
           CGROUP_ENV: str(group), OUT_ENV: str(out), DOCKER_ENV: str(docker_group),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
           "PYTEST_ADDOPTS": " ".join(filter(None, [os.environ.get("PYTEST_ADDOPTS"),
                                                    "-p _suite_cpu"]))}
    pacct = out / "pacct" if processes else None
    if pacct:  # refused without root: said before anything starts
        _proc_acct.start(pacct)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
    cap = CpuCap(cpus, group, docker_group) if cpus else None
    print(f"bench_suite: {command}\n  in {repo}, group {group}, load {load}, log {log_path}"
          + (f"\n  capped at {cpus:g} CPU(s): {cap.describe()}" if cap else ""), flush=True)

    def enter_groups() -> None:  # in the child, before exec: every descendant stays in them
        pid = str(os.getpid())
        (group / "cgroup.procs").write_text(pid)
        if cap:
            cap.enter(pid)

    try:
        docker0, engine0, t0 = usage_s(docker_group), engine_cpu_s(), time.monotonic()
        with log_path.open("w") as log:
            proc = subprocess.Popen(
                ["bash", "-c", command], cwd=repo, env=env, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True,
                preexec_fn=enter_groups)
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                if re.match(r"^(=+ .*(passed|failed|error).* =+|FAILED |ERROR )", line):
                    sys.stdout.write(line)
            rc = proc.wait()
        wall_s = time.monotonic() - t0
        suite_s, docker_s = usage_s(group), usage_s(docker_group) - docker0
        engine_s = engine_cpu_s() - engine0
    finally:
        if cap:
            cap.close()
        if pacct:  # before the busy loops end: they are not the suite's
            _proc_acct.stop()
        for h in hogs:
            h.kill()
            h.wait()
    left = leftovers(group)
    if left:  # a process a test left behind: a leak, or a fault never undone (a stopped one)
        print(f"bench_suite: the run left {len(left)} process(es) behind in {group}:", flush=True)
        for line in left:
            print(f"  {line}", flush=True)
    else:
        for child in group.iterdir():
            if child.is_dir():
                child.rmdir()
        group.rmdir()
    records = [json.loads(line) for f in sorted(out.glob("*.jsonl"))
               for line in f.read_text().splitlines()]
    return {"command": command, "repo": repo.name, "commit": _commit(repo), "rc": rc,
            "date": datetime.date.today().isoformat(), "wall_s": wall_s, "load": load,
            "cpus": cpus, "throttled_s": cap.throttled_s if cap else None,
            "suite_cpu_s": suite_s, "docker_cpu_s": docker_s, "engine_cpu_s": engine_s,
            "total_cpu_s": suite_s + docker_s + engine_s, "left_behind": left,
            "processes": _proc_acct.census(_proc_acct.parse(pacct.read_bytes())) if pacct
            else None, "tests": records}


def leftovers(group: Path) -> list[str]:
    """``pid state command`` of each process still in ``group`` or a child group of it."""
    import psutil

    out = []
    for procs in [group / "cgroup.procs", *group.glob("*/cgroup.procs")]:
        for pid in procs.read_text().split():
            try:
                p = psutil.Process(int(pid))
                out.append(f"{pid} {p.status()} {' '.join(p.cmdline())[:160]}")
            except psutil.Error:
                pass
    return out


def _commit(repo: Path) -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True,
                          text=True, check=False).stdout.strip() or "unknown"


def per_test(run: dict[str, Any]) -> dict[str, float]:
    shares = share_docker(run["tests"])
    return {r["nodeid"]: r["cpu_s"] + shares.get(r["nodeid"], 0.0) for r in run["tests"]}


def per_file(run: dict[str, Any]) -> dict[str, float]:
    files: dict[str, float] = collections.defaultdict(float)
    for nodeid, cpu in per_test(run).items():
        files[file_of(nodeid)] += cpu
    return files


def render(run: dict[str, Any], top: int, before: dict[str, Any] | None) -> None:
    setup = [f"`{run['command']}`, commit {run['commit']}, exit {run['rc']}, "
             f"{len(run['tests'])} tests, {run['load']} busy loop(s) beside it, "
             + (f"capped at {run['cpus']:g} CPU(s) (throttled {run['throttled_s']:.0f} s), "
                if run.get("cpus") else "") + run["date"]]
    if before:
        setup.append(f"before: commit {before['commit']}, {len(before['tests'])} tests, "
                     f"{before['load']} busy loop(s), {before['date']}")
    rows = [("pytest and every process it started", "suite_cpu_s"),
            ("Docker containers (docker and Slurm nodes)", "docker_cpu_s"),
            ("Docker engine daemons", "engine_cpu_s"), ("total CPU-s", "total_cpu_s"),
            ("wall s", "wall_s")]
    headers = ["what", *(["before"] if before else []), "CPU-s", *(["ratio"] if before else [])]
    table = []
    for label, key in rows:
        row = [label] + ([f"{before[key]:.0f}"] if before else []) + [f"{run[key]:.0f}"]
        if before:
            row.append(f"{run[key] / before[key]:.2f}" if before[key] else "—")
        table.append(row)
    charged = sum(per_test(run).values())
    print_table("Suite CPU-seconds", setup, headers, table, [
        f"{charged:.0f} CPU-s are charged to tests (setup, call, teardown); the rest is "
        "pytest's start-up and collection, xdist and the engine daemons"])
    files = sorted(per_file(run).items(), key=lambda kv: -kv[1])[:15]
    counts = collections.Counter(file_of(r["nodeid"]) for r in run["tests"])
    print_table("Suite CPU-seconds by file", setup, ["file", "tests", "CPU-s"],
                [[f, str(counts[f]), f"{s:.0f}"] for f, s in files])
    if run.get("processes"):
        print_table("Processes the run ended, by kind (process accounting)", setup,
                    ["kind", "processes", "CPU-s", "CPU-s each"],
                    [[k, str(n), f"{c:.0f}", f"{c / n:.2f}"] for k, n, c in run["processes"]],
                    ["every process the machine ended while the suite ran, Docker and Slurm "
                     "nodes' included"])
    tests = sorted(per_test(run).items(), key=lambda kv: -kv[1])[:top]
    wall = {r["nodeid"]: r["t1"] - r["t0"] for r in run["tests"]}
    print_table("Suite CPU-seconds by test", setup, ["test", "CPU-s", "wall s"],
                [[n if len(n) <= 110 else n[:109] + "…", f"{s:.1f}", f"{wall[n]:.0f}"]
                 for n, s in tests])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=HERE.parent, help="the checkout to measure")
    ap.add_argument("--load", type=int, default=0, help="busy loops beside the suite")
    ap.add_argument("--top", type=int, default=25, help="rows of the per-test table")
    ap.add_argument("--out", type=Path, help="write every test's figures here (JSON)")
    ap.add_argument("--log", type=Path, help="pytest's output (default: a temporary file)")
    ap.add_argument("--from", dest="from_", type=Path,
                    help="print the tables of a run saved with --out instead of running")
    ap.add_argument("--before", type=Path, help="a run saved with --out to compare against")
    ap.add_argument("--cpus", type=float,
                    help="cap the run, its containers included, at this many CPUs")
    ap.add_argument("--processes", action="store_true",
                    help="count the processes the run ends, by kind (process accounting; root)")
    ap.add_argument("pytest_args", nargs="*", help="instead of make test's, after --")
    args = ap.parse_args()
    if args.from_:
        run = json.loads(args.from_.read_text())
    else:
        run = measure(args.repo.resolve(), args.pytest_args, args.load, args.log,
                      args.processes, args.cpus)
        if args.out:
            args.out.write_text(json.dumps(run, indent=1))
    render(run, args.top, json.loads(args.before.read_text()) if args.before else None)
    return int(run["rc"])


if __name__ == "__main__":
    sys.exit(main())
