"""``bench_suite.py --cpus N`` (``benchmarks/_cpu_cap.py``): a process tree in the cap's group
gets N CPUs' worth of time and no more, whatever it asks for, and the groups go away after it.

Moving Docker's containers into the cap is machine-wide (it would move the containers of a
suite running beside this test), so this test leaves it off; the real path ran in the capped
suite runs of docs/development.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from _cpu_cap import PERIOD_US, CpuCap  # noqa: E402
from _suite_cpu import usage_s  # noqa: E402

SPIN_CPU_S = 0.6  # per thread, of its own CPU time: the work is fixed, the wall time is not
BUSY = f"""\
import threading, time
def spin():
    while time.thread_time() < {SPIN_CPU_S}:
        pass
threads = [threading.Thread(target=spin) for _ in range(2)]
[t.start() for t in threads]
[t.join() for t in threads]
"""


def _accounting_group() -> Path:
    for root in (Path("/sys/fs/cgroup/cpuacct"), Path("/sys/fs/cgroup")):
        if (root / "cpuacct.usage").exists() or (root / "cgroup.controllers").exists():
            return root / f"faultlab-cap-test-{os.getpid()}"
    pytest.skip("no cgroup v1 cpuacct hierarchy and no cgroup v2 here: nothing to cap with")


def test_a_capped_tree_gets_its_share_and_no_more() -> None:
    if os.geteuid() != 0:
        pytest.skip("capping a process tree with a control group needs root")
    group = _accounting_group()
    group.mkdir()
    cap = CpuCap(0.5, group, group.parent / "docker", move_containers=False)
    try:
        def enter() -> None:
            (group / "cgroup.procs").write_text(str(os.getpid()))
            cap.enter(str(os.getpid()))

        started = time.monotonic()
        busy = subprocess.run([sys.executable, "-c", BUSY], preexec_fn=enter, timeout=120,
                              check=True)
        wall = time.monotonic() - started
        assert busy.returncode == 0
        used = usage_s(group)
    finally:
        cap.close()
        group.rmdir()
    # The tree did its fixed work (two threads, SPIN_CPU_S each, and the interpreter's start)...
    assert used >= 2 * SPIN_CPU_S, used
    # ...and got no more than half a CPU for it: in each period of PERIOD_US the group runs at
    # most half of it, so `used` CPU-seconds need at least 2 * used - one period of wall time.
    # A slower or busier machine only makes the wall time longer; without the cap, two threads
    # on two cores do the work in about a third of that.
    assert wall >= 2 * used - PERIOD_US / 1e6, (wall, used)
    assert not group.exists() and not cap.group.exists()
