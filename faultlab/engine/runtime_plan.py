"""How the engine hands in-rank faults to the job: a launch plan, a secret, a control channel.

Every job the engine launches gets, in ``JOB_DIR/runtime/``:

- ``secret`` (mode 0600): the per-run secret of the runtime agents' control channel, also given
  to every rank as ``FAULTLAB_RUNTIME_SECRET``. Faults injected live (time triggers, events,
  Chaos Toolkit actions against an attached job) send it; an agent ignores anything else.
- ``plan.json``: the in-rank faults whose action strikes at a step (``RuntimeFault.strikes ==
  "at_step"``: ``grad_nan``, ``grad_inf``, ``loss_spike``, ``weight_bitflip``, a team's own)
  triggered with ``at_step``, decided before the launch and given to every rank as
  ``FAULTLAB_RUNTIME_PLAN`` (each entry names its rank-side action and carries its validated
  parameters): same plan, same injections, step-exact (``at_step: N``
  strikes during step N), and fired once per job even when a rollback or a restart replays the
  step; and a window fault whose parameters give ``num_steps`` (``collective_delay``) with
  ``at_step``: the step window
  ``N .. N + num_steps - 1`` (a replayed step is delayed again, as a slow link would); and a
  window fault that declares ``planned_from_step`` (``sdc``) with ``at_step``: from step N to
  the end of the job, in every process that runs it (a restarted one too). Their
  injection time is the one the rank reports in its ``fault_injected`` event.

Other collective faults are injected live even when triggered by step (``at_step: N`` fires once
step N is logged, so it strikes from step N + 1): they last until undone, and undoing a live
fault is final, whereas a planned window would start again in every restarted process.

Every fault injected from outside with ``at_step: N`` (process, storage, network, live
collective) gets a *step gate* at N (``faultlab.runtime.gates``): a user's trainer at level 0
or 1 pauses after step N until the engine has injected every fault due there
(:meth:`RuntimeSetup.open_due_gates`), so the fault meets the job at step N, not a few steps
later. The engine opens every gate when the run ends, whatever the reason.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from faultlab.faults.runtime_base import RuntimeFault
from faultlab.runtime.auto import STEP_DIGEST_ENV
from faultlab.runtime.client import new_secret, read_secret
from faultlab.runtime.gates import gate_env, open_gate
from faultlab.runtime.plan import write_plan
from faultlab.runtime.relay import CHANNEL_ENV, GATES_FILE
from faultlab.spec import Experiment

__all__ = ["RuntimeSetup", "planned_victim_ranks", "read_secret"]


def planned_victim_ranks(exp: Experiment, index: int) -> list[int] | None | Literal[False]:
    """Ranks of a planned fault (None: every rank), or False if it cannot be planned."""
    spec = exp.faults[index]
    if not issubclass(spec.fault_class, RuntimeFault) or spec.trigger.at_step is None:
        return False
    # at_step: strikes at its step; window: plannable when its parameters bound the window
    windowed = getattr(spec.params, "num_steps", None) or spec.fault_class.planned_from_step
    if spec.fault_class.strikes != "at_step" and not windowed:
        return False
    kind = spec.target.kind
    if kind == "all":
        return None
    if kind == "rank" and isinstance(spec.target.value, int):
        return [spec.target.value]
    return False  # a node's ranks (or a random pick) are known only once the job runs


@dataclass
class RuntimeSetup:
    """The runtime files of one job and the environment every rank gets."""

    job_dir: Path
    secret: str
    planned: dict[int, list[int] | None] = field(default_factory=dict)
    """Fault index → victim ranks (None: all) of the faults in the launch plan."""
    gates: dict[int, list[int]] = field(default_factory=dict)
    """Gate step → the indexes of the faults injected from outside at that step."""
    opened: set[int] = field(default_factory=set)
    step_digest: bool = False
    """``observe.step_digest``: every step record carries the weights' digest."""
    channel: str = "socket"
    """``run.control_channel``: how the node relays reach the engine (``runtime.relay``)."""
    hub: Any = None
    """The engine's hub (socket channel), told of every gate opened."""

    @classmethod
    def create(cls, exp: Experiment, job_dir: Path) -> RuntimeSetup:
        root = job_dir / "runtime"
        root.mkdir(parents=True, exist_ok=True)
        setup = cls(job_dir, new_secret(), step_digest=bool(exp.observe.step_digest),
                    channel=exp.run.control_channel)
        (root / GATES_FILE).touch()  # before any node looks it up (NFS caches a miss)
        fd = os.open(root / "secret", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(setup.secret)
        entries: list[dict[str, Any]] = []
        for i, spec in enumerate(exp.faults):
            ranks = planned_victim_ranks(exp, i)
            at = spec.trigger.at_step
            if ranks is False or at is None:  # a planned fault always has its at_step
                if at is not None and spec.fault_class.step_gated:
                    setup.gates.setdefault(at, []).append(i)
                continue
            fault = spec.build()
            assert isinstance(fault, RuntimeFault)
            setup.planned[i] = ranks
            num_steps = getattr(spec.params, "num_steps", None)
            if num_steps:  # a window of steps rather than one step
                entry = fault.plan_entry(spec.fault_id, ranks, None)
                entry.update(from_step=at, to_step=at + num_steps - 1)
            elif fault.strikes == "window":  # planned_from_step: from N to the job's end
                entry = fault.plan_entry(spec.fault_id, ranks, None)
                entry.update(from_step=at)
            else:
                entry = fault.plan_entry(spec.fault_id, ranks, [at])
            entries.append(entry)
        write_plan(root / "plan.json", entries)
        return setup

    @property
    def env(self) -> dict[str, str]:
        return {"FAULTLAB_RUNTIME_SECRET": self.secret, CHANNEL_ENV: self.channel,
                "FAULTLAB_RUNTIME_PLAN": str(self.job_dir / "runtime" / "plan.json"),
                **gate_env(self.gates),
                **({STEP_DIGEST_ENV: "1"} if self.step_digest else {})}

    def open_due_gates(self, fired: Sequence[int]) -> list[int]:
        """Open each gate whose faults have all fired (``fired[i]``: times fault ``i`` fired);
        returns the steps opened now."""
        now = [step for step, faults in self.gates.items()
               if step not in self.opened and all(fired[i] for i in faults)]
        for step in now:
            self._open(step)
        return now

    def _open(self, step: int) -> None:
        if self.hub is not None:
            self.hub.open_gate(step)
        open_gate(self.job_dir, step)
        self.opened.add(step)

    def open_all_gates(self) -> None:
        """The run is over: no rank may wait for a gate any more."""
        for step in self.gates:
            if step not in self.opened:
                self._open(step)


