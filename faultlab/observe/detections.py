"""The team's own detection signals (``observe.detections``) read from a run: ``Detection`` s.

A node's log is plain text without timestamps, so a log line's time is taken live: the engine's
watcher (``faultlab.engine.detect_watch``) reads the new bytes of every node's log, the exit
codes of the nodes and the files the signals name every ``POLL_S``, and writes each match as one
JSON line of ``detections.jsonl`` in the run folder, stamped when it was seen (never earlier
than it appeared; at most a poll later). The rest is read from the run's records after it:

- ``log_pattern``: a line that matches; it names the rank of its ``rank`` group and the node of
  its ``node`` group (nobody without them: the node whose log holds the line is where the
  monitor ran, not whom it named); its step is its ``step`` group, else the job's highest
  recorded step at ``t``;
- ``exit_code``: a node whose launcher (or trainer) exited with that code; names the node;
- ``node_excluded``: an incarnation of the job (a rank-0 ``start``) that trained without a
  node an earlier one trained on (``faultlab.observe.exclusion``'s rule), at its first step;
  names the node. Slurm drains are not read: the slurm target reports no node state changes
  to the run (only the guard records its own ``scontrol`` changes);
- ``file``: a file matching the glob appears (relative to faultlab's working directory, the
  job directory or the run folder; absolute allowed), modified after the launch; names nobody;
- the trainer's own ``anomaly`` records: ``anomaly:<what>``, naming the ranks of its
  ``straggler_rank``, ``suspect_rank`` or ``ranks``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from faultlab.observe.records import Record, _float, _int
from faultlab.spec.observation import DetectionSignal

__all__ = ["DETECTIONS_FILE", "POLL_S", "Detection", "anomaly_detections", "exit_detections",
           "exclusion_detections", "line_detections", "read_detections", "read_recorded",
           "step_at"]

DETECTIONS_FILE = "detections.jsonl"
"""What the engine's watcher writes in the run folder: one ``Detection`` per line."""
POLL_S = 0.2
"""How often the watcher looks: a log line's ``t`` is at most this late."""


@dataclass(frozen=True, slots=True)
class Detection:
    """One detection: when (wall clock), the job's step then, whom it named, and the evidence
    (the line, the exit code, the path). ``ranks``/``nodes`` None: it named nobody."""

    name: str
    t: float
    step: int | None
    ranks: tuple[int, ...] | None
    nodes: tuple[str, ...] | None
    evidence: str

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ranks"] = list(self.ranks) if self.ranks is not None else None
        d["nodes"] = list(self.nodes) if self.nodes is not None else None
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Detection:
        ranks, nodes = d.get("ranks"), d.get("nodes")
        return cls(str(d["name"]), float(d["t"]), _int(d.get("step")),
                   tuple(int(r) for r in ranks) if isinstance(ranks, list) else None,
                   tuple(str(n) for n in nodes) if isinstance(nodes, list) else None,
                   str(d.get("evidence", "")))


def line_detections(signals: Sequence[DetectionSignal], line: str, t: float) -> list[Detection]:
    """The detections one log line makes (one per signal whose pattern it matches); ``step``
    is the pattern's group or None (``read_detections`` fills it in)."""
    out = []
    for s in signals:
        if s.log_pattern is None:
            continue
        m = re.search(s.log_pattern, line)
        if m is None:
            continue
        groups = m.groupdict()
        rank, node = _int_of(groups.get("rank")), groups.get("node")
        out.append(Detection(s.name, t, _int_of(groups.get("step")),
                             (rank,) if rank is not None else None,
                             (node,) if node else None, line.strip()[:300]))
    return out


def _int_of(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def exit_detections(signals: Sequence[DetectionSignal], node: str, code: int | None,
                    t: float) -> list[Detection]:
    return [Detection(s.name, t, None, None, (node,), f"{node} exited with code {code}")
            for s in signals if s.exit_code is not None and code == s.exit_code]


def anomaly_detections(events: Iterable[Record]) -> list[Detection]:
    """The trainer's ``anomaly`` records as detections ``anomaly:<what>``."""
    out = []
    for r in events:
        t = _float(r.get("t"))
        if r.get("kind") != "anomaly" or t is None:
            continue
        extra: list[Any] = r["ranks"] if isinstance(r.get("ranks"), list) else []
        named = [r.get("straggler_rank"), r.get("suspect_rank"), *extra]
        ranks = tuple(sorted({x for x in map(_int, named) if x is not None}))
        out.append(Detection(f"anomaly:{r.get('what')}", t, _int(r.get("step")),
                             ranks or None, None,
                             f"rank {r.get('rank')}: {r.get('what')} at step {r.get('step')}"))
    return out


def exclusion_detections(signals: Sequence[DetectionSignal],
                         events: Iterable[Record]) -> list[Detection]:
    """An incarnation that trained without a node an earlier one trained on, at its first
    step, for every ``node_excluded`` signal."""
    named = [s for s in signals if s.node_excluded]
    if not named:
        return []
    records = sorted((r for r in events if _float(r.get("t")) is not None),
                     key=lambda r: float(r["t"]))
    starts = [float(r["t"]) for r in records if r.get("kind") == "start" and r.get("rank") == 0]
    out: list[Detection] = []
    trained: set[str] = set()
    for i, t0 in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else math.inf
        steps = [r for r in records if r.get("kind") == "step" and t0 <= r["t"] < end]
        nodes = {str(r["node"]) for r in steps if isinstance(r.get("node"), str)}
        left = sorted(trained - nodes) if steps else []
        for node in left:
            out += [Detection(s.name, float(steps[0]["t"]), _int(steps[0].get("step")), None,
                              (node,), f"the incarnation started at t={t0:.1f} trained "
                                       f"without {node}") for s in named]
        trained |= nodes
    return out


def read_recorded(run_folder: Path) -> list[Detection]:
    """What the watcher wrote (``DETECTIONS_FILE``); a torn last line is skipped."""
    out = []
    try:
        lines = (Path(run_folder) / DETECTIONS_FILE).read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            out.append(Detection.from_dict(json.loads(line)))
        except (ValueError, KeyError, TypeError):
            continue
    return out


def step_at(events: Iterable[Record], t: float) -> int | None:
    """The job's highest recorded step at ``t`` (None: no step recorded by then)."""
    steps = [s for r in events if r.get("kind") == "step" and (_float(r.get("t")) or math.inf) <= t
             and (s := _int(r.get("step"))) is not None]
    return max(steps, default=None)


def read_detections(signals: Sequence[DetectionSignal], run_folder: Path | None,
                    events: Sequence[Record]) -> list[Detection]:
    """Every detection of one run, in time order: the watcher's (logs, exit codes, files),
    the exclusions read from the records, the trainer's anomalies; each with its step."""
    found = [*(read_recorded(run_folder) if run_folder is not None else []),
             *exclusion_detections(signals, events), *anomaly_detections(events)]
    declared = {s.name for s in signals}
    found = [d for d in found if d.name in declared or d.name.startswith("anomaly:")]
    out = [d if d.step is not None else Detection(d.name, d.t, step_at(events, d.t), d.ranks,
                                                  d.nodes, d.evidence) for d in found]
    return sorted(out, key=lambda d: d.t)
