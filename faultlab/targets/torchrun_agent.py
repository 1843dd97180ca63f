"""torchrun's agent with the rendezvous made to poll every 0.1 s instead of every second.

While an agent waits for the other nodes, ``DynamicRendezvousHandler`` sleeps a hard-coded
second between polls (``_delay(seconds=1)``) and serves reads of the shared state from a cache
that lives one second (``_BackendRendezvousStateHolder(cache_duration=1)``), both in
torch/distributed/elastic/rendezvous/dynamic_rendezvous.py. After a failure every surviving
agent re-joins, and those seconds add straight to the job's recovery time (measured here: the
re-rendezvous of two agents took 1.3-2.0 s; with these two changes, about 0.1 s). Polling a
TCPStore ten times a second from a handful of agents costs nothing. Everything else is
``torch.distributed.run`` unchanged: ``python -m faultlab.targets.torchrun_agent --help``.

One more change, at exit: an agent stopped by a signal (SIGTERM from the job's own node-leave,
a preemption, faultlab's teardown) aborts now and then with "terminate called without an
active exception". torchrun leaves the rendezvous keep-alive thread running on purpose when a
signal ends the agent (``launch_agent`` skips ``rdzv_handler.shutdown()``, which would close the
rendezvous for the other nodes), and ``_PeriodicTimer`` does not stop it at exit either. When
the interpreter finalizes while that daemon thread is inside a TCPStore call, the thread comes
back to a finalized interpreter inside a C++ frame that must not unwind, and the process
aborts (seen in 1 of 20 soak runs of ``gpu_lost_sticky``; a daemon thread in a TCPStore call at
exit aborted 17 of 18 times here). The agent therefore stops its keep-alive threads, without
closing the rendezvous, before it exits (bounded: ``FAULTLAB_AGENT_EXIT_JOIN_S``, default 5 s).
"""

from __future__ import annotations

import os
import sys
import time
import weakref
from collections.abc import Callable

from torch.distributed.elastic.rendezvous import dynamic_rendezvous
from torch.distributed.elastic.rendezvous import utils as rdzv_utils

POLL_S = float(os.environ.get("FAULTLAB_RDZV_POLL_S", "0.1"))
EXIT_JOIN_S = float(os.environ.get("FAULTLAB_AGENT_EXIT_JOIN_S", "5"))

_timers: weakref.WeakSet = weakref.WeakSet()
_upstream_timer_start = rdzv_utils._PeriodicTimer.start

_upstream_delay = dynamic_rendezvous._delay
_upstream_holder_init = dynamic_rendezvous._BackendRendezvousStateHolder.__init__


def _delay(seconds: float | tuple[float, float]) -> None:
    _upstream_delay(POLL_S if seconds == 1 else seconds)


def _holder_init(self, backend, settings, cache_duration=1):
    _upstream_holder_init(self, backend, settings, cache_duration=POLL_S)


def _survive_usr1() -> None:
    """Slurm delivers ``scancel --signal=USR1`` (and ``--signal=USR1@T``) to every process of a
    step: torchrun's agent has no handler and dies of it, orphaning its workers, which then
    escape ``proctrack/linuxproc`` (measured: the job's cancel took 65 s). A no-op handler keeps
    the agent alive; exec resets a caught signal, so the workers keep the default and see the
    notice as the trainer decides."""
    import signal

    signal.signal(signal.SIGUSR1, lambda _signum, _frame: None)


def _timer_start(self) -> None:
    _timers.add(self)
    _upstream_timer_start(self)


def stop_timers(budget_s: float = EXIT_JOIN_S) -> list[str]:
    """Stop every ``_PeriodicTimer`` this process started (the rendezvous keep-alive among
    them) and wait for each thread to leave its current call, ``budget_s`` in all; touches no
    store and closes no rendezvous. Returns the names of threads still running after it."""
    deadline = time.monotonic() + budget_s
    threads = []
    for timer in list(_timers):
        ctx, thread = getattr(timer, "_ctx", None), getattr(timer, "_thread", None)
        if ctx is None or thread is None:
            continue
        ctx.stop_event.set()
        threads.append(thread)
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [t.name for t in threads if t.is_alive()]


def run_agent(main: Callable[[], object]) -> None:
    """Run torchrun's ``main`` and, however it ends, stop the keep-alive threads before the
    interpreter finalizes (see the module's docstring)."""
    try:
        main()
    finally:
        left = stop_timers()
        if left:
            print(f"faultlab torchrun_agent: {', '.join(left)} still running after "
                  f"{EXIT_JOIN_S:g} s (FAULTLAB_AGENT_EXIT_JOIN_S), probably inside a store "
                  f"call; exiting anyway (the process may abort at exit)",
                  file=sys.stderr, flush=True)


dynamic_rendezvous._delay = _delay
dynamic_rendezvous._BackendRendezvousStateHolder.__init__ = _holder_init  # type: ignore[method-assign]
rdzv_utils._PeriodicTimer.start = _timer_start  # type: ignore[method-assign]

if __name__ == "__main__":
    from torch.distributed.run import main

    _survive_usr1()
    run_agent(main)
