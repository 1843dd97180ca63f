"""The node relay and the engine's hub, as real processes and sockets: events pushed and kept
on disk, gates broadcast, the secret enforced, a dead relay replaced, faultlab's death noticed,
and the file channel for clusters without a route to the submit host."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from faultlab.engine.hub import Hub, control_plane
from faultlab.observe import EventStream
from faultlab.runtime import relay as relay_mod
from faultlab.runtime.events import EventLog
from faultlab.runtime.gates import StepGates, open_gate
from faultlab.runtime.relay import relay_file
from faultlab.runtime.uplink import RelayDown, Uplink, socket_name
from faultlab.targets.procs import pid_alive

SECRET = "s3cret-of-this-run"


def _until(cond: Callable[[], object], timeout_s: float = 10.0) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def _env(run_dir: Path, node: str, hub: Hub | None) -> dict[str, str]:
    env = {**os.environ, "FAULTLAB_RUN_DIR": str(run_dir), "FAULTLAB_NODE": node,
           "FAULTLAB_RUNTIME_SECRET": SECRET, "RANK": "0", "WORLD_SIZE": "2",
           "FAULTLAB_CHANNEL": "socket" if hub else "file"}
    if hub is not None:
        env["FAULTLAB_HUB"] = hub.address("127.0.0.1")
    return env


def _relay_pid(run_dir: Path, node: str) -> int:
    def find() -> int | None:
        for p in psutil.process_iter(["cmdline"]):
            cmd = p.info["cmdline"] or []
            if "faultlab.runtime.relay" in cmd and str(run_dir) in cmd and node in cmd:
                return p.pid
        return None
    return int(_until(find))  # type: ignore[arg-type]


@pytest.fixture
def hub() -> Iterator[Hub]:
    h = Hub(SECRET)
    yield h
    h.close()


def _record(rank: int, kind: str, **fields: object) -> str:
    return json.dumps({"t": time.time(), "kind": kind, "rank": rank, **fields}) + "\n"


def test_events_reach_the_engine_and_the_file_and_gates_wake_every_rank(
        tmp_path: Path, hub: Hub) -> None:
    env = _env(tmp_path, "node0", hub)
    ranks = [Uplink(tmp_path, "node0", SECRET, rank=r, env=env) for r in (0, 1)]
    stream = EventStream(tmp_path)
    stream.attach(hub)
    for step in (1, 2, 3):
        for r in ranks:
            r.emit_line(_record(r.rank, "step", step=step))
    _until(lambda: stream.poll() or stream.count("step") == 6)
    assert stream.max_step() == 3
    lines = relay_file(tmp_path, "node0").read_text().splitlines()
    assert len(lines) == 6  # the durable record holds what the engine saw
    assert not list((tmp_path / "events").glob("*rank*"))  # no file per rank

    # gate 5: both ranks wait; the engine opens it once; a late rank passes at once
    import threading
    waited: dict[int, tuple[float, bool]] = {}
    threads = [threading.Thread(target=lambda r=r: waited.__setitem__(
        r.rank, r.wait_gate(5, 10.0, None))) for r in ranks]
    for t in threads:
        t.start()
    time.sleep(0.3)
    assert not waited  # closed
    hub.open_gate(5)
    for t in threads:
        t.join(5)
    assert all(ok for _, ok in waited.values()) and len(waited) == 2  # opened, not timed out
    late = Uplink(tmp_path, "node0", SECRET, rank=2, env=env)
    assert late.wait_gate(5, 5.0, None)[1]
    waited_s, opened = late.wait_gate(6, 0.3, None)
    assert not opened and 0.3 <= waited_s < 5  # timed out

    pid = _relay_pid(tmp_path, "node0")
    summary = control_plane(type("R", (), {"channel": "socket"})(), hub, {})
    assert summary["relays"]["node0"]["pid"] == pid and "lost" not in summary
    hub.close()  # bye: the relay flushes and exits
    _until(lambda: not pid_alive(pid))


def test_the_secret_is_required_at_both_ends(tmp_path: Path, hub: Hub) -> None:
    env = _env(tmp_path, "node0", hub)
    good = Uplink(tmp_path, "node0", SECRET, rank=0, env=env)
    good.emit_line(_record(0, "step", step=1))
    intruder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    intruder.connect(socket_name(tmp_path, "node0"))
    intruder.sendall(b'H {"secret": "guess"}\nE {"t": 1, "kind": "step", "step": 99}\n')
    assert intruder.recv(10) == b""  # hung up on
    intruder.close()
    host, port = env["FAULTLAB_HUB"].rsplit(":", 1)
    with socket.create_connection((host, int(port))) as fake_relay:
        fake_relay.sendall(b'H {"secret": "guess", "node": "x", "file": "x", "pid": 1}\n')
        assert fake_relay.recv(10) == b""
    good.emit_line(_record(0, "step", step=2))
    stream = EventStream(tmp_path)
    stream.attach(hub)
    _until(lambda: stream.poll() or stream.count("step") == 2)
    assert stream.max_step() == 2 and hub.refused == 1
    with pytest.raises(ValueError, match="every interface"):
        hub.address("0.0.0.0")


def test_a_killed_relay_is_replaced_and_nothing_written_is_read_twice(
        tmp_path: Path, hub: Hub) -> None:
    env = _env(tmp_path, "node1", hub)
    up = Uplink(tmp_path, "node1", SECRET, rank=0, env=env)
    stream = EventStream(tmp_path)
    stream.attach(hub)
    up.emit_line(_record(0, "step", step=1))
    _until(lambda: stream.poll() or stream.count("step") == 1)
    first = _relay_pid(tmp_path, "node1")
    os.kill(first, signal.SIGKILL)
    _until(lambda: not pid_alive(first))
    for step in (2, 3):  # the first send finds the relay gone and starts another
        up.emit_line(_record(0, "step", step=step))
    _until(lambda: stream.poll() or stream.count("step") == 3)
    second = _relay_pid(tmp_path, "node1")
    assert second != first
    info = hub.relays["node1"]
    assert info.connects == 2 and len(info.lost_t) == 1
    stream.detach()
    stream.poll()  # the file after the run: nothing more, nothing twice
    assert [e["step"] for e in stream.of_kind("step")] == [1, 2, 3]
    hub.close()
    _until(lambda: not pid_alive(second))


def test_a_relay_whose_engine_died_exits_once_its_ranks_are_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hub = Hub(SECRET)
    env = _env(tmp_path, "node0", hub)
    up = Uplink(tmp_path, "node0", SECRET, rank=0, env=env)
    up.emit_line(_record(0, "step", step=1))
    pid = _relay_pid(tmp_path, "node0")
    _until(lambda: "node0" in hub.relays)
    hub._stop.set()  # faultlab "dies": its sockets close without a bye
    hub._wake()
    hub._thread.join(5)
    for key in list(hub._sel.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]
    up.close()  # the guard reaps the ranks
    t0 = time.monotonic()
    _until(lambda: not pid_alive(pid), timeout_s=relay_mod.ORPHAN_S + 5)
    assert time.monotonic() - t0 >= relay_mod.ORPHAN_S - 1


def test_the_file_channel_keeps_one_file_per_node_and_reads_gates_from_one_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = _env(tmp_path, "node0", None)
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "gates.txt").touch()
    for key in ("FAULTLAB_RUN_DIR", "FAULTLAB_NODE", "FAULTLAB_RUNTIME_SECRET", "RANK",
                "WORLD_SIZE", "FAULTLAB_CHANNEL"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.delenv("FAULTLAB_HUB", raising=False)
    log = EventLog(tmp_path / "events", rank=0, world_size=2, node="node0", restart=0)
    log.emit("start", resumed_from_step=0)
    log.emit("step", step=1)
    stream = EventStream(tmp_path)
    _until(lambda: stream.poll() or stream.count("step") == 1)
    assert [p.name for p in (tmp_path / "events").iterdir()] == ["node0-relay.jsonl"]
    gates = StepGates(tmp_path, [4], timeout_s=10)
    import threading
    result: list[tuple[float, bool] | None] = []
    t = threading.Thread(target=lambda: result.append(gates.wait(4)))
    t.start()
    time.sleep(0.3)
    assert not result
    open_gate(tmp_path, 4)
    t.join(5)
    assert result and result[0] is not None and result[0][1]
    pid = _relay_pid(tmp_path, "node0")
    os.kill(pid, signal.SIGKILL)  # the job's notice signals do not end it (see below)
    _until(lambda: not pid_alive(pid))


def test_a_rank_whose_relay_cannot_start_writes_its_own_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {**_env(tmp_path, "node0", None), "FAULTLAB_RUNTIME_SECRET": SECRET}
    for key in ("FAULTLAB_RUN_DIR", "FAULTLAB_NODE", "FAULTLAB_RUNTIME_SECRET",
                "FAULTLAB_CHANNEL"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.setattr(Uplink, "_spawn", lambda self: None)  # no relay comes up
    monkeypatch.setattr(time, "monotonic", _fast_clock())
    log = EventLog(tmp_path / "events", rank=0, world_size=1, node="node0", restart=0)
    log.emit("step", step=1)
    assert log.path.exists() and json.loads(log.path.read_text())["step"] == 1
    with pytest.raises(RelayDown):
        Uplink(tmp_path, "node0", SECRET, rank=0, env=env).emit_line("{}\n")


def _fast_clock() -> Callable[[], float]:
    """A clock that runs 100 times fast (the uplink's 10 s wait for a relay, in 0.1 s)."""
    real, start = time.monotonic, time.monotonic()
    return lambda: start + (real() - start) * 100


class _Batches:
    """A hub's ``drain`` that hands over the given batches once (the stream's bookkeeping)."""

    def __init__(self, batches: list[tuple[str, int, bytes]]) -> None:
        self.batches = batches

    def drain(self) -> list[tuple[str, int, bytes]]:
        out, self.batches = self.batches, []
        return out


def test_records_the_hub_never_delivered_are_named_with_their_node(tmp_path: Path) -> None:
    events = tmp_path / "events"
    events.mkdir()
    t = time.time()
    lines = [_record(0, "step", step=s).replace('"t": ', f'"t": {t - 10 + s}, "x": ')
             for s in (1, 2, 3)]
    delivered = lines[0].encode()
    (events / "node1-relay.jsonl").write_text("".join(lines))
    stream = EventStream(tmp_path)
    stream.attach(_Batches([("node1-relay.jsonl", 0, delivered)]))
    stream.poll()
    assert stream.count("step") == 1
    stream.detach()
    stream.poll()  # after the run: steps 2 and 3 come from the file, late
    assert stream.count("step") == 3 and len(stream.late["node1-relay.jsonl"]) == 2
    hub = Hub(SECRET)
    try:
        plane = control_plane(type("R", (), {"channel": "socket"})(), hub, stream.late, t)
        assert plane["lost"].startswith("2 record(s) of node1-relay.jsonl from ")
        # written within the last second before faultlab stopped watching: no finding
        assert "lost" not in control_plane(type("R", (), {"channel": "socket"})(), hub,
                                           stream.late, t - 10 + 2.5)
    finally:
        hub.close()


def test_a_live_fault_reaches_every_rank_with_one_message_per_node(
        tmp_path: Path, hub: Hub) -> None:
    from faultlab.runtime.control import ControlServer

    servers, got = [], []
    for rank, node in ((0, "node0"), (1, "node0"), (2, "node1")):
        up = Uplink(tmp_path, node, SECRET, rank=rank, env=_env(tmp_path, node, hub))
        server = ControlServer(host="127.0.0.1", secret=SECRET,
                               handler=lambda m, r=rank: (got.append((r, m)) or
                                                          {"ok": True, "rank": r}),
                               info_path=tmp_path / "runtime" / f"rank{rank}.json", info={})
        servers.append(server)
        up.register_control(server.host, server.port)
    _until(lambda: len(hub.rank_node) == 3)
    assert hub.rank_node == {0: "node0", 1: "node0", 2: "node1"}
    servers[1].close()  # rank 1 died
    replies, unrouted = hub.control({r: {"op": "inject", "n": r} for r in (0, 1, 2, 7)})
    assert unrouted == [7]  # no relay knows rank 7
    assert replies[0] == {"ok": True, "rank": 0} and replies[2] == {"ok": True, "rank": 2}
    assert replies[1]["ok"] is False and "rank 1's agent" in replies[1]["unreachable"]
    assert sorted(got) == [(0, {"op": "inject", "n": 0}), (2, {"op": "inject", "n": 2})]
    for server in servers:
        server.close()


class _FileCalls:
    """Counts the ``os.open`` of one path (the relay's events file) and every ``fdatasync``."""

    def __init__(self, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.path, self.opens, self.syncs = os.fspath(path), 0, 0
        real_open, real_sync = os.open, os.fdatasync

        def counted_open(path: object, *args: object, **kwargs: object) -> int:
            if os.fspath(path) == self.path:  # type: ignore[arg-type]
                self.opens += 1
            return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

        def counted_sync(fd: int) -> None:
            self.syncs += 1
            real_sync(fd)
        monkeypatch.setattr(relay_mod.os, "open", counted_open)
        monkeypatch.setattr(relay_mod.os, "fdatasync", counted_sync)


def _batch(relay: relay_mod.Relay, step: int) -> None:
    relay.pending.append(_record(0, "step", step=step).encode())
    relay._flush()


def _steps(path: Path, skip: int = 0) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()[skip:]]


def test_the_relay_opens_its_file_once_and_syncs_it_once_a_second_on_the_socket_channel(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No metadata operation in steady training: the file stays open, and ``fdatasync`` (what
    an NFS client's close does) sends each second's batches to the file server."""
    path = relay_mod.relay_file(tmp_path, "node0")
    path.parent.mkdir()
    path.write_bytes(_record(0, "step", step=0).encode() + b'{"t": 1, "kind": "st')  # torn
    calls = _FileCalls(path, monkeypatch)
    relay = relay_mod.Relay(tmp_path, "node0", SECRET, hub="127.0.0.1:9")  # never connected
    try:
        assert calls.opens == 1 and relay.fd is not None
        for step in range(1, 21):  # 20 batches within FILE_SYNC_S: none synced yet
            _batch(relay, step)
            assert relay.unsynced_t is not None
            relay._sync_if_due(relay.unsynced_t + relay_mod.FILE_SYNC_S / 2)
        assert calls.syncs == 0
        # every batch is in the file already (this host reads it whole); the torn line ended
        assert path.read_text().splitlines()[1] == '{"t": 1, "kind": "st'
        assert _steps(path, skip=2) == list(range(1, 21))
        assert path.stat().st_size == relay.size
        relay._sync_if_due(relay.unsynced_t + relay_mod.FILE_SYNC_S)
        assert calls.syncs == 1 and relay.unsynced_t is None  # a second after the first batch
        _batch(relay, 21)
        relay.stop = True
        relay.pending.append(_record(0, "step", step=22).encode())
        relay.run()  # leaving: the last batch written, the file closed
        assert relay.fd is None and calls.opens == 1
        assert _steps(path, skip=2) == list(range(1, 23))
    finally:
        relay._close_file()
        relay.listener.close()


def test_on_the_file_channel_the_relay_syncs_every_batch_and_opens_its_file_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _FileCalls(relay_mod.relay_file(tmp_path, "node0"), monkeypatch)
    relay = relay_mod.Relay(tmp_path, "node0", SECRET, hub=None)
    try:
        for step in (1, 2, 3):  # the engine, on another host, tails the file: each batch synced
            _batch(relay, step)
            assert calls.syncs == step and relay.unsynced_t is None
        assert calls.opens == 1 and _steps(relay.path) == [1, 2, 3]
    finally:
        relay._close_file()
        relay.listener.close()


def test_a_notice_signal_to_every_process_of_the_job_leaves_the_relay_reporting(
        tmp_path: Path, hub: Hub) -> None:
    """Slurm's preemption signals every process of the job's steps, the relay among them. A
    relay that died on it lost the ranks' preemption_notice records (seen under load in
    slurm_preemption). It ignores the job's notice signals and goes on relaying."""
    env = _env(tmp_path, "node0", hub)
    up = Uplink(tmp_path, "node0", SECRET, rank=0, env=env)
    stream = EventStream(tmp_path)
    stream.attach(hub)
    up.emit_line(_record(0, "step", step=1))
    _until(lambda: stream.poll() or stream.count("step") == 1)
    pid = _relay_pid(tmp_path, "node0")
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP):
        os.kill(pid, sig)
    up.emit_line(_record(0, "preemption_notice", provider="slurm"))
    _until(lambda: stream.poll() or stream.count("preemption_notice") == 1)
    assert pid_alive(pid) and _relay_pid(tmp_path, "node0") == pid  # the same relay
    assert hub.relays["node0"].connects == 1 and not hub.relays["node0"].lost_t
    hub.close()  # the run is over: it leaves by its own rule
    _until(lambda: not pid_alive(pid))
