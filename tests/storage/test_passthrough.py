"""The FUSE passthrough for real: a mount over a directory, rules set from this process, the
errors seen by ``os.write`` and by ``torch.save``'s C++ writer, and the undo (hung operations
released, mount gone, every byte in the directory). Needs /dev/fuse and root (``make test``
installs fuse3)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from faultlab.storage import StorageMount, fuse_unavailable, is_mounted


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[StorageMount]:
    why = fuse_unavailable()
    if why:
        pytest.fail(f"the storage passthrough cannot mount here: {why}")
    m = StorageMount.start(tmp_path / "ckpt", tmp_path / "state")
    yield m
    m.stop()
    assert not is_mounted(m.path)


def test_errors_reach_os_write_and_torch_save(mount: StorageMount) -> None:
    import torch

    d = mount.path
    mount.set_rule({"id": "io", "errno": "EIO", "ops": ["write"], "path": "*.pt"})
    with pytest.raises(OSError) as e:
        (d / "a.pt").write_bytes(b"x" * 100)
    assert e.value.errno == errno.EIO
    with pytest.raises(RuntimeError, match="(?i)error|fail"):  # the C++ writer, not Python's
        torch.save({"w": torch.zeros(1000)}, d / "b.pt")
    (d / "ok.txt").write_text("untouched")  # another path goes through
    counts = mount.remove_rule("io")["counts"]
    assert counts["write"] >= 2
    torch.save({"w": torch.ones(3)}, d / "b.pt")
    assert torch.load(d / "b.pt")["w"].sum() == 3


def test_touch_through_the_mount_sets_the_times_it_asks_for(mount: StorageMount) -> None:
    """utimensat's "now" and "omit" arrive through libfuse as special nanosecond values (and
    no times at all as None): each means what it means on a plain disk."""
    f = mount.path / "t.txt"
    f.write_text("x")
    os.utime(f, ns=(1_000_000_000, 2_000_000_000))
    assert (f.stat().st_atime_ns, f.stat().st_mtime_ns) == (1_000_000_000, 2_000_000_000)
    os.utime(f)  # touch: now, for both
    assert f.stat().st_mtime_ns > 2_000_000_000 and f.stat().st_atime_ns > 1_000_000_000
    mtime = f.stat().st_mtime_ns
    os.utime(f, ns=(5_000_000_000, mtime))
    assert f.stat().st_atime_ns == 5_000_000_000 and f.stat().st_mtime_ns == mtime


def test_disk_full_then_stop_keeps_every_byte_in_the_directory(mount: StorageMount) -> None:
    d = mount.path
    mount.set_rule({"id": "full", "free_bytes": 8192, "ops": []})
    fd = os.open(d / "f.bin", os.O_WRONLY | os.O_CREAT)
    os.write(fd, b"a" * 8192)
    with pytest.raises(OSError) as e:
        os.write(fd, b"b" * 4096)
    os.close(fd)
    assert e.value.errno == errno.ENOSPC
    (d / "sub").mkdir()
    mount.stop()
    assert not is_mounted(d)
    assert (d / "f.bin").read_bytes() == b"a" * 8192 and (d / "sub").is_dir()


def test_a_hung_fsync_is_released_by_stop(mount: StorageMount) -> None:
    d = mount.path
    mount.set_rule({"id": "hang", "hang": True, "ops": ["fsync"]})
    done: list[str] = []

    def save() -> None:
        fd = os.open(d / "h.bin", os.O_WRONLY | os.O_CREAT)
        os.write(fd, b"h" * 1000)
        try:
            os.fsync(fd)
            done.append("released")
        except OSError as e:  # the connection was aborted: also released
            done.append(errno.errorcode[e.errno])
        os.close(fd)

    t = threading.Thread(target=save)
    t.start()
    deadline = time.monotonic() + 10  # the fsync reaches the rule (open and write first)
    while mount.counts() != [{"id": "hang", "counts": {"fsync": 1}, "bytes_seen": 0}]:
        assert time.monotonic() < deadline, mount.counts()
        time.sleep(0.02)
    t.join(0.5)
    assert t.is_alive(), "the fsync should hang while the rule is set"
    mount.stop()
    t.join(10)
    assert not t.is_alive() and done
    assert not is_mounted(d) and (d / "h.bin").read_bytes() == b"h" * 1000


def test_a_killed_server_leaves_no_dead_mount_behind(mount: StorageMount) -> None:
    """The server SIGKILLed with an operation hung (Chaos Mesh issue 3424: the mount is left as
    "Transport endpoint is not connected"): stop() aborts the connection, which fails the hung
    operation, and detaches the mount; the directory is readable again with its files."""
    d = mount.path
    (d / "before.txt").write_text("kept")
    mount.set_rule({"id": "hang", "hang": True, "ops": ["read"]})
    failed: list[int] = []

    def read() -> None:
        try:
            (d / "before.txt").read_text()
        except OSError as e:
            failed.append(e.errno or 0)

    t = threading.Thread(target=read)
    t.start()
    t.join(1.0)
    assert t.is_alive()
    os.kill(mount.proc.pid, 9)
    mount.proc.wait(5)
    with pytest.raises(OSError) as e:
        os.listdir(d)
    assert e.value.errno == errno.ENOTCONN  # what a crashed server leaves
    mount.stop()
    t.join(10)
    assert not t.is_alive() and failed == [errno.ENOTCONN]
    assert not is_mounted(d) and (d / "before.txt").read_text() == "kept"


NODE1_SCRIPT = r"""
import json, os, sys
d = sys.argv[1]
out = {"listing": sorted(os.listdir(d)),
       "step_12_metadata": os.path.exists(os.path.join(d, "step_12", ".metadata"))}
if len(sys.argv) > 2:  # write a file, report, then keep it open until told
    fd = os.open(os.path.join(d, sys.argv[2]), os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"node1's shard")
    print(json.dumps(out), flush=True)
    sys.stdin.readline()
    os.close(fd)
    print("closed", flush=True)
    sys.stdin.readline()
else:
    print(json.dumps(out), flush=True)
"""


def _as_node(node: str | None, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "FAULTLAB_NODE"}
    if node is not None:
        env["FAULTLAB_NODE"] = node
    return subprocess.Popen([sys.executable, "-c", NODE1_SCRIPT, *args], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def _seen(node: str | None, d: Path) -> dict[str, object]:
    proc = _as_node(node, str(d))
    out, _ = proc.communicate(timeout=30)
    return json.loads(out)


def test_one_nodes_view_is_its_nfs_cache_and_every_other_process_sees_the_directory(
        tmp_path: Path) -> None:
    """stale_shared_fs's mechanism: node1's processes (found by FAULTLAB_NODE, whatever their
    pid) see the directory as it was when the view started, until its attributes expire;
    everyone else sees it as it is; node1's writes reach the others only at close; ending the
    view gives node1 the directory as it is."""
    why = fuse_unavailable()
    if why:
        pytest.fail(f"the storage passthrough cannot mount here: {why}")
    m = StorageMount.start(tmp_path / "ckpt", tmp_path / "state", kernel_cache=False)
    try:
        d = m.path
        (d / "step_8").mkdir()
        (d / "step_8" / ".metadata").write_text("m")
        warmed = m.set_view("v1", "node1", {"acregmin": 60, "acregmax": 60,
                                            "acdirmin": 60, "acdirmax": 60})
        assert warmed["warmed_names"] == 2  # step_8 and its .metadata
        (d / "step_12").mkdir()  # node0 saves after the view started
        (d / "step_12" / ".metadata").write_text("m")
        assert _seen("node1", d) == {"listing": ["step_8"], "step_12_metadata": True}
        assert _seen("node0", d) == {"listing": ["step_12", "step_8"], "step_12_metadata": True}
        assert _seen(None, d)["listing"] == ["step_12", "step_8"]  # faultlab, a tool

        writer = _as_node("node1", str(d), "shard_1")
        assert json.loads(writer.stdout.readline())["listing"] == ["step_8"]
        assert (d / "shard_1").stat().st_size == 0  # held in node1's client until close
        writer.stdin.write("\n")
        writer.stdin.flush()
        assert writer.stdout.readline().strip() == "closed"
        assert (d / "shard_1").read_bytes() == b"node1's shard"
        writer.stdin.write("\n")
        writer.stdin.flush()
        writer.wait(30)

        ops = m.remove_view("v1")["ops"]
        assert ops["readdir"] >= 2 and ops["create"] == 1  # the two listings, the shard
        assert _seen("node1", d)["listing"] == ["shard_1", "step_12", "step_8"]
    finally:
        m.stop()
    assert not is_mounted(m.path)
