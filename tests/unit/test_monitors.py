"""The reference trainer's silent-failure monitors (reference_trainer/monitors.py), fed what the
step's stats all-reduce gives every rank."""

from __future__ import annotations

import math
import re

import pytest
import torch

from reference_trainer.config import ConfigError, TrainConfig
from reference_trainer.monitors import (
    BarMonitors,
    ReplicaFingerprint,
    SpikeCheck,
    SpikeMonitor,
    finding_line,
    shard_fingerprint,
)


def test_a_shard_fingerprint_sees_one_flipped_bit_and_survives_a_sum_with_zeros() -> None:
    params = [torch.randn(64, 32), torch.randn(32)]
    fp = shard_fingerprint(params)
    assert fp == shard_fingerprint([p.clone() for p in params])
    flipped = params[0].clone()
    flipped.view(torch.int32)[3, 5] ^= 1  # the lowest mantissa bit of one element
    assert shard_fingerprint([flipped, params[1]]) != fp
    assert fp >= 1 and fp == int(fp) and fp < 2**53  # never "no value", exact in a float64
    slots = torch.zeros(4, dtype=torch.float64)
    slots[2] = fp
    assert float(slots.sum()) == fp  # what the all-reduce of rank-private slots returns


def test_three_replicas_name_the_odd_rank_once_per_episode() -> None:
    fp = ReplicaFingerprint(world_size=6, replicate=3)  # shard j: ranks j, 2 + j, 4 + j
    same = [10.0, 20.0, 10.0, 20.0, 10.0, 20.0]
    assert fp.check(4, same) is None
    odd = [10.0, 20.0, 10.0, 21.0, 10.0, 20.0]
    found = fp.check(5, odd)
    assert found == {"what": "sdc_suspected", "step": 5, "monitor": "fingerprint",
                     "disagreeing_ranks": [1, 3, 5], "replicas": 3, "ranks": [3],
                     "suspect_rank": 3}
    assert fp.check(6, odd) is None  # the same divergence persists: said once
    assert fp.check(7, same) is None  # healed (a restart from a checkpoint)
    assert fp.check(8, odd)["suspect_rank"] == 3  # a new episode


def test_two_replicas_detect_but_cannot_name() -> None:
    fp = ReplicaFingerprint(world_size=4, replicate=2)
    found = fp.check(3, [1.0, 2.0, 1.5, 2.0])
    assert found is not None and found["disagreeing_ranks"] == [0, 2]
    assert found["attributed"] is False and "ranks" not in found and "suspect_rank" not in found
    assert "no majority" in finding_line(found)


def test_three_replicas_all_different_name_nobody() -> None:
    found = ReplicaFingerprint(world_size=3, replicate=3).check(2, [1.0, 2.0, 3.0])
    assert found is not None and "ranks" not in found and found["attributed"] is False


def test_without_replicas_the_fingerprint_says_so_and_never_alarms() -> None:
    fp = ReplicaFingerprint(world_size=2, replicate=1)
    assert not fp.active and fp.slot_width() == 0
    assert "nothing to compare" in fp.describe()
    assert fp.check(1, []) is None


def test_a_spike_is_ten_times_the_recent_median_and_nan_is_not_one() -> None:
    check = SpikeCheck(factor=10)
    for v in (6.0, 5.5, 5.2, 5.0):
        assert check.update(v) is None
    assert check.update(60.0) is None  # 4 values known: no median yet
    assert check.update(math.nan) is None and check.update(math.inf) is None
    assert check.update(56.0) == 5.5  # over 10x the median of 6, 5.5, 5.2, 5, 60
    assert check.update(55.5) == 5.5  # a spike is not kept: still measured against the normal
    assert check.update(5.1) is None


def test_a_rank_s_own_loss_spike_names_it_and_the_grad_norm_names_nobody() -> None:
    mon = SpikeMonitor(world_size=2, factor=10)
    for s in range(1, 7):
        assert mon.check(s, 5.0, [5.0, 5.0], 1.0) == []
    found = mon.check(7, 28.0, [5.0, 51.0], 1.0)
    assert [f["what"] for f in found] == ["loss_spike"] and found[0]["ranks"] == [1]
    assert mon.check(8, 28.0, [5.0, 51.0], 1.0) == []  # the same episode
    found = mon.check(9, 5.0, [5.0, 5.0], 30.0)
    assert [f["what"] for f in found] == ["grad_norm_spike"] and "ranks" not in found[0]
    assert SpikeMonitor(2, factor=0).check(10, 1e9, [1e9, 1e9], 1e9) == []


def test_the_slots_of_every_rank_summed_are_what_every_rank_checks() -> None:
    """Three replicas of one shard: each rank fills its slots, the all-reduce sums them."""
    base = torch.randn(8, 8)
    weights = [base.clone() for _ in range(3)]
    weights[2][0, 0] += 1e-6  # rank 2's replica diverged
    monitors = [BarMonitors(3, r, replicate=3, spike_factor=10) for r in range(3)]
    assert monitors[0].width == 6
    summed = torch.zeros(monitors[0].width, dtype=torch.float64)
    for r, m in enumerate(monitors):
        slots = torch.zeros(m.width, dtype=torch.float64)
        m.fill(slots, [weights[r]], local_loss=4.0 + r)
        summed += slots
    found = monitors[0].check(5, summed.tolist(), loss=5.0, grad_norm=1.0)
    assert [f.get("suspect_rank") for f in found] == [2]
    assert summed[3:].tolist() == [4.0, 5.0, 6.0]


def test_a_finding_s_line_matches_a_declared_pattern() -> None:
    found = ReplicaFingerprint(3, 3).check(12, [1.0, 1.0, 2.0])
    line = finding_line(found)
    m = re.search(r"SDC: fingerprint of rank (?P<rank>\d+) disagrees at step (?P<step>\d+)", line)
    assert m is not None and m["rank"] == "2" and m["step"] == "12"


@pytest.mark.parametrize(("field", "value", "flag"), [
    ("replicate", 0, "--replicate"), ("spike_factor", 0.5, "--spike-factor"),
    ("spike_factor", math.nan, "--spike-factor")])
def test_bad_monitor_flags_name_the_flag(tmp_path, field: str, value: float, flag: str) -> None:
    with pytest.raises(ConfigError) as e:
        TrainConfig(run_dir=tmp_path, **{field: value})
    assert e.value.flag == flag and repr(value) in str(e.value)
