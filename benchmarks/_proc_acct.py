"""A census of the processes a measured run ended, through Linux process accounting (``acct(2)``,
the kernel's own per-process record written at exit: user and system CPU, pid, parent pid and
command name): how many processes of each kind the suite started and what each kind cost.

The control groups of ``bench_suite.py`` say which *test* spent the CPU; this says which *kind
of process* did: a trainer's rank, a torchrun agent, something else. Every process that imports
torch costs 1.1-2.2 CPU-s before it does any work (docs/development.md, "Where the floor is"),
so the number of such processes is the suite's floor.

Accounting is the machine's, not the run's: every process that ends while it is on is
recorded, in every PID namespace (so the ranks inside Docker and Slurm nodes are too). Measure
on an otherwise idle machine; ``bench_suite.py`` turns it off before it stops its busy loops, so
those are never recorded. Needs root (``CAP_SYS_PACCT``). A machine whose own accounting was on
(Debian's ``acct`` service) has it off afterwards: ``accton on`` turns it back on.
"""

from __future__ import annotations

import collections
import ctypes
import os
import struct
from dataclasses import dataclass
from pathlib import Path

RECORD = struct.Struct("<BBHIIIIIIf8H16s")
"""``struct acct_v3`` (linux/acct.h): flag, version, tty, exitcode, uid, gid, pid, ppid, btime,
etime, then utime, stime, mem, io, rw, minflt, majflt, swaps as ``comp_t``, then the command."""
VERSION = 3
AHZ = 100
"""Ticks per second of ``ac_utime`` and ``ac_stime`` in a v3 record."""
AGENTS = frozenset({"pt_elastic", "torchrun", "ft_launcher"})
"""Command names of launcher agents: torchrun's agent names its process ``pt_elastic``."""
HEAVY_S = 1.0
"""A process that spent this much CPU is counted by itself: ``import torch`` alone is 1.1-1.4."""


@dataclass(frozen=True)
class Record:
    comm: str
    pid: int
    ppid: int
    cpu_s: float


def comp_t(value: int) -> int:
    """A ``comp_t``: a 13-bit mantissa and a 3-bit base-8 exponent."""
    return (value & 0x1FFF) << (3 * (value >> 13))


def parse(data: bytes) -> list[Record]:
    if len(data) % RECORD.size:
        raise ValueError(f"{len(data)} bytes is not a whole number of {RECORD.size}-byte "
                         f"acct_v3 records")
    records = []
    for fields in RECORD.iter_unpack(data):
        if fields[1] & 0x7F != VERSION:  # the high bit says big-endian comp_t
            raise ValueError(f"an accounting record of version {fields[1] & 0x7F}, not "
                             f"{VERSION}: the kernel writes v3 on Linux")
        pid, ppid, utime, stime, comm = fields[6], fields[7], fields[10], fields[11], fields[18]
        records.append(Record(comm.split(b"\0", 1)[0].decode(errors="replace"), pid, ppid,
                              (comp_t(utime) + comp_t(stime)) / AHZ))
    return records


def _acct(path: Path | None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.acct(None if path is None else os.fsencode(path)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"acct({path}): {os.strerror(err)} (process accounting needs root)")


def start(path: Path) -> None:
    """Turn the machine's process accounting on, into ``path`` (made empty)."""
    path.write_bytes(b"")
    _acct(path)


def stop() -> None:
    _acct(None)


def census(records: list[Record]) -> list[tuple[str, int, float]]:
    """``(kind, processes, CPU-s)`` rows: launcher agents, ranks (an agent's children), other
    processes of at least ``HEAVY_S`` by command name, and the small ones together."""
    agents = {r.pid for r in records if r.comm in AGENTS}
    kinds: dict[str, list[float]] = collections.defaultdict(list)
    for r in records:
        if r.comm in AGENTS:
            kind = f"launcher agent ({r.comm})"
        elif r.ppid in agents:
            kind = "rank (an agent's child)"
        elif r.cpu_s >= HEAVY_S:
            kind = f"other, {HEAVY_S:g} CPU-s or more ({r.comm})"
        else:
            kind = f"under {HEAVY_S:g} CPU-s (every command)"
        kinds[kind].append(r.cpu_s)
    return sorted(((k, len(v), sum(v)) for k, v in kinds.items()), key=lambda row: -row[2])
