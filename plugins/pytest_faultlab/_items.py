"""Experiment YAML files as pytest items, and the text an SLA failure shows."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from faultlab.errors import FaultlabError, InvalidExperimentError
from pytest_faultlab._messages import (
    INCONCLUSIVE,
    INVALID_EXPERIMENT,
    JOURNAL,
    REPEAT_FAILED,
    REPEAT_INCONCLUSIVE,
    RUN_ERROR,
    SLA_FAILED,
    STOPPED_BEFORE_LAUNCH,
)
from pytest_faultlab._options import Settings

__all__ = ["ExperimentFailed", "ExperimentFile", "ExperimentItem", "hang_guard_s",
           "looks_like_experiment", "record_properties", "repeat_table", "sla_table",
           "settings_key"]

settings_key = pytest.StashKey[Settings]()


def looks_like_experiment(path: Path) -> bool:
    """Cheap check for YAML found under ``faultlab_experiments``: a mapping with ``name`` and
    ``faults`` or ``suite``. YAML that does not parse is collected (it fails, located):
    it lies where experiments are kept, so it is most likely a broken one."""
    try:
        data = yaml.safe_load(path.read_bytes())
    except (OSError, yaml.YAMLError):
        return True
    return isinstance(data, dict) and "name" in data and ("faults" in data or "suite" in data)


class ExperimentFailed(FaultlabError):
    """An experiment ran and an SLA failed, the run broke, or it was inconclusive (a
    correctness SLA not measured: not a pass); carries the ``RunResult`` (a ``RepeatResult``
    under ``faultlab_repeat``). In ``faultlab.errors``' tree, though defined here: faultlab never
    imports its plugins, and the message is this plugin's table."""

    def __init__(self, result: Any, notes: list[str]) -> None:
        self.result = result
        self.notes = notes
        super().__init__(repeat_table(result) if hasattr(result, "summary")
                         else sla_table(result))


class ExperimentFile(pytest.File):
    """One experiment document: an item per experiment (a suite's members, in order)."""

    def collect(self) -> Iterator[pytest.Item]:
        from faultlab.spec import load_experiments

        settings = self.config.stash[settings_key]
        shown = _shown(self.path, self.config.invocation_params.dir)
        try:
            experiments = load_experiments([shown], seed=settings.seed)
        except InvalidExperimentError as e:
            yield ExperimentItem.from_parent(self, name=_name_of(self.path), experiment=None,
                                             source=shown, problem=e)
            return
        seen: dict[str, int] = {}
        for source, exp in experiments:
            seen[exp.name] = seen.get(exp.name, 0) + 1
            name = exp.name if seen[exp.name] == 1 else f"{exp.name}[{seen[exp.name]}]"
            yield ExperimentItem.from_parent(self, name=name, experiment=exp, source=source,
                                             problem=None)


class ExperimentItem(pytest.Item):
    """Runs one experiment; passes when every SLA holds (an inconclusive verdict fails it,
    saying which SLA could not be measured and what to add)."""

    def __init__(self, *, experiment: Any, source: Path,
                 problem: InvalidExperimentError | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.experiment = experiment
        self.source = source
        self.problem = problem
        if experiment is not None and self.config.pluginmanager.hasplugin("timeout"):
            # The repo-wide timeout (e.g. 120 s) is for unit tests; an experiment bounds
            # itself with run.timeout_s, once per run and per golden run it may need first.
            self.add_marker(pytest.mark.timeout(hang_guard_s(
                experiment, runs=self.config.stash[settings_key].repeat,
                campaign=_is_campaign(source))))

    def runtest(self) -> None:
        if self.problem is not None:
            raise self.problem
        from faultlab.engine import run_experiment
        from faultlab.testing import require_target

        require_target(self.experiment.topology.launcher)  # docker: skip without an engine
        settings = self.config.stash[settings_key]
        view = NotesView()
        if settings.repeat > 1:
            self._run_repeated(settings, view)
            return
        from faultlab.spec import load_campaign

        campaign = load_campaign(self.source, seed=settings.seed)
        if campaign is not None:  # its experiment, scored; the campaign SLAs in the verdict
            from faultlab.engine.campaign import run_campaign

            result = run_campaign(campaign[0], source=self.source, line=campaign[1],
                                  report_dir=settings.report_dir,
                                  golden_cache=settings.golden_cache, view=view).result
        else:
            result = run_experiment(self.experiment, source=self.source,
                                    report_dir=settings.report_dir,
                                    golden_cache=settings.golden_cache, view=view)
        record_properties(self.user_properties, result)
        if not result.passed:
            raise ExperimentFailed(result, view.notes)

    def _run_repeated(self, settings: Settings, view: NotesView) -> None:
        """``faultlab_repeat`` runs, judged together; the notes of failed runs are kept."""
        from faultlab.engine.repeat import run_repeated

        def view_of(index: int) -> NotesView:
            view.note(f"run {index}/{settings.repeat}")
            return view

        outcome = run_repeated(self.experiment, settings.repeat,
                               min_pass_rate=settings.min_pass_rate, source=self.source,
                               report_dir=settings.report_dir,
                               golden_cache=settings.golden_cache, view_factory=view_of)
        record_repeat_properties(self.user_properties, outcome)
        if not outcome.passed:
            raise ExperimentFailed(outcome, view.notes)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: Any = None) -> str | Any:
        if isinstance(excinfo.value, InvalidExperimentError):
            return invalid_text(excinfo.value)
        if isinstance(excinfo.value, ExperimentFailed):
            notes = "\n".join(f"  {n}" for n in excinfo.value.notes)
            return str(excinfo.value) + (f"\nwhat happened:\n{notes}" if notes else "")
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"faultlab experiment {self.name}"


GUARD_REST_S = 120
"""What a run costs besides its job, bounded: the engine's start, judging, clean-up."""


def hang_guard_s(experiment: Any, *, runs: int = 1, campaign: bool = False) -> float:
    """How long a test that runs ``experiment`` ``runs`` times may take before pytest-timeout
    calls it hung: each run, and each golden run it may need first (a campaign always needs
    one), is bounded by the experiment's own ``run.timeout_s``, a configured timer; the rest
    is ``GUARD_REST_S``. Derived from the experiment, never from one machine's clock."""
    golden = 1 if campaign else getattr(experiment, "golden_runs", 1)
    return (runs + golden) * experiment.run.timeout_s + GUARD_REST_S


def _is_campaign(source: Path) -> bool:
    from faultlab.spec import load_campaign

    try:
        return load_campaign(source) is not None
    except InvalidExperimentError:
        return False


class NotesView:
    """Keeps the engine's notes (fault injected, undone, timeout) for a failure message."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def start(self, name: str, total_steps: int | None) -> None: ...
    def on_events(self, records: list[dict[str, Any]]) -> None: ...
    def stop(self) -> None: ...

    def note(self, message: str) -> None:
        self.notes.append(message)


def invalid_text(error: InvalidExperimentError) -> str:
    lines = [INVALID_EXPERIMENT.format(count=len(error.problems))]
    lines += [f"  {p}" for p in error.problems]
    return "\n".join(lines)


_RESULT_WORDS = {"pass": "pass", "fail": "FAIL", "inconclusive": "INCONCLUSIVE",
                 "covered": "covered"}


def _fmt(value: Any) -> str:
    if value is None:
        return "not measured"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def sla_table(result: Any) -> str:
    """The SLA table as plain text: name, bound, measured, result, note; then the journal."""
    from faultlab.judge import SLA_KINDS

    failed = len(result.failures())
    head = SLA_FAILED.format(name=result.name, failed=failed, total=len(result.slas)) \
        if not result.passed else f"{result.name}: PASS"
    if result.verdict == "inconclusive":
        head = INCONCLUSIVE.format(name=result.name, names=", ".join(
            s.name for s in result.slas if s.result == "inconclusive"))
    if not result.slas:  # the engine stopped before the launch; the error says why
        head = STOPPED_BEFORE_LAUNCH.format(name=result.name)
    rows = [("SLA", "bound", "measured", "result", "note")] if result.slas else []
    for s in result.slas:
        op = {"max": "<= ", "min": ">= "}.get(SLA_KINDS.get(s.name, "bool"), "")
        rows.append((s.name, op + str(s.bound), _fmt(s.measured),
                     _RESULT_WORDS.get(s.result, s.result), s.note))
    widths = [max((len(r[i]) for r in rows), default=0) for i in range(4)]
    lines = [head]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True))
                     + ("  " + r[4] if r[4] else "").rstrip())
    if result.error:
        lines.append(RUN_ERROR.format(error=result.error))
    lines.append(JOURNAL.format(path=result.journal_path))
    return "\n".join(line.rstrip() for line in lines)


def repeat_table(outcome: Any) -> str:
    """A repeated experiment's failure: stability, each SLA over the runs, the record."""
    from faultlab.report.repeats import SLA_HEADER, spread_rows

    summary = outcome.summary.to_dict()
    rows = [SLA_HEADER, *spread_rows(summary)[0]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(SLA_HEADER))]
    head = REPEAT_INCONCLUSIVE if summary["verdict"] == "inconclusive" else REPEAT_FAILED
    lines = [head.format(name=outcome.name, num_runs=summary["num_runs"],
                         stability=summary["stability"])]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
              for r in rows]
    for result in outcome.results:
        if not result.passed:
            unmeasured = [s for s in result.slas if s.result == "inconclusive"]
            why = "; ".join(s.describe() for s in result.failures() or unmeasured) \
                or result.error or ""
            lines.append(f"{'inconclusive' if result.verdict == 'inconclusive' else 'failed'}"
                         f" run {result.run_folder.name}: {why}")
    lines.append(JOURNAL.format(path=outcome.record_path))
    return "\n".join(lines)


def record_repeat_properties(props: list[tuple[str, object]], outcome: Any) -> None:
    """JUnit XML of a repeated item: the set's verdict and stability, each metric's median
    and p95, and the record's path."""
    summary = outcome.summary
    props.append(("faultlab.verdict", summary.verdict))
    props.append(("faultlab.journal", str(outcome.record_path)))
    props.append(("faultlab.repeat.num_runs", summary.num_runs))
    props.append(("faultlab.repeat.num_passed", summary.num_passed))
    props.append(("faultlab.repeat.num_inconclusive", summary.num_inconclusive))
    props.append(("faultlab.repeat.min_pass_rate", float(summary.min_pass_rate)))
    for m in summary.metrics:
        props.append((f"faultlab.{m.name}.median", _prop(m.median)))
        props.append((f"faultlab.{m.name}.p95", _prop(m.p95)))


def record_properties(props: list[tuple[str, object]], result: Any) -> None:
    """What JUnit XML carries: the verdict, every metric and every SLA's measurement."""
    props.append(("faultlab.verdict", result.verdict))
    props.append(("faultlab.journal", str(result.journal_path)))
    for key, value in result.metrics.to_dict().items():
        if key == "faults":
            continue
        props.append((f"faultlab.{key}", _prop(value)))
    for fm in result.metrics.faults:
        for key, value in dataclasses.asdict(fm).items():
            if key != "fault_id":
                props.append((f"faultlab.fault.{fm.fault_id}.{key}", _prop(value)))
    for s in result.slas:
        props.append((f"faultlab.sla.{s.name}.bound", _prop(s.bound)))
        props.append((f"faultlab.sla.{s.name}.measured", _prop(s.measured)))
        props.append((f"faultlab.sla.{s.name}.result", s.result))


def _prop(value: Any) -> object:
    if value is None:
        return "not measured"
    if isinstance(value, bool | int | float | str):
        return value
    return str(value)


def _shown(path: Path, cwd: Path) -> Path:
    """The path as a person would type it: relative to the current folder when inside it
    (messages then read ``experiments/rank_kill.yaml:14 ...``, as from ``faultlab validate``)."""
    try:
        return path.relative_to(cwd)
    except ValueError:
        return path


def _name_of(path: Path) -> str:
    """The experiment's name for an item whose document is invalid (its stem otherwise)."""
    try:
        data = yaml.safe_load(path.read_bytes())
    except (OSError, yaml.YAMLError):
        return path.stem
    name = data.get("name") if isinstance(data, dict) else None
    return name if isinstance(name, str) and name.strip() else path.stem
