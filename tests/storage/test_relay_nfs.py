"""A node relay's events file across two NFS clients (``faultlab.storage.nfs``): the relay
writes on node A's client, faultlab reads on the submit host's client B. The relay keeps its
file open (no metadata operation a batch) and its ``fdatasync`` does what an NFS client's
close did, so B's next open sees the bytes; faultlab's stream, without a hub (the file
channel), looks at the file by opening it, because a ``stat`` through B answers from B's
attribute cache. The views' caches last 60 s, so nothing here waits for an expiry. Needs
/dev/fuse and root, as ``tests/storage/test_nfs_view.py``."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from faultlab.observe import EventStream
from faultlab.runtime import relay as relay_mod
from faultlab.storage import fuse_unavailable, is_mounted
from faultlab.storage.nfs import NfsView

SECRET = "s3cret-of-this-run"
TTL_S = 60.0


@pytest.fixture
def clients(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """The run directory as node A's NFS client sees it, and as the submit host's (B)."""
    why = fuse_unavailable()
    if why:
        pytest.fail(f"the NFS view cannot mount here: {why}")
    backing = tmp_path / "server"
    (backing / "run").mkdir(parents=True)

    def start(name: str) -> NfsView:
        (tmp_path / name).mkdir()
        return NfsView.start(backing, tmp_path / name, acregmin=TTL_S, acregmax=TTL_S,
                             acdirmin=TTL_S, acdirmax=TTL_S)

    with start("a") as a, start("b") as b:
        yield a.mountpoint / "run", b.mountpoint / "run"
    assert not is_mounted(tmp_path / "a") and not is_mounted(tmp_path / "b")


def _batch(relay: relay_mod.Relay, step: int) -> None:
    record = {"t": time.time(), "kind": "step", "rank": 0, "step": step}
    relay.pending.append(json.dumps(record).encode() + b"\n")
    relay._flush()


def _steps(records: list[dict[str, object]]) -> list[object]:
    return [r["step"] for r in records if r.get("kind") == "step"]


def test_the_file_channel_is_seen_on_another_client_at_the_next_poll(
        clients: tuple[Path, Path]) -> None:
    on_a, on_b = clients
    relay = relay_mod.Relay(on_a, "node0", SECRET, hub=None)  # the file channel
    stream = EventStream(on_b)
    name = relay_mod.relay_file(on_b, "node0")
    try:
        _batch(relay, 1)
        assert _steps(stream.poll()) == [1]
        size = os.stat(name).st_size  # B caches the file's attributes for 60 s
        _batch(relay, 2)  # synced: the bytes are on the server
        assert os.stat(name).st_size == size  # a stat through B still answers from its cache
        assert _steps(stream.poll()) == [2]  # the stream's open asks the server
    finally:
        relay._close_file()
        relay.listener.close()


def test_on_the_socket_channel_another_client_sees_a_batch_once_it_is_synced(
        clients: tuple[Path, Path]) -> None:
    on_a, on_b = clients
    relay = relay_mod.Relay(on_a, "node0", SECRET, hub="127.0.0.1:9")  # never connected
    name = relay_mod.relay_file(on_b, "node0")
    try:
        _batch(relay, 1)
        assert relay_mod.relay_file(on_a, "node0").read_bytes().count(b"\n") == 1  # A: at once
        assert name.read_bytes() == b""  # B: still in A's client, even on a fresh open
        assert relay.unsynced_t is not None
        relay._sync_if_due(relay.unsynced_t + relay_mod.FILE_SYNC_S)
        assert _steps([json.loads(line) for line in name.read_bytes().splitlines()]) == [1]
    finally:
        relay._close_file()
        relay.listener.close()
