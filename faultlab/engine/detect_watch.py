"""The team's detection signals, watched live and scored after the run.

``DetectionWatcher`` runs inside the runner's poll loop: every ``POLL_S`` it reads only the new
bytes of each node's log (``logs/node*.log`` of the job directory), the nodes' exit codes as the
target reports them, and the globs of the ``file`` signals, and appends each match, stamped
when it was seen, to ``detections.jsonl`` in the run folder (``faultlab.observe.detections``).
It costs a ``stat`` per log and glob per poll, and reads each byte of a log once.

``detection_report`` scores them after the run (``faultlab.observe.detection_score``), with the
false alarms counted on what the golden run(s) left: their logs, events, files and exit codes
(``GoldenRun.exit_codes``), read again with the signals as they are now, so a changed
``observe.detections`` never reuses a stale count and a golden entry needs to store no count.
"""

from __future__ import annotations

import glob
import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from faultlab.observe.detection_score import DetectionReport, report_of
from faultlab.observe.detections import (
    DETECTIONS_FILE,
    POLL_S,
    Detection,
    anomaly_detections,
    exclusion_detections,
    exit_detections,
    line_detections,
)
from faultlab.observe.records import FaultRecord, Record
from faultlab.runtime.events import read_events
from faultlab.spec import Experiment
from faultlab.spec.observation import DetectionSignal

__all__ = ["DetectionWatcher", "detection_report", "finished_run_counts", "wants_detection"]


def wants_detection(exp: Experiment) -> bool:
    """The run is scored for detection (``Experiment.scored_for_detection``)."""
    return exp.scored_for_detection


FILE_SLACK_S = 5.0
"""A finished run's files count from its first record to this long after its last (a file
written as it exited); a later run's in the same directory do not."""


def _file_roots(job_dir: Path) -> list[Path]:
    return list(dict.fromkeys([Path.cwd(), job_dir, job_dir.parent]))


def _globbed(pattern: str, roots: Iterable[Path], since: float,
             until: float = float("inf")) -> list[str]:
    """Paths matching ``pattern`` under any root (an absolute pattern: itself), modified
    from ``since`` to ``until`` (a file another run left in a shared directory is not this
    run's)."""
    out: set[str] = set()
    for root in roots:
        for path in glob.glob(os.path.join(root, pattern)):
            try:
                if since <= os.stat(path).st_mtime <= until:
                    out.add(os.path.realpath(path))
            except OSError:
                continue
    return sorted(out)


class DetectionWatcher:
    """Polls the job for the declared signals (module docstring)."""

    def __init__(self, signals: Sequence[DetectionSignal], job_dir: Path, run_folder: Path,
                 target: Any, launched_t: float) -> None:
        self.signals, self.job_dir, self.target = list(signals), job_dir, target
        self.since = launched_t
        self.offsets: dict[Path, int] = {}
        self.partial: dict[Path, bytes] = {}
        self.files_seen: set[tuple[str, str]] = set()
        self.exited: set[str] = set()
        self._last = 0.0
        self._out: IO[str] = open(run_folder / DETECTIONS_FILE, "a")  # noqa: SIM115

    def poll(self, now: float | None = None, *, force: bool = False) -> None:
        now = time.monotonic() if now is None else now
        if self._out.closed or (not force and now - self._last < POLL_S):
            return
        self._last = now
        t = time.time()
        found = self._logs(t) + self._exits(t) + self._files(t)
        for d in found:
            self._out.write(json.dumps(d.to_dict()) + "\n")
        if found:
            self._out.flush()

    def close(self) -> None:
        """One last look (lines written as the job ended), then the file is closed."""
        if not self._out.closed:
            self.poll(force=True)
            self._out.close()

    def _logs(self, t: float) -> list[Detection]:
        if not any(s.log_pattern for s in self.signals):
            return []
        out: list[Detection] = []
        for path in sorted((self.job_dir / "logs").glob("node*.log")):
            try:
                size = path.stat().st_size
                if size <= self.offsets.get(path, 0):
                    continue
                with open(path, "rb") as f:
                    f.seek(self.offsets.get(path, 0))
                    data = self.partial.pop(path, b"") + f.read(size - self.offsets.get(path, 0))
            except OSError:
                continue
            self.offsets[path] = size
            *lines, rest = data.split(b"\n")
            if rest:
                self.partial[path] = rest
            for line in lines:
                out += line_detections(self.signals, line.decode(errors="replace"), t)
        return out

    def _exits(self, t: float) -> list[Detection]:
        if not any(s.exit_code is not None for s in self.signals):
            return []
        out: list[Detection] = []
        for node, code in self.target.result().returncodes.items():
            if code is not None and node not in self.exited:
                self.exited.add(node)
                out += exit_detections(self.signals, node, code, t)
        return out

    def _files(self, t: float) -> list[Detection]:
        out = []
        for s in self.signals:
            if s.file is None:
                continue
            for path in _globbed(s.file, _file_roots(self.job_dir), self.since):
                if (s.name, path) not in self.files_seen:
                    self.files_seen.add((s.name, path))
                    out.append(Detection(s.name, t, None, None, None, path))
        return out


def finished_run_counts(signals: Sequence[DetectionSignal], run_dir: Path,
                        exit_codes: Mapping[str, int | None] | None) -> dict[str, int | None]:
    """Each signal's detections in a finished run (a golden run) read from what it left:
    its logs, events, files and exit codes. None: what the signal reads is gone."""
    events_dir = run_dir / "events"
    events: list[Record] = list(read_events(events_dir)) if events_dir.is_dir() else []
    found = anomaly_detections(events) + exclusion_detections(signals, events)
    counts: dict[str, int | None] = {s.name: 0 for s in signals}
    for d in found:
        counts[d.name] = (counts.get(d.name) or 0) + 1
    times = [float(e["t"]) for e in events if isinstance(e.get("t"), int | float)]
    for s in signals:
        if s.log_pattern is not None:
            logs = sorted((run_dir / "logs").glob("node*.log"))
            counts[s.name] = sum(len(line_detections([s], line, 0.0)) for p in logs
                                 for line in p.read_text(errors="replace").splitlines()) \
                if logs else None
        elif s.exit_code is not None:
            counts[s.name] = None if exit_codes is None else sum(
                1 for code in exit_codes.values() if code == s.exit_code)
        elif s.file is not None:
            counts[s.name] = len(_globbed(s.file, _file_roots(run_dir), min(times),
                                          max(times) + FILE_SLACK_S)) if times else None
        elif not events:
            counts[s.name] = None
    return counts


def _golden_counts(signals: Sequence[DetectionSignal], golden: Any) -> dict[str, int | None] | None:
    if golden is None:
        return None
    runs = [(golden.run_dir, getattr(golden, "exit_codes", None))]
    if golden.second:
        runs.append((golden.second.get("run_dir"), golden.second.get("exit_codes")))
    total: dict[str, int | None] = {}
    for run_dir, codes in runs:
        if not run_dir or not Path(run_dir).is_dir():
            return {s.name: None for s in signals}
        for name, n in finished_run_counts(signals, Path(run_dir), codes).items():
            before = total.get(name, 0)
            total[name] = None if n is None or before is None else before + n
    return total


def detection_report(exp: Experiment, run_folder: Path, events: Sequence[Record],
                     faults: Sequence[FaultRecord], golden: Any) -> DetectionReport:
    """The run's detection report: what the SLAs read, and the journal's ``detection``
    section where ``wants_detection``."""
    signals = exp.observe.detections
    return report_of(signals, run_folder, events, faults, _golden_counts(signals, golden))
