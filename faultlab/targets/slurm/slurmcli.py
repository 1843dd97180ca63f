"""Slurm through its own commands (22.05 and later): submit, follow, cancel, update, requeue.

There is no Python binding for 22.05 (pyslurm has no release for it), and a login node always
has the commands. ``scontrol`` has no ``--json`` in 22.05, so a job is read from its one-line
form (``scontrol -o show job``); ``sacct`` needs slurmdbd, which a cluster may not run. Every
call has a timeout, and a failure raises ``SlurmError`` with the command and Slurm's message.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Mapping

from faultlab.errors import SlurmError

__all__ = ["TERMINAL", "SlurmError", "exit_code", "hostnames", "run", "show_job"]

TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                      "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"})
"""Job states after which a job runs no more (unless it is requeued)."""

_FIELD = re.compile(r"(?:^| )([A-Za-z][\w:/]*)=")



def run(args: list[str], *, timeout_s: float = 30.0, env: Mapping[str, str] | None = None,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a Slurm command; ``SlurmError`` if it cannot be run, times out or (``check``)
    fails."""
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s,
                              env=dict(env) if env is not None else None,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SlurmError(f"{args[0]}: not found; faultlab's slurm target runs where the Slurm "
                         f"commands are (a login node)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{shlex.join(args)}: no answer within {timeout_s:g} s") from None
    if check and proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip().splitlines()
        raise SlurmError(f"{shlex.join(args)}: exit {proc.returncode}: "
                         f"{said[-1] if said else 'no message'}")
    return proc


def parse_record(line: str) -> dict[str, str]:
    """``Key=Value Key2=Value two ...`` (``scontrol -o``) as a dict; a value may hold spaces."""
    marks = list(_FIELD.finditer(line))
    out = {}
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(line)
        out[m.group(1)] = line[m.end():end].strip()
    return out


def show_job(job_id: int) -> dict[str, str] | None:
    """The job as the controller sees it now, or None once it has left the controller's
    memory (``MinJobAge`` after it ended)."""
    proc = run(["scontrol", "-o", "show", "job", str(job_id)], check=False)
    if proc.returncode != 0:
        if "Invalid job id" in proc.stderr:
            return None
        raise SlurmError(f"scontrol show job {job_id}: {proc.stderr.strip()}")
    line = proc.stdout.strip().splitlines()
    return parse_record(line[0]) if line else None


def hostnames(nodelist: str) -> list[str]:
    """``node[1-3]`` → ``["node1", "node2", "node3"]`` (empty for ``(null)`` or ``""``)."""
    if not nodelist or nodelist in ("(null)", "None"):
        return []
    return run(["scontrol", "show", "hostnames", nodelist]).stdout.split()


def exit_code(value: str) -> int | None:
    """``ExitCode=2:0`` → 2; ``0:9`` (killed by signal 9) → -9; None if unknown."""
    code, _, sig = value.partition(":")
    if not code.isdigit():
        return None
    return -int(sig) if sig.isdigit() and int(sig) else int(code)
