"""The reference trainer's last phase (``train.finish``) when the last step cannot be made
durable: its final save fails and so does the forced retry. The rank must leave with
``checkpoint_save_failed`` (exit code 9), say which step was last committed, and leave its
process group, so that the agent restarts the group from that checkpoint. A real job reaches
this only when the storage stays broken across both tries; here the checkpointer's save
answers False, and leaving the group is recorded, not done: the unit tests' one-rank process
group (tests/unit/conftest.py ``mesh``) lives for the whole session."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch.distributed as dist

from reference_trainer.health import EXIT_CODES
from reference_trainer.train import finish


class _Ckpt:
    def __init__(self, committed_step: int) -> None:
        self.committed_step = committed_step
        self.saves: list[tuple[int, bool]] = []

    def wait(self) -> None:
        pass

    def save(self, step: int, model: Any, optimizer: Any, state: dict[str, Any], *,
             force_sync: bool = False) -> bool:
        self.saves.append((step, force_sync))
        return False  # the retry fails too


def test_a_last_step_that_cannot_be_saved_exits_9_naming_the_committed_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    left: list[bool] = []
    monkeypatch.setattr(dist, "destroy_process_group", lambda *a, **kw: left.append(True))
    records: list[tuple[str, dict[str, Any]]] = []
    state = SimpleNamespace(state_dict=lambda: {})
    run = SimpleNamespace(
        watcher=None, ckpt=_Ckpt(committed_step=30), model=None, optimizer=None,
        sampler=state, scheduler=state, world_size=1,
        cfg=SimpleNamespace(steps=40, to_json=lambda: {}),
        events=SimpleNamespace(emit=lambda kind, **kw: records.append((kind, kw))))
    code = finish(run, 40)  # type: ignore[arg-type]
    assert code == EXIT_CODES["checkpoint_save_failed"] == 9
    assert run.ckpt.saves == [(40, True)]  # the forced, synchronous retry
    assert records == [("exit", {"reason": "checkpoint_save_failed", "code": 9, "step": 40,
                                 "committed_step": 30})]
    assert left == [True]  # left its group: the agent restarts the group
