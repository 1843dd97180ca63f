"""From what the suite measured to what the planned run should expect: pure arithmetic.

The standard first-order model of checkpoint/restart (Young, 1974), with these inputs: the
plan (``faultlab.spec.Plan``), the measured checkpoint stall ``C_meas`` (seconds training
stood still for one save) and size ``S_meas`` (GB on disk), and the measured restart overhead
``R`` (seconds from the fault to training again, replay excluded: ``faultlab.observe.phases``).

    nodes               N_node = ceil(num_gpus / gpus_per_node)
    MTBF of the job     M = mtbf_per_gpu_h / num_gpus        (per-GPU rate given)
                        M = mtbf_per_node_h / N_node         (per-node rate given)   [hours]
    failures per day    f = 24 / M
    checkpoint cost     C = C_meas + max(0, checkpoint_size_gb − S_meas) / storage_bandwidth_gb_s
                        (the measured stall, plus the bytes the planned checkpoint has beyond
                        the measured one written at the planned bandwidth; a smaller planned
                        checkpoint is not credited)                                    [s]
    optimal interval    τ = sqrt(2 · C · M·3600)            (Young)                    [s]
    lost per failure    L = R + τ / 2     (restart overhead + on average half an interval of
                                          work redone)                                 [s]
    goodput             G = 1 − C / τ − L / (M·3600)   (floored at 0)
    lost GPU-h per day  num_gpus · (24 · C / τ + f · L / 3600)
                        = checkpoint overhead + failures
    per failure         num_gpus · R / 3600 GPU-h for the restart alone,
                        num_gpus · L / 3600 GPU-h with the redone work; × gpu_hour_cost_usd
    over the run        × run_days

The model assumes C ≪ M·3600 and independent, exponentially distributed failures; a note says
so when C is not small against the MTBF.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["FORMULAS", "Projection", "checkpoint_cost_s", "project"]

FORMULAS = (
    ("nodes", "N_node = ceil(num_gpus / gpus_per_node)"),
    ("MTBF of the job", "M = mtbf_per_gpu_h / num_gpus, or mtbf_per_node_h / N_node [h]"),
    ("failures per day", "f = 24 / M"),
    ("checkpoint cost", "C = C_meas + max(0, checkpoint_size_gb − S_meas) / "
                        "storage_bandwidth_gb_s [s]"),
    ("optimal checkpoint interval (Young)", "τ = √(2 · C · M·3600) [s]"),
    ("lost per failure", "L = R + τ/2 [s] (R: measured restart overhead)"),
    ("goodput", "G = 1 − C/τ − L/(M·3600)"),
    ("lost GPU-hours per day", "num_gpus · (24·C/τ + f·L/3600)"),
    ("cost of one failure", "num_gpus · R/3600 GPU-h (restart), num_gpus · L/3600 GPU-h "
                            "(with redone work); × gpu_hour_cost_usd"),
)
"""What the report prints under the projection: (quantity, formula)."""


def checkpoint_cost_s(measured_stall_s: float, measured_size_gb: float, plan_size_gb: float,
                      bandwidth_gb_s: float) -> float:
    """C: the measured stall plus the planned checkpoint's extra bytes at the planned
    bandwidth (module docstring)."""
    return measured_stall_s + max(0.0, plan_size_gb - measured_size_gb) / bandwidth_gb_s


@dataclass(slots=True)
class Projection:
    """The planned run's expected failures and their cost (definitions: module docstring).

    ``None``: not computable from what was measured (no checkpoint, no recovery)."""

    num_nodes: int
    mtbf_job_h: float
    failures_per_day: float
    checkpoint_cost_s: float | None = None
    interval_s: float | None = None
    interval_steps: int | None = None
    lost_per_failure_s: float | None = None
    checkpoint_overhead: float | None = None
    """C/τ: the fraction of time spent stalled on checkpoints."""
    failure_overhead: float | None = None
    """L/M: the fraction of time lost to failures."""
    goodput: float | None = None
    checkpoint_gpu_hours_per_day: float | None = None
    failure_gpu_hours_per_day: float | None = None
    lost_gpu_hours_per_day: float | None = None
    restart_gpu_hours_per_failure: float | None = None
    lost_gpu_hours_per_failure: float | None = None
    restart_usd_per_failure: float | None = None
    lost_usd_per_failure: float | None = None
    lost_usd_per_day: float | None = None
    run_failures: float | None = None
    run_lost_gpu_hours: float | None = None
    run_lost_usd: float | None = None
    run_gpu_hours: float | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def project(plan: dict[str, Any], *, measured_stall_s: float | None,
            measured_size_gb: float | None, restart_overhead_s: float | None) -> Projection:
    """The projection of ``plan`` (a ``Plan`` as a dict) from the measured values."""
    num_gpus = int(plan["num_gpus"])
    num_nodes = math.ceil(num_gpus / int(plan["gpus_per_node"]))
    if plan.get("mtbf_per_gpu_h") is not None:
        mtbf_job_h = float(plan["mtbf_per_gpu_h"]) / num_gpus
    else:
        mtbf_job_h = float(plan["mtbf_per_node_h"]) / num_nodes
    p = Projection(num_nodes=num_nodes, mtbf_job_h=mtbf_job_h,
                   failures_per_day=24.0 / mtbf_job_h)
    mtbf_s = mtbf_job_h * 3600.0
    cost = plan.get("gpu_hour_cost_usd")
    days = plan.get("run_days")
    if days is not None:
        p.run_failures = p.failures_per_day * days
        p.run_gpu_hours = num_gpus * 24.0 * days
    if restart_overhead_s is not None:
        p.restart_gpu_hours_per_failure = num_gpus * restart_overhead_s / 3600.0
        if cost is not None:
            p.restart_usd_per_failure = p.restart_gpu_hours_per_failure * cost
    else:
        p.notes.append("no fault was recovered from, so there is no measured restart "
                       "overhead: the costs of a failure are not projected")
    if measured_stall_s is None or measured_size_gb is None:
        p.notes.append("no checkpoint was measured: the checkpoint interval and goodput are "
                       "not projected")
        return p

    c = checkpoint_cost_s(measured_stall_s, measured_size_gb, float(plan["checkpoint_size_gb"]),
                          float(plan["storage_bandwidth_gb_s"]))
    tau = math.sqrt(2.0 * c * mtbf_s)
    p.checkpoint_cost_s, p.interval_s = c, tau
    p.interval_steps = max(1, round(tau / float(plan["step_time_s"])))
    p.checkpoint_overhead = c / tau
    p.checkpoint_gpu_hours_per_day = num_gpus * 24.0 * p.checkpoint_overhead
    if c > mtbf_s / 10:
        p.notes.append(f"the checkpoint cost ({c:.0f} s) is not small against the job's MTBF "
                       f"({mtbf_s:.0f} s): Young's first-order model is optimistic here")
    if restart_overhead_s is None:
        return p
    lost = restart_overhead_s + tau / 2.0
    p.lost_per_failure_s = lost
    p.failure_overhead = lost / mtbf_s
    p.goodput = max(0.0, 1.0 - p.checkpoint_overhead - p.failure_overhead)
    p.failure_gpu_hours_per_day = num_gpus * p.failures_per_day * lost / 3600.0
    p.lost_gpu_hours_per_day = p.checkpoint_gpu_hours_per_day + p.failure_gpu_hours_per_day
    p.lost_gpu_hours_per_failure = num_gpus * lost / 3600.0
    if cost is not None:
        p.lost_usd_per_failure = p.lost_gpu_hours_per_failure * cost
        p.lost_usd_per_day = p.lost_gpu_hours_per_day * cost
    if days is not None:
        p.run_lost_gpu_hours = p.lost_gpu_hours_per_day * days
        if cost is not None:
            p.run_lost_usd = p.run_lost_gpu_hours * cost
    if p.goodput == 0.0:
        p.notes.append("failures and checkpoints take all the time: the run would make no "
                       "progress at this scale and failure rate")
    return p
