"""The contract every fault implements, built-in or third-party.

A fault is a class registered under the entry-point group ``faultlab.faults``; the entry
point's name is the fault's ``type`` in YAML. Its parameters are a pydantic model (``Params``)
whose field docstrings/descriptions are what ``faultlab list faults`` prints, and the
experiment loader validates a fault's ``params:`` against it.

The engine calls ``inject`` once when the trigger fires, then ``undo`` exactly once when the
fault's duration ends, when the job reacts (``until: reaction``), or when the experiment ends
for any reason — including an exception or Ctrl-C. ``undo`` must be idempotent and must not
raise for a process that is already gone.

A fault that needs something in place before the job starts (a fake metadata endpoint each
node must find in its environment) overrides ``prepare``: the engine then builds that fault
once, calls ``prepare`` before the launch, uses the same instance for every firing, and calls
``release`` when the experiment ends, whatever ended it.
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from faultlab.errors import FaultError
from faultlab.fault_api.context import FaultContext

__all__ = ["CAPABILITIES", "Fault", "FaultContext", "FaultParams", "Victim"]


class FaultParams(BaseModel):
    """Base of every fault's parameters: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True, slots=True)
class Victim:
    """What a target selector resolved to: one rank, one node, or every rank (``all``)."""

    kind: str  # "rank" | "node" | "all"
    value: int | None = None

    def __str__(self) -> str:
        return "all" if self.kind == "all" else f"{self.kind} {self.value}"

    def node(self, ctx: FaultContext) -> str:
        """The name of node ``value`` of the job (``node0`` ...); FaultError if it has fewer."""
        nodes = ctx.node_names()
        index = int(self.value or 0)
        if index >= len(nodes):
            raise FaultError(f"node {index}: the job has {len(nodes)} node(s) now "
                             f"({', '.join(nodes) or 'none'})")
        return nodes[index]


class Fault(ABC):
    """One injectable fault. Subclasses set ``type``, ``family``, ``Params`` and ``inject``."""

    type: ClassVar[str]
    """Name in YAML, snake_case, e.g. ``rank_kill`` (must equal the entry point's name)."""
    family: ClassVar[str]
    """process | numeric | collective | network | storage | cloud | ..."""
    Params: ClassVar[builtins.type[FaultParams]] = FaultParams
    """Its parameters' model (``builtins.type``: ``type`` is the class variable above)."""
    targets: ClassVar[tuple[str, ...]] = ("rank", "node", "all")
    """Selector kinds this fault accepts."""
    needs: ClassVar[tuple[str, ...]] = ()
    """The context capabilities it needs of the target beyond the core ``FaultContext``
    (``faultlab.fault_api.context.CONTEXT_CAPABILITIES``: ``node_network``,
    ``slurm_controller`` ...). The experiment loader refuses it on a ``topology.launcher``
    whose target does not offer every one (``offers``), and names the launchers that do;
    empty: every target can host it."""
    reversible: ClassVar[bool] = False
    """True if ``undo`` reverts the fault (a hang is continued); kills are not reversible."""
    step_gated: ClassVar[bool] = True
    """Triggered ``at_step: N`` from outside the ranks, it is injected while every rank waits
    at the step gate after step N (``faultlab.runtime.gates``), so it lands after step N and
    before step N + 1 on every target. False for a fault that itself waits for the job to go
    on (a torn write waits for the next save): holding the job at the gate would deadlock it."""
    rank_action: ClassVar[str | None] = None
    """Import path (``"package.module:Class"``) of what the fault does inside a rank: a
    ``faultlab.runtime.hooks.RankAction`` subclass, imported by the rank only when a plan or a
    live inject names it (a string, so faultlab never imports rank code). None: it acts from
    outside the ranks."""

    # What the engine and the observers do for this fault, declared here and nowhere else
    # (they never recognise a fault by its type name). Every capability is off by default; a
    # fault turns on the ones that describe it, a team's fault exactly as a built-in.
    # ``capabilities()`` lists the ones a class turns on; the engine copies that list into
    # each ``FaultRecord`` (and so the journal), which is where the observers read it.
    slows_job: ClassVar[bool] = False
    """It makes a rank a straggler without stopping it (a delayed collective, a throttled
    link, a slowed GPU): the timeline measures ``straggler_detected_s`` (the job named the
    victim a straggler) and ``slowdown`` (step time during ÷ before) for it."""
    corrupts_silently: ClassVar[bool] = False
    """It makes a rank compute wrong but finite numbers and raises no error (silent data
    corruption): only a monitor notices. The detection SLAs (``detected_within_steps``,
    ``detection_attributed`` ...) may ask for its detection, with ``slows_job`` faults; every
    strike is a ground-truth record (``fault_struck``)."""
    fails_saves: ClassVar[bool] = False
    """It can make a checkpoint save fail or hang while the job writes: the save-failure
    observers (``save_failure_detected``, ``training_continued_through_save_failure``,
    ``failed_save_never_loaded``) judge what the job did about it. It *struck* when its
    undo's details count ``num_ops_hit > 0`` (or no count was recorded)."""
    hangs_saves: ClassVar[bool] = False
    """A save it strikes hangs rather than fails (with ``fails_saves``):
    ``save_hang_detected_within_s`` is measured over these faults."""
    mounts_storage: ClassVar[bool] = False
    """The run serves the job's checkpoint directory through faultlab's storage passthrough
    (``faultlab.storage``) from before the launch to after the job stopped, for the fault to
    act on the job's file operations; the verdict fails ``fault_injected`` when its undo
    counts no operation hit."""
    needs_exact_mount: ClassVar[bool] = False
    """With ``mounts_storage``: every lookup must reach the passthrough (the kernel's cache
    is off), for a fault that gives a node a view of its own of the directory."""
    loses_node: ClassVar[bool] = False
    """It takes the node it strikes away from the job (killed, paused, cut off, reclaimed):
    the launch findings count that node among the lost (the selector's node, else
    ``details["node"]``) when they explain a rendezvous that did not survive it."""
    kills_service: ClassVar[bool] = False
    """It kills a service of the target (``target.services``), named by
    ``details["service"]``: the launch findings look in the logs for ranks that failed to
    reach it afterwards (``service_lost``)."""

    fault_id: str = ""
    """This firing's id in the run (``kill``, ``kill#2``): the engine sets it before every
    ``inject``, so what the fault starts inside a rank can echo it (the ``fault_id`` of the
    rank's ``fault_injected`` event) and the engine match that event to the firing."""

    def __init__(self, params: FaultParams) -> None:
        self.params = params

    @classmethod
    def reversible_with(cls, params: FaultParams) -> bool:
        """Is a fault with these parameters undone (``reversible``, unless a parameter
        changes that)?"""
        return cls.reversible

    @classmethod
    def refuses(cls, topology: Any) -> str | None:
        """Why this fault cannot run on ``topology`` although its launcher offers what it
        ``needs`` (checked when the experiment loads, shown as that fault's error); None: it
        can."""
        return None

    @classmethod
    def refuses_target(cls, target: Any) -> str | None:
        """Why this fault cannot strike ``target`` (the experiment's ``TargetSpec``: a trainer
        or a command), checked when the experiment loads; None: it can."""
        return None

    @classmethod
    def refuses_params(cls, params: FaultParams, target: Any) -> tuple[str, str] | None:
        """``(param, why)`` when these ``params`` name something ``target`` (the experiment's
        ``TargetSpec``) does not have, checked when the experiment loads; None: they fit."""
        return None

    @classmethod
    def refuses_live(cls, params: FaultParams) -> tuple[str, str] | None:
        """``(param, why)`` when a fault with these ``params`` must be in the launch plan (an
        ``at_step`` trigger on ``{rank: N}`` or ``all``) and cannot be sent live to the running
        processes; checked when the experiment loads. None: live is fine."""
        return None

    @classmethod
    def summary(cls) -> str:
        return (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""

    @abstractmethod
    def inject(self, ctx: FaultContext, victim: Victim) -> dict[str, Any]:
        """Inject the fault; return what was done (pids, signal...) for the journal.

        A fault that waits for its moment (a torn write waits for a save to start) reports
        when it actually struck as ``details["at_t"]`` (``time.time()``); the engine records
        that as the injection time."""

    def undo(self, ctx: FaultContext) -> dict[str, Any]:
        """Revert the fault (idempotent); return what was done. Default: nothing to undo."""
        return {}

    def prepare(self, nodes: list[str]) -> dict[str, dict[str, str]]:
        """Before the job starts: set up what it must find at launch; return extra environment
        variables by node name. Default: nothing (and the engine builds a fresh instance per
        firing)."""
        return {}

    def release(self) -> dict[str, Any]:
        """When the experiment ends (after every undo): stop what ``prepare`` started and any
        timer ``inject`` left running. Idempotent; returns what was done, for the journal."""
        return {}

    @classmethod
    def needs_prepare(cls) -> bool:
        return cls.prepare is not Fault.prepare

    @classmethod
    def capabilities(cls) -> tuple[str, ...]:
        """The capabilities this class turns on (``CAPABILITIES`` it sets true), in that
        order: what the engine copies into each ``FaultRecord`` of it."""
        return tuple(name for name in CAPABILITIES if getattr(cls, name))


CAPABILITIES = ("slows_job", "corrupts_silently", "fails_saves", "hangs_saves", "mounts_storage",
                "needs_exact_mount", "loses_node", "kills_service")
"""Every capability a fault may declare (the ``Fault`` attributes of that name)."""
