"""A failure that the machine caused, not the code, says so in its first line, naming the resource
(``resource: disk full: ...``): at the session's start, before any test runs, and in the report
of a test that failed for it. A plugin of the suite's own (``tests/conftest.py`` loads it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

MIN_FREE_GIB = 2.0
"""Free disk the suite needs where it writes: its temporary folders, ``reports/`` and Docker's
images. A run kept about 0.4 GiB of checkpoints, logs and journals (2026-11-28).
``FAULTLAB_TEST_MIN_FREE_GIB`` overrides it (this file's own tests)."""

REPO = Path(__file__).resolve().parents[1]


def disk_problems() -> list[str]:
    """Each place the suite writes that has less than ``MIN_FREE_GIB`` free, said as such."""
    import tempfile

    problems = []
    for where in dict.fromkeys([Path(tempfile.gettempdir()), REPO, Path("/var/lib/docker")]):
        if not where.exists():
            continue
        st = os.statvfs(where)
        free_gib = st.f_bavail * st.f_frsize / 2**30
        needed = float(os.environ.get("FAULTLAB_TEST_MIN_FREE_GIB", MIN_FREE_GIB))
        if free_gib < needed:
            problems.append(f"disk full: {where} has {free_gib:.2f} GiB free, the suite needs "
                            f"{needed:g} GiB")
    return problems


def pytest_sessionstart(session: pytest.Session) -> None:
    """Before any test: what the machine lacks stops the run at once, its first line naming
    the resource (not a timeout in a test minutes later). Docker is checked here only where CI
    requires it (``FAULTLAB_REQUIRE_DOCKER=1``); elsewhere its tests skip, saying why."""
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller checked (PYTEST_XDIST_WORKER would also be
        # set in a pytest a worker's test starts, which must check for itself)
    problems = disk_problems()
    if os.environ.get("FAULTLAB_REQUIRE_DOCKER") == "1":
        from faultlab.targets.docker.engine import engine_problem

        if (engine := engine_problem()) is not None:
            problems.append(f"docker engine (FAULTLAB_REQUIRE_DOCKER=1): {engine}")
    if problems:
        pytest.exit("resource: " + "; ".join(problems), returncode=pytest.ExitCode.USAGE_ERROR)


RESOURCE_SIGNS = {
    "No space left on device": lambda: "; ".join(disk_problems()),
    "Address already in use": lambda: "a port was already in use (EADDRINUSE): another process "
                                      "on this machine, or one a run left behind, holds it",
}
"""Text in a failure → what the machine lacked; an empty answer: the machine had it (a disk with
room again, where a test filled its own small one on purpose), so the failure is the code's."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failure that the machine caused says so in its first line: ``resource: ...``."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    text = report.longreprtext
    for sign, lacked in RESOURCE_SIGNS.items():
        if sign in text and (why := lacked()):
            report.longrepr = f"resource: {why}\n\n{text}"
            return
