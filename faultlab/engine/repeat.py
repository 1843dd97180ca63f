"""Runs one experiment N times and judges the runs together (``faultlab run X --repeat N``).

Each repeat is a real, independent run: its own run folder under ``<set folder>/runs/``, its
own job directory, rendezvous store, ports and checkpoints, its own guard process; nothing of
one run is visible to the next. Only the golden run is shared: every repeat asks the same
golden cache (``faultlab.engine.golden``), so the first computes it (or finds it cached) and
the others read it; N repeats never compute N golden runs. The seed is the experiment's, the
same for every repeat: what varies between repeats is what a team cannot control (timing,
load), which is what the verdict's stability measures.

After every run the set's record (``faultlab.report.repeats``) is rewritten with the summary
so far, so an interrupted set still says what ran; an interrupted set never passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from faultlab.engine.golden import golden_cache_for
from faultlab.engine.runner import RunResult, new_run_folder, run_experiment
from faultlab.engine.view import View
from faultlab.judge.repeats import ALL_PASS, RepeatSummary, summarize
from faultlab.report.journal import read_journal
from faultlab.report.repeats import write_record
from faultlab.spec import Experiment

__all__ = ["RepeatResult", "run_repeated"]


@dataclass
class RepeatResult:
    name: str
    summary: RepeatSummary
    results: list[RunResult]
    folder: Path
    record_path: Path

    @property
    def verdict(self) -> str:
        return self.summary.verdict

    @property
    def passed(self) -> bool:
        return self.summary.passed


def run_repeated(exp: Experiment, repeat: int, *, min_pass_rate: Fraction = ALL_PASS,
                 source: Path | None = None, report_dir: Path = Path("reports"),
                 golden_cache: Path | None = None,
                 view_factory: Callable[[int], View] | None = None,
                 on_run: Callable[[int, RunResult], None] | None = None) -> RepeatResult:
    """Run ``exp`` ``repeat`` times into one set folder and judge the runs together.

    ``view_factory(i)`` gives the view of repeat ``i`` (1-based); ``on_run(i, result)`` is
    called after each. Raises KeyboardInterrupt (its argument the ``RepeatResult`` so far)
    after the interrupted run was cleaned up and the record written."""
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat!r}")
    folder = new_run_folder(report_dir, f"{exp.name}-x{repeat}")
    runs_dir = folder / "runs"
    golden_cache = golden_cache_for(exp, golden_cache, report_dir)  # not runs/'s: the user's
    started_t = time.time()
    results: list[RunResult] = []
    runs: list[dict[str, Any]] = []
    journals: list[dict[str, Any]] = []

    def record(interrupted: bool) -> tuple[RepeatSummary, Path]:
        summary = summarize(journals, min_pass_rate=min_pass_rate, interrupted=interrupted)
        golden = next((r.golden for r in results if r.golden is not None), None)
        path = write_record(folder, {
            "verdict": summary.verdict,
            "experiment": {"name": exp.name, "file": str(source) if source else None,
                           "seed": exp.seed, "description": exp.description,
                           "repeat": repeat},
            "started_t": started_t, "ended_t": time.time(), "wall_s": time.time() - started_t,
            "golden": None if golden is None else {"key": golden.key, "digest": golden.digest},
            "runs": runs, "summary": summary.to_dict()})
        return summary, path

    def add(index: int, result: RunResult) -> None:
        journal = read_journal(result.run_folder)
        journals.append(journal)
        results.append(result)
        runs.append({"index": index, "run_folder": str(result.run_folder.relative_to(folder)),
                     "verdict": result.verdict, "wall_s": journal["run"]["wall_s"],
                     "error": result.error})

    for index in range(1, repeat + 1):
        view = view_factory(index) if view_factory else None
        try:
            result = run_experiment(exp, source=source, report_dir=runs_dir,
                                    golden_cache=golden_cache, view=view)
        except KeyboardInterrupt as e:
            partial = e.args[0] if e.args and isinstance(e.args[0], RunResult) else None
            if partial is not None:
                add(index, partial)
            summary, path = record(interrupted=True)
            raise KeyboardInterrupt(RepeatResult(exp.name, summary, results, folder,
                                                 path)) from None
        add(index, result)
        if on_run is not None:
            on_run(index, result)
        record(interrupted=False)
    summary, path = record(interrupted=False)
    return RepeatResult(exp.name, summary, results, folder, path)
