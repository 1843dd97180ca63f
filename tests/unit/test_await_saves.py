"""A fault that picks the job's checkpoints waits for the saving ranks' records
(``faultlab.engine.runner._await_saves``): a step trigger fires on the first rank's record,
and the rank that saved may still have its save's record in flight through its own relay."""

from __future__ import annotations

import time
from typing import Any

from faultlab.engine.runner import _await_saves
from faultlab.engine.view import NullView
from faultlab.faults.process import RankKillFault
from faultlab.faults.storage import CkptBitflipFault


class _Stream:
    """Records by kind; each ``poll`` brings the next batch in, as a relay would."""

    def __init__(self, now: list[dict[str, Any]], later: list[list[dict[str, Any]]]) -> None:
        self.records, self.later, self.polls = list(now), list(later), 0

    def max_step(self) -> int:
        return max((r["step"] for r in self.records if r["kind"] == "step"), default=0)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == kind]

    def poll(self) -> list[dict[str, Any]]:
        self.polls += 1
        new = self.later.pop(0) if self.later else []
        self.records += new
        return new


class _Target:
    def __init__(self, stream: _Stream) -> None:
        self.stream = stream


def _step(rank: int, step: int) -> dict[str, Any]:
    return {"kind": "step", "rank": rank, "step": step}


def _saved(rank: int, step: int, path: str) -> dict[str, Any]:
    return {"kind": "checkpoint_saved", "rank": rank, "step": step, "path": path}


def test_it_waits_for_the_saving_ranks_records_up_to_the_step_the_trigger_saw() -> None:
    # rank 1's step 9 arrived; rank 0's rewrite of last.ckpt and its step 9 are in flight
    stream = _Stream([_step(0, 8), _step(1, 8), _saved(0, 8, "epoch=1-step=8.ckpt"),
                      _step(1, 9)],
                     [[], [_saved(0, 8, "last.ckpt")], [_step(0, 9)], [_step(1, 10)]])
    _await_saves(_Target(stream), NullView(), grace_s=5.0)  # type: ignore[arg-type]
    assert [r["path"] for r in stream.of_kind("checkpoint_saved")] == [
        "epoch=1-step=8.ckpt", "last.ckpt"]
    assert stream.polls == 3  # not a poll more: the step the trigger saw, not the job's next


def test_a_saving_rank_that_never_reports_the_step_costs_the_grace_and_no_more() -> None:
    stream = _Stream([_saved(0, 4, "step_4"), _step(0, 5), _step(1, 9)], [])
    t0 = time.monotonic()
    _await_saves(_Target(stream), NullView(), grace_s=0.2)  # type: ignore[arg-type]
    assert 0.2 <= time.monotonic() - t0 and stream.polls >= 1
    caught_up = _Stream([_saved(0, 4, "step_4"), _step(0, 9), _step(1, 9)], [])
    _await_saves(_Target(caught_up), NullView(), grace_s=5.0)  # type: ignore[arg-type]
    assert caught_up.polls == 0


def test_only_the_faults_that_read_saved_checkpoints_wait() -> None:
    assert CkptBitflipFault.reads_saved_checkpoints is True
    assert getattr(RankKillFault, "reads_saved_checkpoints", False) is False
