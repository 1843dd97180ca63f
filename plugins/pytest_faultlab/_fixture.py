"""The ``faultlab`` fixture's object: runs experiments from Python with the session's
settings and records their metrics on the calling test (JUnit XML properties)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from faultlab.errors import InvalidExperimentError
from pytest_faultlab._items import (
    NotesView,
    invalid_text,
    record_properties,
    settings_key,
    sla_table,
)
from pytest_faultlab._messages import BAD_EXPERIMENT_ARG, SUITE_IN_RUN

__all__ = ["FaultlabRunner"]


class FaultlabRunner:
    """``faultlab.run(experiment)`` → ``RunResult``.

    ``experiment`` is a dict (validated like a YAML document; problems are located at the
    test, e.g. ``test_x.py::test_y faults[0].trigger.at_step: ...``), a path to a YAML file
    (relative to the test file's folder), or an ``Experiment``. Keyword arguments override
    the session's settings for this run: ``seed``, ``report_dir``, ``golden_cache``.
    """

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._node = request.node
        self.settings = request.config.stash[settings_key]
        self.results: list[Any] = []
        """Every ``RunResult`` of this test, in order."""

    def load(self, experiment: Any, *, seed: int | None = None) -> tuple[Any, Path | None]:
        """``(Experiment, source file or None)``; raises ``InvalidExperimentError``."""
        from faultlab.spec import Experiment, experiment_from_dict, load_experiments

        seed = self.settings.seed if seed is None else seed
        if isinstance(experiment, Experiment):
            return (experiment if seed is None else
                    experiment.model_copy(update={"seed": seed})), None
        if isinstance(experiment, Mapping):
            return experiment_from_dict(experiment, file=self._node.nodeid, seed=seed), None
        if isinstance(experiment, str | os.PathLike):
            path = Path(experiment)
            if not path.is_absolute():
                path = Path(self._node.path).parent / path
            found = load_experiments([path], seed=seed)
            if len(found) != 1:
                pytest.fail(SUITE_IN_RUN.format(path=path, count=len(found)), pytrace=False)
            return found[0][1], found[0][0]
        raise TypeError(BAD_EXPERIMENT_ARG.format(value=repr(experiment)[:200]))

    def run(self, experiment: Any, *, seed: int | None = None,
            report_dir: str | os.PathLike[str] | None = None,
            golden_cache: str | os.PathLike[str] | None = None) -> Any:
        """Run one experiment and return its ``RunResult`` (it does not fail the test by
        itself: assert on ``result.passed`` or call ``assert_passed``). An invalid
        experiment fails the test with its located problems, no traceback."""
        from faultlab.engine import run_experiment

        try:
            exp, source = self.load(experiment, seed=seed)
        except InvalidExperimentError as e:
            pytest.fail(invalid_text(e), pytrace=False)
        view = NotesView()
        result = run_experiment(
            exp, source=source,
            report_dir=Path(report_dir) if report_dir is not None else self.settings.report_dir,
            golden_cache=(Path(golden_cache) if golden_cache is not None
                          else self.settings.golden_cache),
            view=view)
        record_properties(self._node.user_properties, result)
        self.results.append(result)
        return result

    @staticmethod
    def assert_passed(result: Any) -> None:
        """Fail the test with the SLA table (no traceback) unless every SLA held."""
        if not result.passed:
            pytest.fail(sla_table(result), pytrace=False)

    sla_table = staticmethod(sla_table)
