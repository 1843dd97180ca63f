"""Fixtures shared by every test folder."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

# a failure the machine caused names the resource it lacked (tests/resources.py)
from resources import pytest_runtest_makereport, pytest_sessionstart  # noqa: F401

# Three xdist workers share two cores (make test's -n 3), so no job has the host to itself: its
# ranks get one OpenMP thread each (faultlab's launcher passes its own OMP_NUM_THREADS on:
# faultlab.targets.launcher.rank_threads), not the host's cores shared among the job's ranks,
# whose spinning threads cost a lone rank three times its CPU-seconds under the suite's load.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def session_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This test session's temporary folder, the same for every xdist worker (each worker's
    basetemp is <session>/popen-gwN): for runs that the workers share."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


REPO = Path(__file__).resolve().parents[1]

Cli = Callable[..., tuple[int, str]]
"""``cli(*args) -> (exit code, output)``."""


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Cli:
    """``cli(*args)``: ``faultlab ARGS`` (``faultlab.cli.main``) in this test's process, from
    the repository's root and 200 columns wide; its exit code and everything it printed. A
    test that signals or kills faultlab itself needs a subprocess; any other spares one: a
    second import of faultlab and torch, about 2 CPU-s."""
    from faultlab.cli import main

    monkeypatch.chdir(REPO)
    monkeypatch.setenv("COLUMNS", "200")

    def run(*args: str | Path) -> tuple[int, str]:
        capsys.readouterr()
        code = main([str(a) for a in args])
        said = capsys.readouterr()
        return code, said.out + said.err

    return run


@pytest.fixture(scope="session")
def golden_cache(pytestconfig: pytest.Config) -> Path:
    """faultlab's golden-run cache, the one the shipped experiments that ``make test`` runs as
    items use (the plugin's ``--faultlab-golden-cache``, by default ``reports/.golden``): the
    CLI, suite, Chaos Toolkit, example and Slurm tests and the trainer's integration tests
    (tests/integration/conftest.py) compare against the same fault-free runs as those items,
    so each of those runs once (entries are keyed by code version and written under a
    per-key lock, so the xdist workers share them)."""
    from pytest_faultlab._items import settings_key

    settings = pytestconfig.stash[settings_key]
    return settings.golden_cache or settings.report_dir / ".golden"


ONE_WORKER = "tests/slurm/"
"""Tests under this folder share one local Slurm cluster (scripts/slurm-cluster.sh): they must
run one at a time, on one xdist worker."""

ONE_WORKER_EACH = ("tests/report/test_docs_site.py",)
"""Files whose tests share a module-scoped fixture that costs more than the tests themselves
(the documentation site, built once with mkdocs, about 5 CPU-s): all of a file's tests go to
one xdist worker, so the fixture is made once, not once on each worker that gets one."""


REAL_JOB_GUARD_S = 2 * 300 + 120
"""pytest-timeout for a real-job test that names none of its own: the jobs it starts are each
bounded by their experiment's ``run.timeout_s``, at most 300 s in this suite, and such a test
runs a golden run and a run (``hang_guard_s`` of the pytest plugin, for one of 300 s). The
suite's 120 s is for unit tests: a real job with its golden run meets it on a machine half as
fast (docs/development.md)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest chains first, so that no worker starts one while the others have run out of
    work: the Slurm tests (one worker, about 12 minutes under CI load), then every test that
    launches real jobs (``integration`` and the shipped experiments), then the quick rest, which
    fills the gaps at the end. A stable sort: the same order on every xdist worker. A real-job
    test without a timeout of its own gets ``REAL_JOB_GUARD_S``."""
    for item in items:
        if item.get_closest_marker("integration") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(REAL_JOB_GUARD_S))

    def rank(item: pytest.Item) -> int:
        if item.nodeid.startswith(ONE_WORKER):
            return 0
        if item.get_closest_marker("integration") or ".yaml::" in item.nodeid:
            return 1
        return 2

    items.sort(key=rank)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``-n N``: xdist's ``load`` distribution, except that every test of ``ONE_WORKER`` goes to
    the same worker (one scope), in order, and so do the tests of each ``ONE_WORKER_EACH`` file.

    ``--dist loadgroup`` with ``xdist_group`` markers would say the same, but does not work
    with pytest 9.2 and pytest-xdist 3.8: xdist tags each test by appending ``@group`` to
    ``item._nodeid``, which pytest 9.2 no longer reads (``Node.nodeid`` is ``str(self._id)``),
    so the groups are silently ignored (seen in CI: two tests brought the cluster up at once).
    """
    if config.getvalue("dist") not in ("load", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OneWorkerForTheCluster(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(ONE_WORKER):
                return ONE_WORKER
            path = nodeid.split("::")[0]
            return path if path in ONE_WORKER_EACH else nodeid

    return OneWorkerForTheCluster(config, log)
