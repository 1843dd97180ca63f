"""Who a rank's process is: its run directory, rank, world size, restart count, node and pid,
from the environment torchrun and faultlab's launcher set. The emitter, the uplink to the node's
relay and the runtime agent all start from it."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Identity"]


@dataclass(frozen=True, slots=True)
class Identity:
    """Who this process is, from the environment torchrun and faultlab set."""

    run_dir: Path
    rank: int
    world_size: int
    restart: int
    node: str
    pid: int

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Identity:
        def num(name: str, default: int) -> int:
            raw = env.get(name) or str(default)
            try:
                return int(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not an integer") from None
        # Where every node is a torchrun world of its own (torchft's replica groups), each
        # world's ranks start at 0: faultlab's launcher gives each node its offset and the
        # job's size, so that a rank names one process across the job.
        return cls(run_dir=Path(env["FAULTLAB_RUN_DIR"]),
                   rank=num("FAULTLAB_RANK_OFFSET", 0) + num("RANK", 0),
                   world_size=num("FAULTLAB_WORLD_SIZE", 0) or num("WORLD_SIZE", 1),
                   restart=num("TORCHELASTIC_RESTART_COUNT", 0),
                   node=env.get("FAULTLAB_NODE") or socket.gethostname(), pid=os.getpid())
