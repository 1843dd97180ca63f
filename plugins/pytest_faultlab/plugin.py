"""faultlab's pytest plugin (entry point ``pytest11``, name ``faultlab``).

Experiments as test items::

    pytest experiments/rank_kill.yaml                 # a YAML file given on the command line
    pytest --faultlab-experiments experiments -n 2    # every experiment under these paths
    pytest experiments/prelaunch.yaml                 # a suite: one item per member

An item is named after its experiment and passes when every SLA holds. A failing item shows
the SLA table (SLA, bound, measured, result, note), what the engine did and the journal path,
without a traceback. An inconclusive run (nothing failed, but a correctness SLA could not be
measured: two fault-free runs that differ, golden runs that went NaN) fails its item too: its
head line says ``INCONCLUSIVE`` and names the SLA, whose note says what to add. An invalid
document is one failing item listing its located problems (``x.yaml:14
faults[0].trigger.at_step: ...``), nothing is run. YAML is collected only when given on the
command line, or when it lies under a ``faultlab_experiments`` path and looks like an
experiment (a mapping with ``name`` and ``faults`` or ``suite``), so a plain ``pytest`` never
starts collecting other YAML. JUnit XML (``--junitxml``) carries ``faultlab.verdict`` (``pass``,
``fail`` or ``inconclusive``), ``faultlab.journal``, every metric as ``faultlab.<metric>``
(``faultlab.resume_time_s``, ...), per fault ``faultlab.fault.<id>.<metric>``, and per SLA
``faultlab.sla.<name>.bound``, ``.measured`` and ``.result`` (``pass``, ``fail``,
``inconclusive`` or ``covered``).

Settings, each a flag and an ini key (the flag wins; ini paths are relative to the ini file,
flag paths to the current folder; a bad value stops pytest and says where it came from):

    --faultlab-report-dir DIR     faultlab_report_dir     run folders (default <rootdir>/reports)
    --faultlab-golden-cache DIR   faultlab_golden_cache   golden runs (default REPORT_DIR/.golden;
                                                          on Slurm the shared runs root's)
    --faultlab-seed N             faultlab_seed           overrides every experiment's seed
    --faultlab-experiments PATH.. faultlab_experiments    files/folders collected as items
    --faultlab-repeat N           faultlab_repeat         runs per experiment item (default 1)
    --faultlab-min-pass-rate R    faultlab_min_pass_rate  with a repeat: the fraction of runs
                                                          that must pass (0.95 or 95%; default
                                                          every run)

With ``faultlab_repeat`` N > 1 an experiment item runs N independent times (as ``faultlab run
--repeat N``: one set folder, each run its own folder, the golden run computed once) and passes
when every run passed, or ``faultlab_min_pass_rate`` of them; a failing item shows the
stability (``3/5 passed ...``), each SLA's median, tail and headroom against its bound, and why
each failed run failed. JUnit XML then carries ``faultlab.repeat.num_runs``, ``.num_passed``,
``.num_inconclusive``, ``.min_pass_rate`` and every metric's ``faultlab.<metric>.median`` and
``.p95``; the ``faultlab`` fixture and the marker run once per call either way.

Paths of the flag are always collected; those of the ini key only when pytest was given no
paths (a plain ``pytest`` runs ``testpaths`` and the experiments).

From Python, the ``faultlab`` fixture (see ``FaultlabRunner``)::

    def test_kill(faultlab):
        result = faultlab.run("rank_kill.yaml", seed=3)     # or a dict, or an Experiment
        assert result.metrics.lost_steps <= 5
        journal = json.loads(result.journal_path.read_text())
        faultlab.assert_passed(result)                      # fails with the SLA table

and experiments declared next to a test with the marker, whose ``RunResult`` arrives as
``faultlab_result`` (the marker without that argument is an error: it would run nothing)::

    @pytest.mark.faultlab_experiment({"name": "kill", ..., "expect": {"completes": True}})
    def test_kill(faultlab_result):
        assert faultlab_result.passed, faultlab_result.failures()

xdist: ``-n 2`` is safe. Each item gets its own run folder (``<name>-<timestamp>[-N]``,
created atomically), its own rendezvous store on a free port, its own torchrun master port and
job folder; golden runs are shared through a per-key file lock. ``python
benchmarks/bench_soak.py`` runs every experiment CI runs N times, two at a time, and prints pass
rates, the spread of recovery and any collision between concurrent runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_faultlab._fixture import FaultlabRunner
from pytest_faultlab._items import (
    ExperimentFailed,
    ExperimentFile,
    ExperimentItem,
    looks_like_experiment,
    repeat_table,
    settings_key,
    sla_table,
)
from pytest_faultlab._messages import (
    BAD_DIRECTORY,
    BAD_EXPERIMENT_ARG,
    BAD_INTEGER,
    BAD_MARKER,
    BAD_PASS_RATE,
    BAD_REPEAT,
    INCONCLUSIVE,
    INVALID_EXPERIMENT,
    JOURNAL,
    MARKER_HELP,
    MARKER_WITHOUT_FIXTURE,
    MISSING_PATH,
    NO_MARKER,
    PASS_RATE_WITHOUT_REPEAT,
    REPEAT_FAILED,
    REPEAT_INCONCLUSIVE,
    RUN_ERROR,
    SLA_FAILED,
    STOPPED_BEFORE_LAUNCH,
    SUITE_IN_RUN,
)
from pytest_faultlab._options import OPTIONS, Settings, add_options, read_settings

__all__ = [
    "BAD_DIRECTORY",
    "BAD_EXPERIMENT_ARG",
    "BAD_INTEGER",
    "BAD_MARKER",
    "BAD_PASS_RATE",
    "BAD_REPEAT",
    "INCONCLUSIVE",
    "INVALID_EXPERIMENT",
    "JOURNAL",
    "MARKER_WITHOUT_FIXTURE",
    "MISSING_PATH",
    "NO_MARKER",
    "OPTIONS",
    "PASS_RATE_WITHOUT_REPEAT",
    "REPEAT_FAILED",
    "REPEAT_INCONCLUSIVE",
    "RUN_ERROR",
    "SLA_FAILED",
    "STOPPED_BEFORE_LAUNCH",
    "SUITE_IN_RUN",
    "ExperimentFailed",
    "ExperimentFile",
    "ExperimentItem",
    "FaultlabRunner",
    "Settings",
    "faultlab",
    "faultlab_result",
    "repeat_table",
    "sla_table",
]

MARKER = "faultlab_experiment"


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)
    settings = read_settings(config)
    config.stash[settings_key] = settings
    # Paths of the flag are always collected; those of the ini key when pytest was given no
    # paths. A path already inside an argument is found by the normal walk.
    if settings.experiments and (settings.experiments_from_flag
                                 or config.args_source != pytest.Config.ArgsSource.ARGS):
        base = config.invocation_params.dir
        given = [(base / a.split("::")[0]).resolve() for a in config.args]
        for path in settings.experiments:
            if not any(path == g or g in path.parents for g in given):
                config.args.append(str(path))


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> ExperimentFile | None:
    if file_path.suffix not in (".yaml", ".yml"):
        return None
    settings = parent.config.stash[settings_key]
    if not parent.session.isinitpath(file_path):
        resolved = file_path.resolve()
        if not settings.covers(resolved) or not looks_like_experiment(resolved):
            return None
    return ExperimentFile.from_parent(parent, path=file_path)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker(MARKER) is not None and \
            "faultlab_result" not in getattr(item, "fixturenames", ()):
        pytest.fail(MARKER_WITHOUT_FIXTURE.format(nodeid=item.nodeid), pytrace=False)


@pytest.fixture
def faultlab(request: pytest.FixtureRequest) -> FaultlabRunner:
    """Run faultlab experiments from a test: ``faultlab.run(dict | path | Experiment)``."""
    return FaultlabRunner(request)


@pytest.fixture
def faultlab_result(request: pytest.FixtureRequest, faultlab: FaultlabRunner) -> Any:
    """The ``RunResult`` of the test's ``@pytest.mark.faultlab_experiment(...)``."""
    marker = request.node.get_closest_marker(MARKER)
    if marker is None:
        pytest.fail(NO_MARKER.format(nodeid=request.node.nodeid), pytrace=False)
    if len(marker.args) != 1 or set(marker.kwargs) - {"seed"}:
        value = ", ".join([*map(repr, marker.args),
                           *(f"{k}={v!r}" for k, v in marker.kwargs.items())])
        pytest.fail(BAD_MARKER.format(nodeid=request.node.nodeid, value=value or "nothing"),
                    pytrace=False)
    try:
        return faultlab.run(marker.args[0], seed=marker.kwargs.get("seed"))
    except TypeError:  # not a dict, a path or an Experiment
        pytest.fail(BAD_MARKER.format(nodeid=request.node.nodeid,
                                      value=repr(marker.args[0])[:200]), pytrace=False)
