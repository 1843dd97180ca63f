"""The passthrough's rules without FUSE: which operations a rule hits, and what it does."""

from __future__ import annotations

import errno
import threading
import time

import pytest

from faultlab.storage.rules import Rule, RuleSet


def test_error_hits_only_its_ops_and_path_and_counts_them() -> None:
    rules = RuleSet()
    rules.set(Rule(id="e", errno="EIO", ops=("write", "fsync"), path="step_*/*.distcp"))
    assert rules.gate("write", "step_1/__0_0.distcp", 10) == errno.EIO
    assert rules.gate("fsync", "step_1/__0_0.distcp") == errno.EIO
    assert rules.gate("read", "step_1/__0_0.distcp", 10) == 0
    assert rules.gate("write", "step_1/.metadata", 10) == 0
    assert rules.remove("e")["counts"] == {"write": 1, "fsync": 1}
    assert rules.gate("write", "step_1/__0_0.distcp", 10) == 0


def test_after_bytes_arms_the_rule_once_that_much_was_written() -> None:
    rules = RuleSet()
    rules.set(Rule(id="e", errno="ENOSPC", after_bytes=100))
    assert [rules.gate("write", "f", 60) for _ in range(3)] == [0, 0, errno.ENOSPC]


def test_percent_is_seeded() -> None:
    def draws(seed: int) -> list[int]:
        rules = RuleSet()
        rules.set(Rule(id="e", errno="EIO", percent=30, seed=seed))
        return [rules.gate("write", "f", 1) for _ in range(200)]

    first = draws(7)
    assert first == draws(7) and first != draws(8)
    assert 30 < first.count(errno.EIO) < 90  # about 60 of 200


def test_disk_full_lets_free_bytes_through_then_fails_writes() -> None:
    rules = RuleSet()
    rules.set(Rule(id="full", free_bytes=1000, ops=()))
    assert rules.gate("write", "a", 600) == 0
    assert rules.gate("write", "b", 600) == errno.ENOSPC  # would go past the free space
    assert rules.gate("write", "b", 400) == 0
    assert rules.gate("write", "c", 1) == errno.ENOSPC
    assert rules.gate("create", "d") == 0  # a full volume still creates (empty) files
    assert rules.remove("full") == {"id": "full", "counts": {"write": 2}, "bytes_seen": 1000}


def test_hang_holds_the_operation_until_the_rule_is_removed() -> None:
    rules = RuleSet()
    rules.set(Rule(id="h", hang=True, ops=("fsync",)))
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(rules.gate("fsync", "f")))
    t.start()
    deadline = time.monotonic() + 10  # the thread reaches the gate
    while rules.counts() != [{"id": "h", "counts": {"fsync": 1}, "bytes_seen": 0}]:
        assert time.monotonic() < deadline, rules.counts()
        time.sleep(0.01)
    t.join(0.3)
    assert t.is_alive() and not result
    rules.clear()
    t.join(5)
    assert result == [0]


def test_removing_a_latency_rule_cuts_its_delay_short() -> None:
    rules = RuleSet()
    rules.set(Rule(id="slow", delay_ms=60_000, ops=("write",)))
    t = threading.Thread(target=rules.gate, args=("write", "f", 1))
    t.start()
    t.join(0.2)
    assert t.is_alive()
    rules.remove("slow")
    t.join(5)  # the delay was a minute
    assert not t.is_alive()


@pytest.mark.parametrize(("field", "value", "message"), [
    ("ops", ("write", "chmod"), "valid: write, fsync, create, rename, open, read, mkdir, unlink"),
    ("errno", "ENOENT", "valid: ENOSPC, EIO, EROFS, EDQUOT, ESTALE, EACCES"),
    ("percent", 101, "within 0-100"),
])
def test_bad_rules_are_refused(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Rule(id="x", **{field: value})  # type: ignore[arg-type]


def test_a_node_view_hits_only_the_processes_under_that_node() -> None:
    import os
    import subprocess
    import sys

    rules = RuleSet()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        rules.set(Rule(id="n", errno="EIO", pids=(os.getpid(),)))  # "node": this process tree
        assert rules.needs_caller()
        assert rules.gate("write", "f", 1, caller=child.pid) == errno.EIO  # a descendant
        assert rules.gate("write", "f", 1, caller=os.getppid()) == 0  # not under it
        assert rules.gate("write", "f", 1, caller=None) == 0
    finally:
        child.kill()
        child.wait()
