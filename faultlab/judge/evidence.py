"""What a run left, as the SLA declarations read it (``faultlab.sla.Evidence``).

``judge()`` builds one :class:`RunEvidence` per run from the records it receives; each
declaration reads the records from it and asks it the questions that need ``faultlab.observe``
or the noise verdict (``faultlab.judge.noise``), which the declarations cannot import.

A golden run whose site (``GoldenRun.site``: where its rank 0 computed) differs from this run's
is no reference for it: the declarations see it as a golden run without a final state
(``OtherHardware``), so ``bitwise_equal_to_golden`` and ``matches_golden_within_noise`` are not
measured, their note ``reference from other hardware (A vs B)`` (``faultlab.observe.site``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from faultlab.judge.noise import (
    Reproducibility,
    WithinNoise,
    reproducibility,
    run_losses,
    within_noise,
)
from faultlab.observe import FaultRecord, Metrics
from faultlab.observe.detection_score import DetectionReport
from faultlab.observe.final_state import FinalState, final_checkpoint_path, first_difference
from faultlab.observe.launch_findings import LaunchFinding
from faultlab.observe.metrics import UNFINISHED_RUN, completion
from faultlab.observe.node_exits import final_world_shortfall, struck_nodes, unclean_node_exit
from faultlab.observe.save_failures import sign_note, struck
from faultlab.observe.site import other_hardware, run_site
from faultlab.sla.timing import TimingUnits
from faultlab.spec import Experiment

__all__ = ["OtherHardware", "RunEvidence"]


@dataclass(frozen=True)
class OtherHardware:
    """A golden run computed on another site than the run's, as the judge shows it to the SLA
    declarations: no digest, no tensors, no second run, and ``not_measured`` says why."""

    refused: Any
    """The golden run itself (its restarts and failures still count: ``judge``)."""
    not_measured: str
    """``reference from other hardware (A vs B)``."""
    digest: None = None
    tensors: dict[str, str] = field(default_factory=dict)
    second: None = None
    losses: dict[int, float] = field(default_factory=dict)
    final_checkpoint: None = None


@dataclass(eq=False)
class RunEvidence:
    """One run's records (see ``faultlab.sla.Evidence`` for what each holds)."""

    exp: Experiment
    metrics: Metrics
    golden: Any
    timed_out: bool
    faults: Sequence[FaultRecord]
    events: Sequence[Mapping[str, Any]] = ()
    final_state: FinalState | None = None
    job_s: float | None = None
    findings: Sequence[LaunchFinding] = ()
    node_exits: Mapping[str, int | None] | None = None
    lost_nodes: Collection[str] = ()
    stopped_nodes: Collection[str] = ()
    losses: Mapping[int, float] | None = None
    units: TimingUnits | None = None
    detection: DetectionReport | None = None
    fired: Collection[str] = field(init=False)
    """Ids of the faults injected without error (a frozenset; ``Evidence.fired``)."""
    unfinished: str = field(init=False)

    def __post_init__(self) -> None:
        self.fired = frozenset(f.id.split("#")[0] for f in self.faults
                               if not f.details.get("error"))
        self.unfinished = _unfinished(self.metrics, self.timed_out)
        refused = other_hardware(getattr(self.golden, "site", None), run_site(self.events))
        if refused:
            self.golden = OtherHardware(self.golden, refused)

    @cached_property
    def _values(self) -> dict[str, Any]:
        return self.metrics.to_dict()

    def value(self, metric: str) -> Any:
        return self._values.get(metric)

    def findings_for(self, key: str) -> list[str]:
        return [f"{f.text}; to change it: {f.change}" for f in self.findings if key in f.affects]

    def unfinished_why(self, metric: str | None) -> str | None:
        return UNFINISHED_RUN.get(metric) if metric else None

    def completion_reason(self) -> str:
        return completion(list(self.events))[1]

    def nodes_fell_short(self) -> str:
        """Its final world fell short of the topology, or a node no fault struck exited
        non-zero (``faultlab.observe.node_exits``)."""
        topo = self.exp.topology
        names = [n for n in self.node_exits or () if not n.startswith("job ")] or \
            [f"node{i}" for i in range(topo.nodes)]  # a Slurm job's one code is no node's
        hit, hit_all = struck_nodes(list(self.faults), self.events, names)
        return "; ".join(filter(None, [
            final_world_shortfall(self.events, nodes=topo.nodes,
                                  procs_per_node=topo.procs_per_node, min_nodes=topo.min_nodes,
                                  struck=topo.nodes if hit_all else min(len(hit), topo.nodes)),
            unclean_node_exit(self.node_exits or {}, struck=hit, struck_all=hit_all,
                              lost=self.lost_nodes, stopped=self.stopped_nodes,
                              any_struck=any(not f.details.get("error") for f in self.faults))]))

    def first_differing_tensor(self) -> str:
        ours = self.final_state.tensors if self.final_state else {}
        theirs = getattr(self.golden, "tensors", None) or {}
        return (first_difference(ours, theirs) or "") if ours and theirs else ""

    def reproducibility(self) -> Reproducibility | None:
        return reproducibility(self.golden) if self.golden is not None else None

    def within_noise(self, k: float) -> WithinNoise:
        if isinstance(self.golden, OtherHardware):
            return WithinNoise(None, False, f"not measured: {self.golden.not_measured}",
                               inconclusive=True)  # for want of a reference of this hardware
        return within_noise(self.golden,
                            self.losses if self.losses is not None else run_losses(self.events),
                            self.final_state.path if self.final_state is not None else
                            final_checkpoint_path(self.events), k)

    def struck(self, fault: Any) -> bool:
        return struck(fault)

    def save_failure_sign(self, fault: Any) -> str:
        return sign_note(self.events, fault)


def _unfinished(metrics: Metrics, timed_out: bool) -> str:
    """How the run fell short of finishing ('' if it completed)."""
    if metrics.completes:
        return ""
    if timed_out:
        return f"faultlab stopped the job at step {metrics.max_step} (timeout)"
    return f"the run did not complete (it stopped at step {metrics.max_step})"
