"""Runs one experiment once per value of a swept parameter (``faultlab sweep``): a detection
curve.

Each point is a real, independent run (``run_experiment``, as ``faultlab run`` does), in its
own folder under ``<sweep folder>/runs/``, in the order of the points. Only the golden run is
shared: the fault-free run does not depend on the fault's magnitude (its cache key has no
fault in it, ``faultlab.engine.golden``), so the first point computes it (or finds it cached)
and every other point reads it, as ``--repeat`` does.

After every point the record (``faultlab.report.sweep``: sweep.json, sweep.md, sweep.png) is
rewritten with the points so far, so an interrupted sweep still says what it measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faultlab.engine.golden import golden_cache_for
from faultlab.engine.runner import RunResult, run_experiment
from faultlab.engine.view import View
from faultlab.report.journal import read_journal
from faultlab.report.sweep import point_record, write_sweep
from faultlab.spec.sweep import SweepPoint

__all__ = ["SweepResult", "run_sweep"]


@dataclass
class SweepResult:
    record: dict[str, Any]
    results: list[RunResult]
    folder: Path

    @property
    def failed_points(self) -> list[dict[str, Any]]:
        """The points that could not run (their error said in the record)."""
        return [p for p in self.record["points"] if p["error"]]


def run_sweep(points: Sequence[SweepPoint], folder: Path, *, param: dict[str, Any],
              source: Path | None = None, report_dir: Path = Path("reports"),
              golden_cache: Path | None = None,
              view_factory: Callable[[SweepPoint], View] | None = None,
              on_point: Callable[[SweepPoint, RunResult, dict[str, Any]], None] | None = None
              ) -> SweepResult:
    """Run every point into ``folder/runs`` and write the sweep's record after each.

    ``param`` is the record's ``param`` entry (path, scale, values). The golden cache is the
    one ``faultlab run`` would use for ``report_dir``. ``on_point(point, result, row)`` is
    called after each point with its row of the record. Raises KeyboardInterrupt (its argument
    the ``SweepResult`` so far) after the interrupted run was cleaned up and the record
    written."""
    exp = points[0].experiment
    golden_cache = golden_cache_for(exp, golden_cache, report_dir)
    started_t = time.time()
    results: list[RunResult] = []
    rows: list[dict[str, Any]] = []

    def record(interrupted: bool) -> dict[str, Any]:
        golden = next((r.golden for r in results if r.golden is not None), None)
        return write_sweep(folder, {
            "experiment": {"name": exp.name, "file": str(source) if source else None,
                           "seed": exp.seed, "description": exp.description},
            "param": param, "started_t": started_t, "ended_t": time.time(),
            "wall_s": time.time() - started_t, "interrupted": interrupted,
            "num_points": len(points),
            "golden": None if golden is None else {"key": golden.key, "digest": golden.digest},
            "points": rows})

    def add(point: SweepPoint, result: RunResult) -> None:
        results.append(result)
        try:
            journal = read_journal(result.run_folder)
        except (OSError, ValueError):  # no journal: the point could not run at all
            journal = {}
        rows.append(point_record(point.index, point.value, journal,
                                 run_folder=str(result.run_folder.relative_to(folder)),
                                 error=result.error))

    for point in points:
        view = view_factory(point) if view_factory else None
        try:
            result = run_experiment(point.experiment, source=source,
                                    report_dir=folder / "runs", golden_cache=golden_cache,
                                    view=view)
        except KeyboardInterrupt as e:
            if e.args and isinstance(e.args[0], RunResult):
                add(point, e.args[0])
            raise KeyboardInterrupt(SweepResult(record(interrupted=True), results,
                                                folder)) from None
        add(point, result)
        if on_point is not None:
            on_point(point, result, rows[-1])
        record(interrupted=False)
    return SweepResult(record(interrupted=False), results, folder)
