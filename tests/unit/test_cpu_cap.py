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
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from _cpu_cap import PERIOD_US, CpuCap  # noqa: E402
from _suite_cpu import usage_s  # noqa: E402

BUSY = """\
import threading, time
def spin():
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
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

        busy = subprocess.run([sys.executable, "-c", BUSY], preexec_fn=enter, timeout=60,
                              check=True)
        assert busy.returncode == 0
        used = usage_s(group)
    finally:
        cap.close()
        group.rmdir()
    # Two threads spinning for 2 s of wall time ask for up to 4 CPU-seconds; the cap grants
    # half a CPU: 1 s over the 2 s, and at most one period's quota more for the last period.
    assert 0.3 < used <= 0.5 * 2.0 + 0.5 * PERIOD_US / 1e6 + 0.1, used
    assert cap.throttled_s > 0.5, cap.throttled_s
    assert not group.exists() and not cap.group.exists()
