"""examples/silent_ddp's monitors on their own, without a job: who the fingerprint's majority
names, when the spike rule and the straggler score fire, and that the replay sees an
intermittent fault and not a deterministic one. The shipped experiments (test_examples.py)
show the same against real faults in real jobs; these pin the rules the README states."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

PATH = Path(__file__).resolve().parents[2] / "examples" / "silent_ddp" / "monitors.py"


def _monitors() -> ModuleType:
    spec = importlib.util.spec_from_file_location("silent_ddp_monitors", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


M = _monitors()


def test_the_fingerprint_majority_names_the_odd_replica_or_nobody() -> None:
    a, b = (1.0, 7), (1.0, 8)  # the same sum, another CRC: one flipped bit
    assert M.outliers([a, a, a]) == []
    assert M.outliers([a, b, a]) == [1]
    assert M.outliers([a, b, (2.0, 7)]) is None  # no majority: nobody can be named
    assert M.outliers([a, b]) is None


def test_a_fingerprint_changes_with_one_bit_of_one_weight() -> None:
    net = nn.Linear(4, 4)
    before = M.fingerprint(net)
    with torch.no_grad():
        w = net.weight.view(-1)
        w[3] = torch.nextafter(w[3], torch.tensor(math.inf))
    after = M.fingerprint(net)
    assert after[1] != before[1]


def test_the_spike_rule_fires_above_its_factor_and_on_nan() -> None:
    rule = M.SpikeRule(10.0, warmup=2)
    assert rule.check(1, 1.0) == [] and rule.check(2, 3.0) == []  # the baseline: 2.0
    assert rule.check(3, 20.0) == []
    assert rule.check(4, 20.5) == ["loss spike at step 4"]
    assert rule.check(5, math.nan) == ["loss spike at step 5"]


def test_the_straggler_score_names_a_steady_3x_rank_and_not_a_1_2x_one() -> None:
    score = M.StragglerScore(0.75, window=3, steps=2, world_size=3)
    fired = [score.check(s, [1.0, 3.0, 1.2]) for s in range(1, 6)]
    # judged from the third step (a full window), named at the second low one, once
    assert fired == [[], [], [], ["straggler: rank 1 score 0.333 at step 4"], []]


def test_one_slow_step_in_the_median_window_names_nobody() -> None:
    score = M.StragglerScore(0.75, window=3, steps=1, world_size=2)
    out = [score.check(s, [1.0, 5.0 if s == 4 else 1.0]) for s in range(1, 8)]
    assert out == [[]] * 7


def test_the_replay_sees_an_intermittent_fault_and_not_a_deterministic_one() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
    x, y = torch.randn(4, 8), torch.randn(4, 2)
    assert not M.replay_mismatch(net, F.mse_loss, x, y)
    draws = iter([0.0, 1e-3])  # a different error on each computation

    def intermittent(module: nn.Module, args: object, out: torch.Tensor) -> torch.Tensor:
        return out + next(draws)
    handle = net[0].register_forward_hook(intermittent)
    assert M.replay_mismatch(net, F.mse_loss, x, y)
    handle.remove()

    def deterministic(module: nn.Module, args: tuple[torch.Tensor], out: torch.Tensor
                      ) -> torch.Tensor:
        return out * 1.001  # the same wrong value for the same input
    net[0].register_forward_hook(deterministic)
    assert not M.replay_mismatch(net, F.mse_loss, x, y)
