"""Detection scored like recovery: the fault's onset (ground truth), each signal's first
detection after it, its attribution, and its false alarms in the fault-free golden run(s).

The onset
    Of the faults whose class declares ``slows_job`` or ``corrupts_silently`` and whose
    injection did not fail, the one that struck first: ``t`` and ``step`` of its first
    ``fault_struck`` record, else its first ``fault_injected`` record, else faultlab's own
    record of the injection (``FaultRecord``: a fault acting from outside the ranks); its
    victims are the ranks (and their nodes) of its ``fault_struck`` records, else those its
    record names (``details["ranks"]``, the ``rank N`` of its target, ``details["node"]``).
    None when no such fault struck: the detection SLAs are then not measured.
A signal's detection
    Its first detection at or after the onset's ``t``; ``within_s`` and ``within_steps`` from
    the onset. An earlier one is an alarm before the fault, not a detection of it. The clock
    decides what came first: a strike at a step's start is recorded under the step that
    starts, which at level 0 begins right after the previous step's optimizer step, so a
    monitor that checks after that optimizer step prints the previous step's number although
    it ran after the strike. Such a detection is ``within_steps`` 0, never negative.
Attribution
    Of that first detection: ``exact`` when the ranks it named are the victim ranks (the nodes,
    for a signal that names nodes); ``extra`` when they include them and others; ``wrong``
    otherwise (others only, or some of the victims without the rest); ``none`` when it named
    nobody ("detected, not attributed"); None when not detected.
False alarms
    The signal's detections in the golden run(s): counted on what the golden run left (its
    logs, events, files and exit codes, ``golden_false_alarms``) with the signals as they are
    now, so a changed ``observe.detections`` never reuses a stale count. None: not measured (no
    golden run, its run directory gone, or an exit code not recorded).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from faultlab.observe.detections import Detection, read_detections, step_at
from faultlab.observe.records import FaultRecord, Record, _float, _int
from faultlab.spec.observation import DetectionSignal

__all__ = ["DETECTABLE", "DetectionReport", "Onset", "SignalScore", "attribution", "onset_of",
           "report_of",
           "score_detections"]

DETECTABLE = ("slows_job", "corrupts_silently")
"""The capabilities of a fault whose detection the SLAs may ask for."""


@dataclass(frozen=True, slots=True)
class Onset:
    """The ground truth of the first fault that struck (module docstring)."""

    fault_id: str
    type: str
    t: float
    step: int | None
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]
    strikes: int = 0
    """Its ``fault_struck`` records (0: it wrote none)."""
    surface: str | None = None

    def describe(self) -> str:
        """``sdc on rank 1's update from step 10, 45 strikes``."""
        who = (f"rank{'s' if len(self.ranks) > 1 else ''} "
               f"{', '.join(map(str, self.ranks))}" if self.ranks else
               ", ".join(self.nodes) or "an unknown victim")
        where = f"{who}'s {self.surface}" if self.surface else who
        when = f" from step {self.step}" if self.step is not None else ""
        strikes = f", {self.strikes} strike{'s' if self.strikes != 1 else ''}" \
            if self.strikes else ""
        return f"{self.fault_id} ({self.type}) on {where}{when}{strikes}"

    def to_dict(self) -> dict[str, Any]:
        """The journal's ``detection.onset`` (the contract's keys, and ``ground_truth``:
        ``describe()``, what an undetected fault is reported with)."""
        return {"fault_id": self.fault_id, "t": self.t, "step": self.step,
                "ranks": list(self.ranks), "nodes": list(self.nodes),
                "ground_truth": self.describe()}


@dataclass(frozen=True, slots=True)
class SignalScore:
    """One signal against the onset (the journal's ``detection.signals[]``)."""

    name: str
    detected: bool
    t: float | None = None
    step: int | None = None
    within_s: float | None = None
    within_steps: int | None = None
    ranks: list[int] | None = None
    nodes: list[str] | None = None
    attribution: str | None = None
    false_alarms: int | None = None
    evidence: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DetectionReport:
    """The journal's ``detection`` section and what the detection SLAs read."""

    onset: Onset | None
    signals: list[SignalScore]
    detections: list[Detection] = field(default_factory=list)
    golden: bool = False
    """A golden run was scanned (false alarms measured where it left what a signal reads)."""

    def to_dict(self) -> dict[str, Any]:
        return {"onset": self.onset.to_dict() if self.onset else None,
                "signals": [s.to_dict() for s in self.signals]}

    def counted(self, names: Sequence[str] | None) -> list[SignalScore]:
        """The signals an SLA counts: ``names`` (``expect.detected_by``), else every one."""
        return [s for s in self.signals if names is None or s.name in names]

    def victims(self, fault: FaultRecord, events: Sequence[Record]
                ) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """The ranks and nodes ``fault`` struck (module docstring: the onset's victims)."""
        onset = _onset(fault, events)
        return (onset.ranks, onset.nodes) if onset is not None else ((), ())

    def first_naming(self, ranks: set[int], nodes: set[str], after_t: float,
                     names: Sequence[str] | None = None) -> Detection | None:
        """The first detection at or after ``after_t`` that named one of ``ranks``/``nodes``."""
        return next((d for d in self.detections if d.t >= after_t
                     and (names is None or d.name in names)
                     and (set(d.ranks or ()) & ranks or set(d.nodes or ()) & nodes)), None)


def onset_of(faults: Sequence[FaultRecord], events: Sequence[Record]) -> Onset | None:
    """The onset of the first detectable fault that struck (module docstring)."""
    onsets = [o for f in faults if any(f.declares(c) for c in DETECTABLE)
              and not f.details.get("error") and (o := _onset(f, events)) is not None]
    return min(onsets, key=lambda o: o.t, default=None)


def _onset(fault: FaultRecord, events: Sequence[Record]) -> Onset | None:
    base = fault.id.split("#")[0]
    mine = sorted((r for r in events if r.get("fault_id") in (fault.id, base)
                   and _float(r.get("t")) is not None), key=lambda r: float(r["t"]))
    struck = [r for r in mine if r.get("kind") == "fault_struck"]
    injected = [r for r in mine if r.get("kind") == "fault_injected"]
    first = (struck or injected)[0] if struck or injected else None
    if struck:
        ranks = sorted({r for r in (_int(s.get("rank")) for s in struck) if r is not None})
        nodes = sorted({str(s["node"]) for s in struck if isinstance(s.get("node"), str)})
    else:
        ranks, nodes = _named_victims(fault, injected)
    if first is None:
        return Onset(fault.id, fault.type, float(fault.injected_t), step_at(events,
                     float(fault.injected_t)), tuple(ranks), tuple(nodes))
    step = _int(first.get("step"))
    return Onset(fault.id, fault.type, float(first["t"]),
                 step if step is not None else step_at(events, float(first["t"])),
                 tuple(ranks), tuple(nodes), len(struck),
                 str(first["surface"]) if first.get("surface") else None)


def _named_victims(fault: FaultRecord, injected: Sequence[Record]
                   ) -> tuple[list[int], list[str]]:
    details = fault.details or {}
    ranks = {r for r in map(_int, details.get("ranks") or []) if r is not None} \
        if isinstance(details.get("ranks"), list) else set()
    kind, _, value = fault.target.partition(" ")
    if not ranks and kind == "rank" and value.isdigit():
        ranks = {int(value)}
    ranks |= {r for r in (_int(i.get("rank")) for i in injected) if r is not None} \
        if not ranks else set()
    nodes = {n for n in (details.get("node"), *(details.get("nodes") or ()))
             if isinstance(n, str) and n}
    nodes |= {str(i["node"]) for i in injected
              if isinstance(i.get("node"), str) and _int(i.get("rank")) in ranks}
    return sorted(ranks), sorted(nodes)


def attribution(d: Detection, onset: Onset) -> str:
    """``exact``, ``extra``, ``wrong`` or ``none`` (module docstring)."""
    named: set[Any]
    victims: set[Any]
    if d.ranks is not None and onset.ranks:
        named, victims = set(d.ranks), set(onset.ranks)
    elif d.nodes is not None and onset.nodes:
        named, victims = set(d.nodes), set(onset.nodes)
    elif d.ranks is None and d.nodes is None:
        return "none"
    else:  # it named a rank where only the victims' nodes are known, or the other way
        return "wrong"
    if named == victims:
        return "exact"
    return "extra" if named > victims else "wrong"


def score_detections(names: Sequence[str], detections: Sequence[Detection],
                     onset: Onset | None, false_alarms: Mapping[str, int | None] | None
                     ) -> DetectionReport:
    """Each signal of ``names`` (the declared ones) and every ``anomaly:`` one seen, scored
    against ``onset``; ``false_alarms`` per signal from the golden run(s) (None: no golden)."""
    seen = [d.name for d in detections if d.name.startswith("anomaly:")]
    seen += [n for n in (false_alarms or {}) if n.startswith("anomaly:")]
    alarms = false_alarms or {}
    scores = []
    for name in dict.fromkeys([*names, *sorted(set(seen))]):
        fa = alarms.get(name, 0 if name.startswith("anomaly:") and false_alarms is not None
                        else None)
        first = next((d for d in detections if d.name == name and onset is not None
                      and d.t >= onset.t), None)
        if first is None or onset is None:
            scores.append(SignalScore(name, False, false_alarms=fa))
            continue
        within_steps = max(0, first.step - onset.step) if first.step is not None and \
            onset.step is not None else None
        scores.append(SignalScore(
            name, True, first.t, first.step, first.t - onset.t, within_steps,
            list(first.ranks) if first.ranks is not None else None,
            list(first.nodes) if first.nodes is not None else None,
            attribution(first, onset), fa, first.evidence))
    return DetectionReport(onset, scores, list(detections), golden=false_alarms is not None)


def report_of(signals: Sequence[DetectionSignal], run_folder: Path | None,
              events: Sequence[Record], faults: Sequence[FaultRecord],
              false_alarms: Mapping[str, int | None] | None) -> DetectionReport:
    """One run's report: its detections (``read_detections``: the watcher's file in
    ``run_folder``, none without it), scored against the onset of ``faults``."""
    found = read_detections(signals, run_folder, events)
    return score_detections([s.name for s in signals], found, onset_of(faults, events),
                            false_alarms)
