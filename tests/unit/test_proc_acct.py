"""The process census of ``benchmarks/bench_suite.py --processes`` reads the kernel's acct_v3
records. These records are packed by hand from linux/acct.h's layout: turning accounting on is
machine-wide, so a test that did it would race a measured run of this very suite (the bench
itself is where the real path runs, and prints its numbers)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import _proc_acct as acct  # noqa: E402


def encode(ticks: int) -> int:
    """A ``comp_t``: shifted right 3 bits at a time while over 13 bits (the kernel also rounds
    the last bit shifted out; truncating is enough to read it back here)."""
    exp = 0
    while ticks > 0x1FFF:
        ticks >>= 3
        exp += 1
    return (exp << 13) | ticks


def record(comm: str, pid: int, ppid: int, utime: int, stime: int, version: int = 3) -> bytes:
    return acct.RECORD.pack(0, version, 0, 0, 0, 0, pid, ppid, 0, 0.0,
                            encode(utime), encode(stime), 0, 0, 0, 0, 0, 0, comm.encode())


def test_a_record_is_64_bytes_and_comp_t_decodes_both_forms() -> None:
    assert acct.RECORD.size == 64  # sizeof(struct acct_v3)
    assert acct.comp_t(encode(150)) == 150  # 1.5 s, a plain mantissa
    # 100,000 ticks (1,000 s) needs an exponent: 100000 >> 6 = 1562, and 1562 << 6 = 99968
    assert encode(100_000) == (2 << 13) | 1562 and acct.comp_t(encode(100_000)) == 99_968


def test_the_census_sorts_agents_their_children_and_the_rest() -> None:
    data = b"".join([
        record("pt_elastic", 10, 1, 130, 20),     # an agent: 1.5 CPU-s
        record("python", 11, 10, 280, 40),        # its rank: 3.2
        record("python", 12, 10, 300, 0),         # its other rank: 3.0
        record("ft_launcher", 20, 1, 120, 10),    # NVRx's agent
        record("python", 21, 20, 200, 0),         # its rank
        record("python", 30, 1, 170, 10),         # torch, not under an agent: 1.8
        record("scontrol", 31, 1, 0, 1),          # the small ones, together
        record("bash", 32, 1, 2, 0),
    ])
    rows = {kind: (n, round(cpu, 2)) for kind, n, cpu in acct.census(acct.parse(data))}
    assert rows == {
        "rank (an agent's child)": (3, 8.2),
        "launcher agent (pt_elastic)": (1, 1.5),
        "launcher agent (ft_launcher)": (1, 1.3),
        "other, 1 CPU-s or more (python)": (1, 1.8),
        "under 1 CPU-s (every command)": (2, 0.03),
    }
    assert [k for k, _, _ in acct.census(acct.parse(data))][0] == "rank (an agent's child)"


def test_a_file_that_is_not_v3_records_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="not a whole number of 64-byte"):
        acct.parse(record("python", 1, 0, 1, 1)[:-3])
    with pytest.raises(ValueError, match="version 2, not 3"):
        acct.parse(record("python", 1, 0, 1, 1, version=2))
