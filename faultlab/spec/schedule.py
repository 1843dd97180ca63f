"""What an experiment will do, decided from the document and its seed alone.

The engine and ``faultlab run --dry-run`` both call these, so a dry run shows exactly the
ranks, nodes and times a real run will use: ``random`` targets are drawn from
``random.Random(f"{seed}/{index}")`` (later firings of an ``every`` fault from
``f"{seed}/{index}/{occurrence}"``), MTBF arrivals from ``f"{seed}/{index}/every"``.
"""

from __future__ import annotations

import random

from faultlab.spec.faults import FaultSpec, Trigger
from faultlab.spec.model import Experiment

__all__ = ["arrival_times_s", "describe_schedule", "resolve_selector"]

MAX_ARRIVALS = 10_000
"""Most firings ``arrival_times_s`` returns (a tiny MTBF must not make an endless list)."""


def resolve_selector(exp: Experiment, index: int, *, occurrence: int = 0) -> tuple[str,
                                                                                   int | None]:
    """The concrete victim of ``exp.faults[index]``: ``("rank", 3)``, ``("node", 0)`` or
    ``("all", None)``. ``random`` resolves to the fault's first target kind (rank or node),
    drawn from the seed; ``occurrence`` numbers the firings of a repeating fault."""
    fault = exp.faults[index]
    target = fault.target
    if target.kind != "random":
        return target.kind, target.value
    kind = next(k for k in fault.fault_class.targets if k in ("rank", "node"))
    stream = f"{exp.seed}/{index}" if occurrence == 0 else f"{exp.seed}/{index}/{occurrence}"
    count = exp.topology.world_size if kind == "rank" else exp.topology.nodes
    return kind, random.Random(stream).randrange(count)


def arrival_times_s(exp: Experiment, index: int, *, limit: int = MAX_ARRIVALS) -> list[float]:
    """Seconds after the start at which an ``every`` fault fires (empty for other triggers):
    exponential gaps with mean ``mtbf_s`` after ``start_after_s``, before ``run.timeout_s``,
    at most ``max_count`` (and ``limit``) of them."""
    every = exp.faults[index].trigger.every
    if every is None:
        return []
    rng = random.Random(f"{exp.seed}/{index}/every")
    cap = min(limit, every.max_count or limit)
    out: list[float] = []
    t = every.start_after_s
    while len(out) < cap:
        t += rng.expovariate(1.0 / every.mtbf_s)
        if t >= exp.run.timeout_s:
            break
        out.append(t)
    return out


def describe_schedule(exp: Experiment) -> list[str]:
    """One line per fault: what is injected, where, when, and how it is undone."""
    return [_describe(exp, i, fault) for i, fault in enumerate(exp.faults)]


def _describe(exp: Experiment, index: int, fault: FaultSpec) -> str:
    params = fault.params.model_dump()
    what = fault.type + (f" ({', '.join(f'{k}={v}' for k, v in params.items())})"
                         if params else "")
    return f"{fault.id}: {what} on {_where(exp, index, fault)} {_when(exp, index)}; " \
           f"{_undo(fault)}"


def _where(exp: Experiment, index: int, fault: FaultSpec) -> str:
    if fault.target.kind != "random":
        return str(fault.target)
    kind, value = resolve_selector(exp, index)
    drawn = f"drawn from seed {exp.seed}"
    if fault.trigger.every is None:
        return f"{kind} {value} (random, {drawn})"
    firings = len(arrival_times_s(exp, index, limit=5))
    picks = [resolve_selector(exp, index, occurrence=n)[1] for n in range(max(1, firings))]
    return f"a random {kind} each time ({kind}s {', '.join(map(str, picks))} first, {drawn})"


def _when(exp: Experiment, index: int) -> str:
    trigger: Trigger = exp.faults[index].trigger
    if trigger.at_step is not None:
        return f"when step {trigger.at_step} is done"
    if trigger.at_time_s is not None:
        return f"{trigger.at_time_s:g} s after the job starts"
    if trigger.after_event is not None:
        ev = trigger.after_event
        match = "".join(f" with {k}={v!r}" for k, v in ev.match.items())
        return f"after the {_ordinal(ev.count)} {ev.kind} event{match}"
    every = trigger.every
    assert every is not None  # a Trigger holds exactly one kind
    times = arrival_times_s(exp, index, limit=6)
    shown = ", ".join(f"{t:.1f} s" for t in times[:5]) + (", ..." if len(times) > 5 else "")
    most = f", at most {every.max_count} times" if every.max_count else ""
    start = f" after {every.start_after_s:g} s" if every.start_after_s else ""
    return (f"at seeded random times (MTBF {every.mtbf_s:g} s{start}{most}): "
            f"{shown or f'none before the timeout ({exp.run.timeout_s:g} s)'}")


def _undo(fault: FaultSpec) -> str:
    if not fault.fault_class.reversible_with(fault.params):
        return "permanent (this fault cannot be undone)"
    ways = []
    if fault.duration_s is not None:
        ways.append(f"after {fault.duration_s:g} s")
    if fault.until == "reaction":
        ways.append("when the job reacts")
    first = ", whichever comes first" if len(ways) > 1 else ""
    return f"undone {' or '.join(ways)}{first} (and always when the experiment ends)"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
