"""faultlab's torchrun agent at exit: a signal ends torchrun with its rendezvous keep-alive thread
still running (on purpose: closing the rendezvous would end it for the other nodes), and a
daemon thread inside a TCPStore call while the interpreter finalizes aborts the process
("terminate called without an active exception"). The agent stops those threads first."""

from __future__ import annotations

import subprocess
import sys
import threading
from datetime import timedelta

from torch.distributed.elastic.rendezvous.utils import _PeriodicTimer

from faultlab.targets import torchrun_agent

# A keep-alive heartbeat caught inside its store call when torchrun's main raises the
# SignalException of a SIGTERM: real TCPStore, torch's own _PeriodicTimer, faultlab's exit path.
SIGNALLED_AGENT = """
import signal, sys, threading, time
from datetime import timedelta
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.rendezvous.utils import _PeriodicTimer
from faultlab.targets import torchrun_agent

store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=1))
inside = threading.Event()

def heartbeat():
    inside.set()
    try:
        store.get("never-set")  # C++, GIL released, as a heartbeat's compare_set can be
    except Exception:
        pass

timer = _PeriodicTimer(timedelta(seconds=0.01), heartbeat)
timer.set_name("RendezvousKeepAliveTimer_0")
timer.start()

def main():
    assert inside.wait(10)
    time.sleep(0.7)  # the store call times out (1 s) while the interpreter finalizes
    raise SignalException("Process got signal: 15", sigval=signal.SIGTERM)

torchrun_agent.run_agent(main)
"""


def test_a_signalled_agent_exits_with_its_error_not_an_abort() -> None:
    # Without the stop (torchrun's main called directly) this script aborted 8 of 8 times.
    done = subprocess.run([sys.executable, "-c", SIGNALLED_AGENT], capture_output=True,
                          text=True, timeout=120)
    assert "terminate called" not in done.stderr, done.stderr
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "SignalException: Process got signal: 15" in done.stderr
    assert "still running after" not in done.stderr


def test_stop_timers_is_bounded_and_names_a_thread_it_could_not_stop() -> None:
    release, inside = threading.Event(), threading.Event()

    def stuck() -> None:
        inside.set()
        release.wait(30)

    timer = _PeriodicTimer(timedelta(seconds=0.01), stuck)
    timer.set_name("RendezvousKeepAliveTimer_test")
    timer.start()
    assert inside.wait(10)
    try:
        assert torchrun_agent.stop_timers(0.05) == ["RendezvousKeepAliveTimer_test"]
    finally:
        release.set()
    assert torchrun_agent.stop_timers(10) == []
    assert not timer._thread.is_alive()  # stopped for good: the stop event stays set
