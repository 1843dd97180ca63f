"""The process faults against real processes, through a minimal FaultContext.

Each "rank" and "node" here is a real sleeping Python process; the context owns only them, so
these tests also show that a fault never signals a process outside its job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from faultlab.errors import FaultError
from faultlab.faults import Victim, fault_types
from faultlab.faults.process import NodeHangFault, NodeKillFault, RankHangFault, RankKillFault
from faultlab.reaper import continue_and_kill

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


V = Victim


class Ctx:
    """Two ranks, each its own process, and one 'node': a parent with a child worker."""

    def __init__(self) -> None:
        self.ranks_ = {r: subprocess.Popen(SLEEPER) for r in (0, 1)}
        self.agent = subprocess.Popen([sys.executable, "-c",
                                       "import subprocess, sys, time; "
                                       f"subprocess.Popen({SLEEPER!r}); time.sleep(600)"])
        deadline = time.monotonic() + 20
        while not psutil.Process(self.agent.pid).children() and time.monotonic() < deadline:
            time.sleep(0.05)

    def owned(self) -> set[int]:
        pids = {p.pid for p in self.ranks_.values()} | {self.agent.pid}
        try:
            pids |= {c.pid for c in psutil.Process(self.agent.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
        return pids

    # FaultContext
    def rank_pid(self, rank: int) -> int:
        return self.ranks_[rank].pid

    def ranks(self) -> list[int]:
        return sorted(self.ranks_)

    def node_names(self) -> list[str]:
        return ["node0"]

    def node_of_rank(self, rank: int) -> str:
        return "node0"

    def node_pids(self, node: str) -> list[int]:
        agent = psutil.Process(self.agent.pid)
        return [agent.pid, *(c.pid for c in agent.children(recursive=True))]

    def kill_node(self, node: str, sig: int) -> list[int]:
        pids = self.node_pids(node)
        for pid in pids:
            psutil.Process(pid).send_signal(sig)
        return pids

    def assert_owned(self, pid: int) -> None:
        if pid not in self.owned():
            raise FaultError(f"process {pid} is not part of the job")

    def signal(self, pid: int, sig: int) -> bool:
        self.assert_owned(pid)
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return False
        return True

    def cleanup(self) -> None:
        continue_and_kill(sorted(self.owned()))
        for p in [*self.ranks_.values(), self.agent]:
            p.wait(timeout=10)


@pytest.fixture
def ctx() -> Iterator[Ctx]:
    c = Ctx()
    yield c
    c.cleanup()


def status(pid: int) -> str:
    try:
        return psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return "gone"


def wait_status(pid: int, want: str, timeout_s: float = 10) -> str:
    deadline = time.monotonic() + timeout_s
    while status(pid) != want and time.monotonic() < deadline:
        time.sleep(0.02)
    return status(pid)


def wait_running(pid: int, timeout_s: float = 10) -> bool:
    """Continued: not stopped any more (sleeping, or still busy starting up)."""
    deadline = time.monotonic() + timeout_s
    while status(pid) == psutil.STATUS_STOPPED and time.monotonic() < deadline:
        time.sleep(0.02)
    return status(pid) in (psutil.STATUS_SLEEPING, psutil.STATUS_RUNNING)


def test_builtin_process_faults_are_registered_through_entry_points() -> None:
    types = fault_types()
    assert types["rank_kill"] is RankKillFault and types["node_kill"] is NodeKillFault
    assert types["rank_hang"] is RankHangFault and types["node_hang"] is NodeHangFault
    assert RankHangFault.reversible and NodeHangFault.reversible
    assert not RankKillFault.reversible and not NodeKillFault.reversible


@pytest.mark.parametrize("name", ["KILL", "TERM", "SEGV", "ABRT"])
def test_rank_kill_sends_the_chosen_signal(ctx: Ctx, name: str) -> None:
    fault = RankKillFault(RankKillFault.Params(signal=name))  # type: ignore[call-arg]
    details: dict[str, Any] = fault.inject(ctx, V("rank", 1))
    assert details == {"signal": f"SIG{name}", "pids_by_rank": {1: ctx.ranks_[1].pid}}
    assert ctx.ranks_[1].wait(timeout=10) == -signal.Signals[f"SIG{name}"]
    assert ctx.ranks_[0].poll() is None  # the other rank is untouched


def test_rank_kill_of_all_ranks(ctx: Ctx) -> None:
    RankKillFault(RankKillFault.Params()).inject(ctx, V("all", None))
    assert [p.wait(timeout=10) for p in ctx.ranks_.values()] == [-9, -9]


def test_rank_hang_stops_and_undo_continues(ctx: Ctx) -> None:
    fault = RankHangFault(RankHangFault.Params())
    pid = ctx.ranks_[0].pid
    assert fault.inject(ctx, V("rank", 0)) == {"signal": "SIGSTOP", "pids": [pid]}
    assert wait_status(pid, psutil.STATUS_STOPPED) == psutil.STATUS_STOPPED
    assert fault.undo(ctx) == {"continued": [pid]}
    assert wait_running(pid)
    assert fault.undo(ctx) == {"continued": []}  # idempotent


def test_node_hang_freezes_agent_and_workers_and_undo_continues_all(ctx: Ctx) -> None:
    fault = NodeHangFault(NodeHangFault.Params())
    pids = fault.inject(ctx, V("node", 0))["pids"]
    assert len(pids) == 2 and ctx.agent.pid in pids
    assert all(wait_status(p, psutil.STATUS_STOPPED) == psutil.STATUS_STOPPED for p in pids)
    assert sorted(fault.undo(ctx)["continued"]) == sorted(pids)
    assert all(wait_running(p) for p in pids)


# A node as torchrun's is when its job restarted while it was frozen: once continued, its agent
# kills its worker at once; the worker's child lives in a session of its own (the node relay).
AGENT_THAT_KILLS_ITS_WORKER = f"""
import signal, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                           "subprocess.Popen({SLEEPER!r}, start_new_session=True); "
                           "time.sleep(600)"])
signal.signal(signal.SIGCONT, lambda *_: worker.kill())
time.sleep(600)
"""


class LoadedCtx(Ctx):
    """The node above, and a signal that takes 0.2 s to return, as on a loaded machine."""

    def __init__(self) -> None:  # not Ctx.__init__: its node is not this one
        self.ranks_ = {}
        self.agent = subprocess.Popen([sys.executable, "-c", AGENT_THAT_KILLS_ITS_WORKER])
        deadline = time.monotonic() + 20
        while len(self.node_pids("node0")) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)

    def signal(self, pid: int, sig: int) -> bool:
        sent = super().signal(pid, sig)
        time.sleep(0.2)
        return sent


def test_node_hang_undo_continues_the_workers_children_before_the_agent_can_orphan_them(
        ) -> None:
    ctx = LoadedCtx()
    pids = ctx.node_pids("node0")
    try:
        fault = NodeHangFault(NodeHangFault.Params())
        assert fault.inject(ctx, V("node", 0))["pids"] == pids and len(pids) == 3
        assert all(wait_status(p, psutil.STATUS_STOPPED) == psutil.STATUS_STOPPED for p in pids)
        agent, _worker, relay = pids
        assert fault.undo(ctx)["continued"][-1] == agent  # the agent last
        assert wait_running(relay)  # with the agent first, it stayed stopped, orphaned
    finally:
        continue_and_kill([p for p in pids if status(p) != "gone"])
        ctx.cleanup()


def test_node_kill_takes_agent_and_workers_at_once(ctx: Ctx) -> None:
    pids = NodeKillFault(NodeKillFault.Params()).inject(ctx, V("node", 0))["pids"]
    assert len(pids) == 2
    assert ctx.agent.wait(timeout=10) == -9
    assert all(wait_status(p, "gone") in ("gone", psutil.STATUS_ZOMBIE) for p in pids)


def test_undo_of_a_process_that_died_meanwhile_does_not_raise(ctx: Ctx) -> None:
    fault = RankHangFault(RankHangFault.Params())
    fault.inject(ctx, V("rank", 1))
    ctx.ranks_[1].kill()
    ctx.ranks_[1].wait(timeout=10)
    assert fault.undo(ctx) == {"continued": []}


def test_a_process_outside_the_job_is_never_signalled(ctx: Ctx) -> None:
    stranger = subprocess.Popen(SLEEPER)
    try:
        ctx.ranks_[5] = stranger  # the context maps a rank to it, but does not own it
        owned = ctx.owned
        ctx.owned = lambda: owned() - {stranger.pid}  # type: ignore[method-assign]
        for fault in (RankKillFault(RankKillFault.Params()), RankHangFault(RankHangFault.Params())):
            with pytest.raises(FaultError, match="not part of the job"):
                fault.inject(ctx, V("rank", 5))
        assert stranger.poll() is None and status(stranger.pid) != psutil.STATUS_STOPPED
    finally:
        del ctx.ranks_[5]
        stranger.kill()
        stranger.wait()
