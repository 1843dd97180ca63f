"""faultlab.report.projection against values computed by hand.

The reference case: 1,024 GPUs on 8-GPU nodes (128 nodes) with a node MTBF of 1,280 h, so
the job fails every M = 10 h = 36,000 s, f = 2.4 times a day. The measured stall is 1 s for
1 GB; the planned 9 GB checkpoint at 2 GB/s adds 4 s: C = 5 s, τ = √(2 · 5 · 36,000) = 600 s
(150 steps of 4 s). With R = 60 s: L = 60 + 300 = 360 s; C/τ = 1/120, L/M = 0.01, goodput
= 1 − 1/120 − 0.01 = 0.981666…; lost GPU-h per day = 1024 · (24/120 + 2.4 · 360/3600)
= 204.8 + 245.76 = 450.56; one failure: 1024 · 60/3600 = 17.0666… GPU-h of restart,
1024 · 360/3600 = 102.4 GPU-h with the redone work; at $2/GPU-h and 30 days: 72 failures,
13,516.8 GPU-h and $27,033.60 lost.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from faultlab.report.projection import checkpoint_cost_s, project

PLAN: dict[str, Any] = {"num_gpus": 1024, "gpus_per_node": 8, "mtbf_per_node_h": 1280.0,
                        "mtbf_per_gpu_h": None, "step_time_s": 4.0, "checkpoint_size_gb": 9.0,
                        "storage_bandwidth_gb_s": 2.0, "run_days": 30, "gpu_hour_cost_usd": 2.0}


def test_the_reference_case_by_hand() -> None:
    p = project(PLAN, measured_stall_s=1.0, measured_size_gb=1.0, restart_overhead_s=60.0)
    assert p.num_nodes == 128
    assert p.mtbf_job_h == pytest.approx(10.0)
    assert p.failures_per_day == pytest.approx(2.4)
    assert p.checkpoint_cost_s == pytest.approx(5.0)
    assert p.interval_s == pytest.approx(600.0)
    assert p.interval_steps == 150
    assert p.lost_per_failure_s == pytest.approx(360.0)
    assert p.checkpoint_overhead == pytest.approx(1 / 120)
    assert p.failure_overhead == pytest.approx(0.01)
    assert p.goodput == pytest.approx(1 - 1 / 120 - 0.01)
    assert p.checkpoint_gpu_hours_per_day == pytest.approx(204.8)
    assert p.failure_gpu_hours_per_day == pytest.approx(245.76)
    assert p.lost_gpu_hours_per_day == pytest.approx(450.56)
    assert p.restart_gpu_hours_per_failure == pytest.approx(1024 * 60 / 3600)
    assert p.lost_gpu_hours_per_failure == pytest.approx(102.4)
    assert p.restart_usd_per_failure == pytest.approx(2 * 1024 * 60 / 3600)
    assert p.lost_usd_per_failure == pytest.approx(204.8)
    assert p.lost_usd_per_day == pytest.approx(901.12)
    assert p.run_failures == pytest.approx(72.0)
    assert p.run_gpu_hours == pytest.approx(1024 * 24 * 30)
    assert p.run_lost_gpu_hours == pytest.approx(13516.8)
    assert p.run_lost_usd == pytest.approx(27033.6)
    assert p.notes == []


def test_a_per_gpu_mtbf_gives_the_same_job_mtbf() -> None:
    # 1,000 GPUs with 10,000 h each: again M = 10 h (nodes: ceil(1000 / 8) = 125).
    plan = {**PLAN, "num_gpus": 1000, "mtbf_per_gpu_h": 10_000.0, "mtbf_per_node_h": None}
    p = project(plan, measured_stall_s=1.0, measured_size_gb=1.0, restart_overhead_s=60.0)
    assert p.num_nodes == 125
    assert p.mtbf_job_h == pytest.approx(10.0) and p.failures_per_day == pytest.approx(2.4)
    assert p.interval_s == pytest.approx(600.0)
    assert p.lost_gpu_hours_per_day == pytest.approx(1000 * (24 / 120 + 2.4 * 0.1))


def test_partial_nodes_round_up() -> None:
    plan = {**PLAN, "num_gpus": 12, "mtbf_per_node_h": 100.0}
    p = project(plan, measured_stall_s=1.0, measured_size_gb=1.0, restart_overhead_s=1.0)
    assert p.num_nodes == 2 and p.mtbf_job_h == pytest.approx(50.0)


def test_the_checkpoint_cost_scales_only_up() -> None:
    assert checkpoint_cost_s(2.0, 0.5, 100.5, 10.0) == pytest.approx(12.0)
    # A planned checkpoint no larger than the measured one keeps the measured stall.
    assert checkpoint_cost_s(2.0, 0.5, 0.1, 10.0) == pytest.approx(2.0)


def test_young_interval_is_the_minimum_of_the_first_order_overhead() -> None:
    p = project(PLAN, measured_stall_s=1.0, measured_size_gb=1.0, restart_overhead_s=60.0)
    assert p.interval_s is not None and p.checkpoint_cost_s is not None

    def overhead(tau: float) -> float:
        return p.checkpoint_cost_s / tau + (60.0 + tau / 2) / 36_000  # type: ignore[operator]

    assert overhead(p.interval_s) < overhead(p.interval_s * 0.9)
    assert overhead(p.interval_s) < overhead(p.interval_s * 1.1)


def test_without_a_recovery_or_a_checkpoint_only_what_is_known_is_projected() -> None:
    p = project(PLAN, measured_stall_s=1.0, measured_size_gb=1.0, restart_overhead_s=None)
    assert p.interval_s == pytest.approx(600.0)
    assert p.goodput is None and p.lost_gpu_hours_per_day is None
    assert p.restart_gpu_hours_per_failure is None
    assert any("no measured restart overhead" in n for n in p.notes)

    p = project(PLAN, measured_stall_s=None, measured_size_gb=None, restart_overhead_s=60.0)
    assert p.failures_per_day == pytest.approx(2.4)
    assert p.restart_gpu_hours_per_failure == pytest.approx(1024 * 60 / 3600)
    assert p.interval_s is None and p.goodput is None
    assert any("no checkpoint was measured" in n for n in p.notes)


def test_costs_need_a_price_and_totals_need_a_length() -> None:
    plan = {**PLAN, "gpu_hour_cost_usd": None, "run_days": None}
    p = project(plan, measured_stall_s=1.0, measured_size_gb=1.0, restart_overhead_s=60.0)
    assert p.lost_gpu_hours_per_day == pytest.approx(450.56)
    assert p.lost_usd_per_day is None and p.restart_usd_per_failure is None
    assert p.run_failures is None and p.run_lost_gpu_hours is None


def test_a_hopeless_plan_says_so() -> None:
    # Every GPU fails hourly on a 100,000-GPU job: the job fails every 36 ms.
    plan = {**PLAN, "num_gpus": 100_000, "mtbf_per_gpu_h": 1.0, "mtbf_per_node_h": None}
    p = project(plan, measured_stall_s=1.0, measured_size_gb=1.0, restart_overhead_s=60.0)
    assert p.goodput == 0.0
    assert any("Young's first-order model is optimistic" in n for n in p.notes)
    assert any("no progress" in n for n in p.notes)
    assert math.isfinite(p.lost_gpu_hours_per_day or math.nan)
