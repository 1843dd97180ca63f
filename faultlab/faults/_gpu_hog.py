"""The memory hog of ``gpu_oom`` on a real GPU: take all but ``--leave-mib`` of each device,
hold it until terminated, and exit by itself as soon as faultlab (``--parent``) is gone, so a
killed faultlab never leaves a device full.

    python -m faultlab.faults._gpu_hog --parent PID --leave-mib N --devices 0[,1...]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="faultlab.faults._gpu_hog")
    ap.add_argument("--parent", type=int, required=True)
    ap.add_argument("--leave-mib", type=int, required=True)
    ap.add_argument("--devices", required=True)
    args = ap.parse_args(argv)
    import torch

    held = []
    for device in (int(d) for d in args.devices.split(",")):
        free, _ = torch.cuda.mem_get_info(device)
        take = free - args.leave_mib * 2**20
        if take > 0:
            held.append(torch.empty(take, dtype=torch.uint8, device=f"cuda:{device}"))
        print(f"faultlab gpu_oom hog: pid {os.getpid()} holds {max(take, 0) / 2**30:.2f} GiB "
              f"of cuda:{device}, leaving {args.leave_mib} MiB", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        try:
            os.kill(args.parent, 0)
        except ProcessLookupError:
            return 0
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
