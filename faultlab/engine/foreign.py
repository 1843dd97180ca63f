"""What the engine adds for a job that does not write the whole event protocol itself.

A user's trainer run at level 0 (``target.command``, unchanged) or level 1 reports starts,
steps, checkpoints and exits through faultlab's runtime agent, but no ``final_digest`` (the
hash of its full final state) and usually no loss. After the job has stopped, the engine:

- reads the job's final checkpoint back (``faultlab.observe.final_state``) and appends a
  ``final_digest`` record for it to ``RUN_DIR/events/faultlab-final.jsonl`` (``source:
  final_checkpoint``, with the checkpoint's path and every tensor's hash), so completion and
  the bitwise verdict go through the one code path of ``observe``/``judge``; when there is no
  final checkpoint, nothing is appended and the reason is returned for the verdict's note;
- reads the loss from the nodes' logs with ``observe.log_pattern``, when one is given.

A job whose events already hold a ``final_digest`` (the reference trainer, level 2) is left
as it is.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from faultlab.observe.final_state import FinalState, final_checkpoint_state
from faultlab.observe.logs import losses_from_logs
from faultlab.spec import Experiment

__all__ = ["FINAL_EVENTS_FILE", "complete_events", "log_losses"]

FINAL_EVENTS_FILE = "faultlab-final.jsonl"


def complete_events(run_dir: Path, events: Sequence[Mapping[str, Any]]) -> FinalState | None:
    """Append the ``final_digest`` of the job's final checkpoint when the job wrote none;
    returns what was read back (None: the job wrote its own digest)."""
    if any(e.get("kind") == "final_digest" for e in events):
        return None
    state = final_checkpoint_state(events, run_dir)
    if state.digest is None:
        return state
    world = max((w for e in events if isinstance(w := e.get("world_size"), int)), default=1)
    record = {"t": time.time(), "kind": "final_digest", "rank": 0, "world_size": world,
              "pid": os.getpid(), "restart": 0, "node": "faultlab", "digest": state.digest,
              "source": "final_checkpoint", "path": state.path, "step": state.step,
              "tensors": state.tensors}
    events_dir = run_dir / "events"
    events_dir.mkdir(parents=True, exist_ok=True)
    with open(events_dir / FINAL_EVENTS_FILE, "a") as f:
        f.write(json.dumps(record) + "\n")
    return state


def log_losses(exp: Experiment, run_dir: Path) -> dict[int, float]:
    """Step → loss from the nodes' logs with ``observe.log_pattern`` (empty without one)."""
    pattern = exp.observe.log_pattern if exp.observe else None
    if not pattern:
        return {}
    logs = run_dir / "logs"  # a Slurm job of the user's script: its output file
    return losses_from_logs(sorted(logs.glob("node*.log")) + sorted(logs.glob("slurm-*.out")),
                            pattern)
