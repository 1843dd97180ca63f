"""``slurm_preempt`` waits until the ranks have the signal: ``scancel`` returns before Slurm has
delivered it, and the step gate must not open before the notice is in (the ranks would then
run a step or two further and save a later step on one run than on another)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

from faultlab.faults.slurm import _notices
from faultlab.observe import EventStream
from faultlab.runtime.events import EventLog


def _job(tmp_path: Path) -> tuple[SimpleNamespace, list[EventLog]]:
    (tmp_path / "events").mkdir()
    logs = [EventLog(tmp_path / "events", rank=r, world_size=2, node=f"node{r + 1}", restart=0,
                     suffix=f"-r{r}") for r in (0, 1)]
    for r, log in enumerate(logs):
        log.base["pid"] = 100 + r  # two processes, as on two nodes
        log.emit("start", resumed_from_step=0)
    stream = EventStream(tmp_path / "events")
    stream.poll()
    return SimpleNamespace(attached=False, stream=stream, ranks=stream.current_ranks), logs


def test_the_injection_returns_once_every_rank_reported_the_signal(tmp_path: Path) -> None:
    ctx, (rank0, rank1) = _job(tmp_path)
    t = time.time()
    rank0.emit("preemption_notice", provider="slurm", signal="SIGTERM")
    threading.Timer(0.3, rank1.emit, ("preemption_notice",), {"provider": "slurm"}).start()
    got = _notices(ctx, t, timeout_s=10)
    assert got["notice_missing"] == [] and set(got["notice_delivered_s"]) == {"0", "1"}
    assert got["notice_delivered_s"]["1"] >= 0.25 and time.time() - t < 5


def test_a_rank_that_never_reports_it_is_named_after_the_timeout(tmp_path: Path) -> None:
    ctx, (rank0, _rank1) = _job(tmp_path)
    rank0.emit("preemption_notice", provider="slurm")  # before the signal: not this one
    t = time.time()
    rank0.emit("preemption_notice", provider="slurm")
    got = _notices(ctx, t, timeout_s=0.3)
    assert got["notice_missing"] == [1] and list(got["notice_delivered_s"]) == ["0"]
    assert time.time() - t >= 0.3
