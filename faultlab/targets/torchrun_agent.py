"""torchrun's agent with the rendezvous made to poll every 0.1 s instead of every second.

While an agent waits for the other nodes, ``DynamicRendezvousHandler`` sleeps a hard-coded
second between polls (``_delay(seconds=1)``) and serves reads of the shared state from a cache
that lives one second (``_BackendRendezvousStateHolder(cache_duration=1)``), both in
torch/distributed/elastic/rendezvous/dynamic_rendezvous.py. After a failure every surviving
agent re-joins, and those seconds add straight to the job's recovery time (measured here: the
re-rendezvous of two agents took 1.3-2.0 s; with these two changes, about 0.1 s). Polling a
TCPStore ten times a second from a handful of agents costs nothing. Everything else is
``torch.distributed.run`` unchanged: ``python -m faultlab.targets.torchrun_agent --help``.
"""

from __future__ import annotations

import os

from torch.distributed.elastic.rendezvous import dynamic_rendezvous

POLL_S = float(os.environ.get("FAULTLAB_RDZV_POLL_S", "0.1"))

_upstream_delay = dynamic_rendezvous._delay
_upstream_holder_init = dynamic_rendezvous._BackendRendezvousStateHolder.__init__


def _delay(seconds: float | tuple[float, float]) -> None:
    _upstream_delay(POLL_S if seconds == 1 else seconds)


def _holder_init(self, backend, settings, cache_duration=1):  # type: ignore[no-untyped-def]
    _upstream_holder_init(self, backend, settings, cache_duration=POLL_S)


def _survive_usr1() -> None:
    """Slurm delivers ``scancel --signal=USR1`` (and ``--signal=USR1@T``) to every process of a
    step: torchrun's agent has no handler and dies of it, orphaning its workers, which then
    escape ``proctrack/linuxproc`` (measured: the job's cancel took 65 s). A no-op handler keeps
    the agent alive; exec resets a caught signal, so the workers keep the default and see the
    notice as the trainer decides."""
    import signal

    signal.signal(signal.SIGUSR1, lambda _signum, _frame: None)


dynamic_rendezvous._delay = _delay
dynamic_rendezvous._BackendRendezvousStateHolder.__init__ = _holder_init  # type: ignore[method-assign]

if __name__ == "__main__":
    from torch.distributed.run import main

    _survive_usr1()
    main()
