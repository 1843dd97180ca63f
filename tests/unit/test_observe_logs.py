"""observe.log_pattern: the loss read from a trainer's own output."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from faultlab.observe.logs import losses_from_logs
from faultlab.spec.observation import check_log_pattern

PATTERN = r"step (?P<step>\d+) loss (?P<loss>\S+)"


def test_last_match_of_a_step_wins_across_node_logs(tmp_path: Path) -> None:
    (tmp_path / "node0.log").write_text("step 1 loss 2.5\nnoise\nstep 2 loss 2.25\n"
                                        "restarting\nstep 2 loss 2.2500\nstep 3 loss nan\n")
    (tmp_path / "node1.log").write_text("[rank1] step 4 loss 1.0\nstep x loss 1\n")
    losses = losses_from_logs(sorted(tmp_path.glob("*.log")), PATTERN)
    assert losses.keys() == {1, 2, 3, 4} and losses[2] == 2.25 and math.isnan(losses[3])


@pytest.mark.parametrize("pattern,message", [
    (r"step (\d+) loss (\S+)", "missing: step, loss"),
    (r"step (?P<step>\d+)", "missing: loss"),
    (r"step (?P<step>\d+ loss", "not a regular expression"),
])
def test_a_pattern_without_the_groups_is_refused_with_the_reason(pattern: str,
                                                                 message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_log_pattern(pattern)


def test_missing_logs_give_no_losses(tmp_path: Path) -> None:
    assert losses_from_logs([tmp_path / "nope.log"], PATTERN) == {}
