"""A node's NFS view in the passthrough, without a mount (``faultlab.storage.views``): which
caller it answers for (by ``FAULTLAB_NODE``, not by pid), that it starts warm, and that a file
opened through it stays with it after the view ends, its writes written back at close."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from faultlab.storage.views import NodeViews, node_of

SLOW = {"acregmin": 60, "acregmax": 60, "acdirmin": 60, "acdirmax": 60}


def _node1_process() -> subprocess.Popen[str]:
    """A process of node1 (its environment says so), not yet known to be running."""
    env = {**os.environ, "FAULTLAB_NODE": "node1"}
    return subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
        env=env, stdout=subprocess.PIPE, text=True)


@pytest.fixture
def node1_pid() -> Iterator[int]:
    """A running process of node1, as FUSE would name the caller. It has printed a line, so it
    runs its own code: right after Popen returns, the child may still be inside execve, and its
    /proc environ reads empty (stop 44's CI failed on exactly that)."""
    proc = _node1_process()
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    yield proc.pid
    proc.kill()
    proc.wait()


def test_a_process_asked_about_while_it_starts_is_asked_again_once_it_runs(
        tmp_path: Path) -> None:
    views = NodeViews(os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY))
    views.set("v", "node1", SLOW)
    proc = _node1_process()
    try:
        views.for_caller(proc.pid, "getattr")  # may land inside execve: environ reads empty
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"
        assert views.for_caller(proc.pid, "getattr") is not None
    finally:
        proc.kill()
        proc.wait()


def test_the_view_answers_for_its_node_only_and_from_the_moment_it_started(
        tmp_path: Path, node1_pid: int) -> None:
    (tmp_path / "step_8").mkdir()
    views = NodeViews(os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY))
    assert views.set("v", "node1", SLOW)["warmed_names"] == 1
    (tmp_path / "step_12").mkdir()
    assert node_of(node1_pid) == "node1"
    client = views.for_caller(node1_pid, "readdir")
    assert client is not None
    assert [n for n, _, _ in client.readdir("/", 0)] == [".", "..", "step_8"]
    assert views.for_caller(os.getpid(), "readdir") is None  # faultlab: no node, no view
    with pytest.raises(ValueError, match="already has a view"):
        views.set("w", "node1", SLOW)
    assert views.remove("v")["ops"] == {"readdir": 1}
    assert views.for_caller(node1_pid, "readdir") is None


def test_a_file_opened_through_the_view_stays_with_it_until_closed(
        tmp_path: Path, node1_pid: int) -> None:
    views = NodeViews(os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY))
    views.set("v", "node1", SLOW)
    client = views.for_caller(node1_pid, "create")
    assert client is not None
    fh = client.create("/shard", 0o644, os.O_WRONLY)
    client.write("/shard", b"abc", 0, fh)
    assert (tmp_path / "shard").read_bytes() == b""  # held in node1's client
    views.remove("v")  # the view ends: what it buffered is written back
    assert (tmp_path / "shard").read_bytes() == b"abc"
    assert views.for_handle(fh, "write") is client  # the open file stays with it
    client.write("/shard", b"def", 3, fh)
    client.release("/shard", fh)
    views.released()
    assert (tmp_path / "shard").read_bytes() == b"abcdef"
    assert not views  # nothing retired is kept once its files are closed


def test_a_pid_that_is_another_process_now_is_asked_again(tmp_path: Path) -> None:
    """A pid is reused once the kernel's pids wrap. The stand-in here is a process that execs
    itself with another node's environment: the same pid, another process."""
    views = NodeViews(os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY))
    views.set("v", "node1", SLOW)
    script = ("import os, sys; print('up', flush=True); sys.stdin.readline(); "
              "os.execve(sys.executable, [sys.executable, '-c', "
              "\"import time; print('up', flush=True); time.sleep(60)\"], "
              "{**os.environ, 'FAULTLAB_NODE': 'node0'})")
    proc = subprocess.Popen([sys.executable, "-c", script], text=True,
                            env={**os.environ, "FAULTLAB_NODE": "node1"},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        assert proc.stdout.readline() == "up\n"
        assert views.for_caller(proc.pid, "getattr") is not None  # node1's
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "up\n"  # node0's process now, the same pid
        time.sleep(1.0)  # views.py's _CACHE_S
        assert views.for_caller(proc.pid, "getattr") is None
    finally:
        proc.kill()
        proc.wait()
