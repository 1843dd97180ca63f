"""Each node's exit code of a Slurm job, from what ``srun`` said of its tasks.

Slurm's own record of a job holds one exit code (``scontrol``'s ``ExitCode``: the batch
script's), and ``sacct``'s steps need slurmdbd, which a cluster may not run (the local test
cluster has ``AccountingStorageType=accounting_storage/none``), and give one code per step, not
per node. ``srun`` itself reports every task that did not exit 0, on its stderr, which the
batch output (``logs/slurm-<job>.out``) holds::

    srun: error: node2: task 1: Exited with exit code 3
    srun: error: node[2-3]: tasks 1-2: Killed

A node that ran one task per node (faultlab's batch script: the node's torchrun agent; a team's
script that starts torchrun with one ``srun`` task per node) exited with that code, and a node
it does not name exited 0 once ``srun`` has returned. Only the job's last incarnation counts (a
requeued job's earlier one was killed by the requeue): faultlab's batch script marks where each
incarnation starts (``faultlab: job J restart R on NODES``) and that ``srun`` returned
(``faultlab: srun exited RC``); a team's script marks nothing, so its nodes are told apart
only for a job that ran once and ended by itself.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable

__all__ = ["node_exits"]

_TASK = re.compile(r"^srun: error: (?P<hosts>\S+): tasks? (?P<tasks>[\d,\-]+): (?P<what>.+)$")
_EXITED = re.compile(r"Exited with exit code (\d+)")
_START = re.compile(r"^faultlab: job \d+ restart \d+ on (?P<nodes>\S+)")
_SIGNALS = {signal.strsignal(s) or "": -int(s) for s in signal.Signals}


def node_exits(output: str, *, nodes: list[str], own_script: bool, ended_alone: bool,
               expand: Callable[[str], list[str]]) -> dict[str, int | None] | None:
    """Node → exit code of the job's last incarnation (None: not known yet, e.g. still
    running) from the batch output ``output``; None where the nodes cannot be told apart
    (module docstring). ``nodes``: the job's nodes as the controller lists them;
    ``own_script``: faultlab's batch script (its marks); ``ended_alone``: the job ended by
    itself, ran once (a team's script); ``expand``: a host list to names."""
    lines = output.splitlines()
    returned = ended_alone
    if own_script:
        starts = [i for i, line in enumerate(lines) if _START.match(line)]
        if not starts:
            return None
        lines = lines[starts[-1]:]
        nodes = expand(_START.match(lines[0])["nodes"])  # type: ignore[index]
        returned = any(line.startswith("faultlab: srun exited") for line in lines)
    elif not ended_alone:
        return None
    if not nodes:
        return None
    codes: dict[str, int | None] = {n: 0 if returned else None for n in nodes}
    for line in lines:
        m = _TASK.match(line.strip())
        code = _code(m["what"]) if m else None
        if m is None or code is None:
            continue
        for node in expand(m["hosts"]) if "[" in m["hosts"] else [m["hosts"]]:
            if node in codes and not codes[node]:
                codes[node] = code
    return codes


def _code(what: str) -> int | None:
    """``Exited with exit code 3`` → 3; ``Killed`` (a signal's name) → -9; None: another
    message."""
    m = _EXITED.match(what)
    if m:
        return int(m.group(1))
    return _SIGNALS.get(what.removesuffix(" (core dumped)").strip())
