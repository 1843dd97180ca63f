"""Step gates: a fault triggered by step meets the job at that step, however fast it steps.

The engine injects a process, storage, network or live collective fault with ``at_step: N``
when it *sees* step N in the event stream, which it polls every 50 ms. A trainer the engine
does not pace (a user's trainer at integration level 0 or 1: Lightning steps a small model in
8 ms) is several steps and maybe a checkpoint further by then, so "kill rank 1 after step 8" or
"rot the newest checkpoint, then restart" would hit a moving target. So the engine lists those
steps in ``FAULTLAB_STEP_GATES`` (``9,10``), and the level-0 observer of every rank, right after
it has written the record of step N, waits until the engine opens gate N: the file
``RUN_DIR/runtime/gates/step{N}``, created once every fault due at step N has been injected (or
has failed). The gate stays open, so a rank that replays step N after a restart passes at once.
Under faultlab's engine the
wait is on the node relay's socket instead (``faultlab.runtime.uplink``): the engine opens the
gate once, and every waiting rank wakes without touching the shared filesystem; the file is
the fallback when the relay cannot be reached. A gate not opened within
``FAULTLAB_STEP_GATE_TIMEOUT_S`` (60 s: faultlab died, or the fault
never came) is passed with one ``faultlab bootstrap:`` line; the wait never raises.

The pause sits between two steps, outside any collective, so every rank waits at the same
point; the next step's ``step_time_s`` is measured from the end of the wait. A trainer that
writes its own records (level 2, the reference trainer) calls ``Agent.step_done(n)`` of its
runtime agent right after its record of step N, and waits there the same way: without it, a
trainer that paces itself still runs ahead of a fault injected from outside (a machine killed
"at step 12" landed after step 14 on a loaded machine, and lost 2 more steps than the bound).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from faultlab.runtime.uplink import RelayDown, uplink_for

__all__ = ["GATES_ENV", "GATE_TIMEOUT_ENV", "StepGates", "gate_path", "open_gate"]

GATES_ENV = "FAULTLAB_STEP_GATES"
GATE_TIMEOUT_ENV = "FAULTLAB_STEP_GATE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 60.0
_POLL_S = 0.002
_BEAT_EVERY_S = 0.5


def gate_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "runtime" / "gates" / f"step{step}"


def open_gate(run_dir: Path, step: int) -> None:
    """Open gate ``step`` (idempotent): its file, and a line in ``runtime/gates.txt``, which the
    node relays read on the file channel (appended and closed: NFS close-to-open)."""
    path = gate_path(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    with open(path.parent.parent / "gates.txt", "a", encoding="utf-8") as f:
        f.write(f"{step}\n")


def gate_env(steps: Iterable[int], timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, str]:
    """The ranks' environment for gates at ``steps`` (empty: no gate)."""
    steps = sorted(set(steps))
    if not steps:
        return {}
    return {GATES_ENV: ",".join(map(str, steps)), GATE_TIMEOUT_ENV: f"{timeout_s:g}"}


class StepGates:
    """The gates of one rank process (see the module docstring)."""

    def __init__(self, run_dir: Path, steps: Iterable[int],
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.run_dir = Path(run_dir)
        self.steps = frozenset(steps)
        self.timeout_s = timeout_s

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> StepGates:
        """Gates from ``FAULTLAB_STEP_GATES``; ValueError names a malformed variable."""
        run_dir, text = env.get("FAULTLAB_RUN_DIR"), env.get(GATES_ENV, "").strip()
        if not run_dir or not text:
            return cls(Path(run_dir or "."), ())
        try:
            steps = [int(s) for s in text.split(",") if s.strip()]
        except ValueError:
            raise ValueError(f"{GATES_ENV}={text!r}: expected step numbers, comma-separated") \
                from None
        try:
            timeout_s = float(env.get(GATE_TIMEOUT_ENV) or DEFAULT_TIMEOUT_S)
        except ValueError:
            raise ValueError(f"{GATE_TIMEOUT_ENV}={env.get(GATE_TIMEOUT_ENV)!r}: expected "
                             f"seconds") from None
        return cls(Path(run_dir), steps, timeout_s)

    def wait(self, step: int, beat: Callable[[], None] | None = None
             ) -> tuple[float, bool] | None:
        """After step ``step``: wait for its gate. None: no gate there; else (seconds waited,
        whether it was opened rather than timed out). ``beat`` is called every half second
        while waiting: a trainer's own step watchdog must not take the pause for a hang."""
        if step not in self.steps:
            return None
        uplink = uplink_for(self.run_dir)
        if uplink is not None and not uplink.down:
            try:
                return uplink.wait_gate(step, self.timeout_s, beat, _BEAT_EVERY_S)
            except RelayDown:
                pass  # the gate file below
        path = gate_path(self.run_dir, step)
        t0 = last_beat = time.monotonic()
        while not os.path.exists(path):
            now = time.monotonic()
            if now - t0 >= self.timeout_s:
                return now - t0, False
            if beat is not None and now - last_beat >= _BEAT_EVERY_S:
                beat()
                last_beat = now
            time.sleep(_POLL_S)
        return time.monotonic() - t0, True
