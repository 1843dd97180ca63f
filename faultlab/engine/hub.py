"""The engine's end of the control plane: one connection per node relay (``runtime/relay.py``).

The hub listens on the addresses the target names (loopback for local nodes, the host's side
of a container network, the submit host's address on a cluster), never a wildcard, and takes
a relay only after its hello carries the run's secret. From each relay it gets batches of the
node's event file as the relay wrote them, with the offset they end at; ``drain`` hands them
to the engine's ``EventStream`` (``feed``), which so reads the node's file without touching the
disk. Toward the relays it sends each opened gate once, each live fault as one message per
node (``control``: the relay asks its ranks' control servers and answers for all of them),
and ``bye`` at the end of the run.

A relay that reconnects (a network partition of its node, a new relay after one died) says its
file's size; the hub answers with what it has (``have``), and the relay sends the rest from
its file: nothing is read twice and nothing is skipped. A relay whose connection ends before
``bye`` is recorded (``lost``): its node's events after that moment reach the engine only
from the file at the end of the run, and the verdict says so.

One thread, ``selectors``: the cost grows with the bytes that arrive, not with ranks.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from faultlab.runtime.control import WILDCARDS

__all__ = ["Hub", "RelayInfo", "control_plane"]

_MAX_HEADER = 4096


@dataclass
class RelayInfo:
    """What the hub knows of one node's relay."""

    node: str
    file: str
    pid: int
    connected_t: float
    connects: int = 1
    lost_t: list[float] = field(default_factory=list)
    """When its connection ended before ``bye`` (faultlab's view; the relay may be back)."""
    last_batch_t: float | None = None
    bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "file": self.file, "pid": self.pid,
                "connected_t": self.connected_t, "connects": self.connects,
                "lost_t": self.lost_t, "last_batch_t": self.last_batch_t, "bytes": self.bytes}


class _Conn:
    __slots__ = ("buf", "info", "need", "quit", "sock", "want_end")

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf = sock, b""
        self.info: RelayInfo | None = None
        self.need = 0  # body bytes still expected after a "B end n" header
        self.want_end = 0
        self.quit = False  # the relay said it leaves on purpose (its node's agent is gone)


class Hub:
    """Accepts the relays of one run (see the module docstring)."""

    def __init__(self, secret: str) -> None:
        if not secret:
            raise ValueError("the hub needs the run's secret")
        self._secret = secret.encode()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._lock = threading.Lock()
        self._listeners: dict[str, str] = {}  # host -> "host:port"
        self._conns: dict[socket.socket, _Conn] = {}
        self._have: dict[str, int] = {}  # file -> bytes delivered
        self._out: list[tuple[str, int, bytes]] = []
        self.gates: set[int] = set()
        self.gate_t: dict[int, float] = {}
        """When each gate was opened (``time.time()``, the events' clock)."""
        self.relays: dict[str, RelayInfo] = {}
        self.rank_node: dict[int, str] = {}
        """Which node's relay reaches each rank's control server (the latest to say so)."""
        self._next_id = 0
        self._answers: dict[int, dict[str, Any] | None] = {}
        self._answered = threading.Condition(self._lock)
        self.refused = 0
        self._closing = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="faultlab-hub", daemon=True)
        self._thread.start()

    # -- the engine's side -------------------------------------------------------------------

    def address(self, host: str) -> str:
        """``host:port`` the hub listens on at ``host`` (bound on first ask, never a
        wildcard)."""
        host = host.strip()
        if host in WILDCARDS:
            raise ValueError(f"the hub would listen on every interface ({host!r}); name the "
                             f"address the nodes reach this host at")
        with self._lock:
            if host not in self._listeners:
                family = socket.AF_INET6 if ":" in host else socket.AF_INET
                sock = socket.create_server((host, 0), family=family, backlog=1024)
                sock.setblocking(False)
                port = sock.getsockname()[1]
                self._listeners[host] = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                self._sel.register(sock, selectors.EVENT_READ, "listen")
                self._wake()
            return self._listeners[host]

    def drain(self) -> list[tuple[str, int, bytes]]:
        """The batches that arrived since the last call, in order: (file name, the offset in
        that file where the bytes start, the bytes)."""
        with self._lock:
            out, self._out = self._out, []
        return out

    def open_gate(self, step: int) -> None:
        """Tell every relay, now and any that connects later, that gate ``step`` is open."""
        with self._lock:
            if step in self.gates:
                return
            self.gates.add(step)
            self.gate_t[step] = time.time()
            conns = [c for c in self._conns.values() if c.info is not None]
        msg = json.dumps({"op": "gate", "step": step}).encode() + b"\n"
        for c in conns:
            self._send(c, msg)

    def ending(self) -> None:
        """The run is over: a relay that goes away from now on is not lost (its node is being
        stopped)."""
        with self._lock:
            self._closing = True

    def control(self, messages: dict[int, dict[str, Any]], timeout_s: float = 10.0
                ) -> tuple[dict[int, dict[str, Any]], list[int]]:
        """Send each rank its message through its node's relay: one message per node, sent at
        once, answered together. Returns (rank -> the agent's reply, or ``{"ok": false,
        "unreachable": why}``) and the ranks no relay has registered (the caller reaches
        them another way)."""
        by_node: dict[str, dict[str, dict[str, Any]]] = {}
        unrouted = []
        with self._lock:
            conns = {c.info.node: c for c in self._conns.values() if c.info is not None}
            for rank, msg in messages.items():
                node = self.rank_node.get(rank)
                if node is None or node not in conns:
                    unrouted.append(rank)
                else:
                    by_node.setdefault(node, {})[str(rank)] = msg
            ids = {}
            for node in by_node:
                self._next_id += 1
                ids[node] = self._next_id
                self._answers[self._next_id] = None
        for node, msgs in by_node.items():
            self._send(conns[node], json.dumps({"op": "control", "id": ids[node],
                                                "msgs": msgs}).encode() + b"\n")
        replies: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + timeout_s
        with self._lock:
            for node, rid in ids.items():
                while self._answers.get(rid) is None and time.monotonic() < deadline:
                    self._answered.wait(max(0.0, deadline - time.monotonic()))
                got = self._answers.pop(rid, None) or {}
                for rank_text in by_node[node]:
                    reply = got.get(rank_text)
                    replies[int(rank_text)] = reply if isinstance(reply, dict) else {
                        "ok": False, "unreachable": f"{node}'s relay did not answer within "
                                                    f"{timeout_s:g} s"}
        return replies, unrouted

    def close(self) -> None:
        """Say ``bye`` to every relay (they flush and exit), then stop listening. Idempotent."""
        if self._stop.is_set():
            return
        with self._lock:
            self._closing = True
            conns = list(self._conns.values())
        for c in conns:
            if c.info is not None:
                self._send(c, b'{"op":"bye"}\n')
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:  # let them push their last batch and hang up
            with self._lock:
                if not any(c.info is not None for c in self._conns.values()):
                    break
            time.sleep(0.02)
        self._stop.set()
        self._wake()
        self._thread.join(timeout=5)
        for key in list(self._sel.get_map().values()):
            with contextlib.suppress(OSError):
                key.fileobj.close()  # type: ignore[union-attr]
        self._sel.close()

    def summary(self) -> dict[str, Any]:
        with self._lock:
            return {"listen": sorted(self._listeners.values()), "refused": self.refused,
                    "gates_opened_t": {str(k): v for k, v in sorted(self.gate_t.items())},
                    "relays": {n: r.to_dict() for n, r in sorted(self.relays.items())}}

    # -- the thread --------------------------------------------------------------------------

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _send(self, c: _Conn, data: bytes) -> None:
        try:
            c.sock.sendall(data)
        except OSError:
            pass  # the reader sees the end and records it

    def _serve(self) -> None:
        while not self._stop.is_set():
            for key, _mask in self._sel.select(0.5):
                if key.data == "wake":
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(4096)
                elif key.data == "listen":
                    self._accept(key.fileobj)  # type: ignore[arg-type]
                else:
                    self._read(key.data)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            sock.settimeout(2.0)  # sends; reads happen only when select says readable
            c = _Conn(sock)
            with self._lock:
                self._conns[sock] = c
            self._sel.register(sock, selectors.EVENT_READ, c)

    def _end(self, c: _Conn) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(c.sock)
        c.sock.close()
        with self._lock:
            self._conns.pop(c.sock, None)
            if c.info is not None and not self._closing and not c.quit:
                c.info.lost_t.append(time.time())

    def _read(self, c: _Conn) -> None:
        try:
            data = c.sock.recv(1 << 18)
        except (BlockingIOError, InterruptedError, TimeoutError):
            return
        except OSError:
            data = b""
        if not data:
            self._end(c)
            return
        c.buf += data
        while True:
            if c.need:
                if len(c.buf) < c.need:
                    return
                body, c.buf = c.buf[:c.need], c.buf[c.need:]
                c.need = 0
                self._batch(c, body)
                continue
            nl = c.buf.find(b"\n")
            if nl < 0:
                if len(c.buf) > _MAX_HEADER:
                    self._end(c)
                return
            line, c.buf = c.buf[:nl], c.buf[nl + 1:]
            if c.info is None:
                if not self._hello(c, line):
                    with self._lock:
                        self.refused += 1
                    self._end(c)
                    return
            elif line.startswith(b"X"):
                c.quit = True
            elif line.startswith((b"C ", b"A ")):
                self._relay_says(c, line)
            elif line.startswith(b"B "):
                try:
                    _, end, n = line.split()
                    c.want_end, c.need = int(end), int(n)
                except ValueError:
                    self._end(c)
                    return
                if c.need == 0:
                    continue

    def _hello(self, c: _Conn, line: bytes) -> bool:
        if not line.startswith(b"H "):
            return False
        try:
            hello = json.loads(line[2:])
            secret = str(hello["secret"]).encode()
            node, name, pid = str(hello["node"]), str(hello["file"]), int(hello["pid"])
        except (ValueError, KeyError, TypeError):
            return False
        if not hmac.compare_digest(secret, self._secret) or "/" in name or \
                name.startswith("."):
            return False
        with self._lock:
            info = self.relays.get(node)
            if info is None:
                info = self.relays[node] = RelayInfo(node, name, pid, time.time())
            else:
                info.connects += 1
                info.pid = pid
            c.info = info
            have = self._have.setdefault(name, 0)
            gates = sorted(self.gates)
        self._send(c, json.dumps({"op": "have", "off": have, "gates": gates}).encode() + b"\n")
        return True

    def _relay_says(self, c: _Conn, line: bytes) -> None:
        assert c.info is not None
        try:
            msg = json.loads(line[2:])
        except ValueError:
            return
        if not isinstance(msg, dict):
            return
        with self._lock:
            if line.startswith(b"C ") and isinstance(msg.get("rank"), int):
                self.rank_node[msg["rank"]] = c.info.node
            elif line.startswith(b"A ") and msg.get("id") in self._answers:
                replies = msg.get("replies")
                self._answers[msg["id"]] = replies if isinstance(replies, dict) else {}
                self._answered.notify_all()

    def _batch(self, c: _Conn, body: bytes) -> None:
        assert c.info is not None
        name = c.info.file
        start = c.want_end - len(body)
        with self._lock:
            have = self._have.get(name, 0)
            if c.want_end <= have:
                return  # already had it
            if start < have:
                body = body[have - start:]
            # start > have cannot happen (the relay sends from what the hub said it has); if it
            # did, the reader fills the gap from the file
            self._have[name] = c.want_end
            self._out.append((name, max(start, have), body))
            c.info.last_batch_t = time.time()
            c.info.bytes += len(body)


LATE_GRACE_S = 1.0
"""A record the engine read only after the run counts as missed if it was written this long
before the engine stopped watching the job (the last moments' records race the nodes' end)."""


def control_plane(runtime: Any, hub: Hub | None, late: dict[str, list[float]],
                  watched_until: float | None = None) -> dict[str, Any]:
    """The journal's ``run.control_plane``: the channel, each relay as the hub saw it, and
    ``lost``: a sentence naming every node whose records reached the engine only from its file
    after the run (``EventStream.late``: its relay died, or its connection did, and no relay
    took over). The run's triggers, gates and reaction checks did not see those records: a
    finding about faultlab. A relay that went away with its node (a container stopped, a
    machine lost) left nothing behind, and is no finding; nor is a record written in the last
    ``LATE_GRACE_S`` before ``watched_until`` (when the engine stopped watching). Empty without
    a runtime."""
    if runtime is None:
        return {}
    out: dict[str, Any] = {"channel": runtime.channel}
    if hub is None:
        return out
    out.update(hub.summary())
    by_file = {info["file"]: node for node, info in out["relays"].items()}
    lost = []
    until = (watched_until if watched_until is not None else time.time()) - LATE_GRACE_S
    for name, times in sorted(late.items()):
        missed = [t for t in times if t < until]
        if not missed:
            continue
        count, first_t = len(missed), min(missed)
        node = by_file.get(name, name)
        info = out["relays"].get(node, {})
        gone = f" (its relay went away at {_clock(info['lost_t'][-1])})" \
            if info.get("lost_t") else ""
        lost.append(f"{count} record(s) of {node} from {_clock(first_t)} on reached faultlab "
                    f"only from its file after the run{gone}")
    if lost:
        out["lost"] = "; ".join(lost)
    return out


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 10)}"
