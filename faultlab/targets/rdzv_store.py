"""The rendezvous store of a local elastic job, in a process of its own.

torchrun's c10d rendezvous lets the agent that binds the endpoint host the store, so killing
that agent's node kills the whole job. Here the store lives in a process that is not a node;
agents join it with ``is_host=false``. It prints its port on stdout (``port=N``) and on the
``--port-file`` once it is listening, and runs until SIGTERM/SIGINT or until its parent dies.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from datetime import timedelta
from pathlib import Path

from torch.distributed import TCPStore

from faultlab.targets.procs import die_with_parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m faultlab.targets.rdzv_store")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--port-file", type=Path)
    args = parser.parse_args(argv)

    parent = os.getppid()
    die_with_parent()
    store = TCPStore(args.host, args.port, is_master=True, wait_for_workers=False,
                     multi_tenant=True, timeout=timedelta(seconds=60))
    if args.port_file:
        tmp = args.port_file.with_suffix(".tmp")
        tmp.write_text(str(store.port))
        os.replace(tmp, args.port_file)
    print(f"port={store.port}", flush=True)

    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    while not done.wait(1.0):
        if os.getppid() != parent:  # the parent died before PDEATHSIG was armed
            break
    del store
    return 0


if __name__ == "__main__":
    sys.exit(main())
