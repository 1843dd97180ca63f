"""The node relay: one process per node between that node's ranks and faultlab's engine.

Why: a rank must never signal faultlab through the shared filesystem. On NFS another client's
new file can stay invisible for a minute and appends arrive only after the writer closes; on
Lustre a 2 ms poll per rank is a ban. So every rank talks to the relay of its own node over an
abstract Unix socket (node-local, no file, gone with the process), and the relay is the node's
only link to the engine:

- **events** (``E <record>``): the relay gathers them for ``BATCH_S``, appends the batch to
  ``events/<node>-relay.jsonl`` (one ``write`` of whole lines), *then* pushes the same bytes
  to the engine's hub with the offset they end at. The file is the durable record (journal,
  report, Chaos Toolkit probes, post-mortem); the push is how the engine sees it at once. The
  relay opens the file once and keeps it open until it leaves (closed before it hangs up on
  the hub): no metadata operation on the shared filesystem in steady training, however many
  batches the node's ranks make, in lockstep or not. Each batch is in the node's kernel
  before its push (no user-space buffer), so a killed relay loses nothing and this host reads
  the file whole. Other hosts of an NFS mount see bytes once they reach the file server:
  ``fdatasync`` sends them, the write-back and commit Linux's NFS client does at ``close``
  (close-to-open), without the reopen's lookup. On the socket channel that is at most
  ``FILE_SYNC_S`` after a batch was written, so other hosts see it within about a second and
  a node whose kernel dies (power, a VM gone) can lose that last second from the file, not
  from the engine; on the file channel, where the file *is* the channel, after every batch.
- **live faults** (``C`` registers a rank's control server, ``runtime/control.py``): the
  engine sends one message per node with what each of its ranks is to get; the relay asks
  each rank's server on the node and answers with every reply at once.
- **step gates** (``G <step>``): a rank waits on its socket; the engine opens a gate once, the
  hub tells each relay once, and the relay wakes every rank waiting there. A gate stays open.
- **channels.** ``socket`` (``FAULTLAB_HUB`` = host:port): push to the hub, gates from it.
  ``file``, for clusters whose nodes reach the submit host only through the shared filesystem:
  the engine tails one file per node, and the relay reads ``runtime/gates.txt`` (one open and
  read every 0.1 s, only while a rank waits at a gate).
- **authentication.** A rank's first line carries ``FAULTLAB_RUNTIME_SECRET`` (compared in
  constant time), and so does the relay's hello to the hub; the hub binds the address the
  target names, never a wildcard. Anything else is closed.
- **lifetime.** The first rank of a node that finds no relay starts one (``uplink.py``), in a
  session of its own, so torchrun's stop of a worker group does not take it along; a second
  one that loses the race to bind the name exits at once. The relay stays through rank restarts
  and exits when the node's agent (the parent of the rank that started it) is gone, when the
  hub says ``bye`` (the run is over), when it has had neither a hub nor a rank for ``ORPHAN_S``
  (faultlab died: the guard reaped the ranks), or after ``HUBLESS_S`` without a hub at all. On
  the file channel it exits after ``IDLE_S`` without a rank. Leaving on purpose, it tells the
  hub (``X``), so only a relay that dies is counted as lost. The job's notice signals (TERM,
  INT, HUP, USR1, USR2: Slurm's preemption signals every process of the job) do not end it:
  it must report how the ranks took them.

    python -m faultlab.runtime.relay --run-dir DIR --node NAME   (the Uplink starts it)
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import json
import os
import selectors
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from faultlab.runtime.client import exchange
from faultlab.runtime.uplink import CHANNEL_ENV, SECRET_ENV, socket_name

__all__ = ["CHANNEL_ENV", "GATES_FILE", "HUB_ENV", "RELAY_FILE_SUFFIX", "Relay", "relay_file"]

HUB_ENV = "FAULTLAB_HUB"
"""host:port of the engine's hub (the socket channel)."""
RELAY_FILE_SUFFIX = "-relay.jsonl"
GATES_FILE = "gates.txt"
"""``runtime/gates.txt``: the gates opened so far, one step a line (the file channel)."""

BATCH_S = 0.01
"""How long the relay gathers records before it writes and pushes them."""
FILE_SYNC_S = 1.0
"""Socket channel: how long a written batch may stay in the node's kernel before
``fdatasync`` sends it to the file server (the file channel syncs every batch at once). The
file stays open: reopening it for each batch was a metadata operation each, 8 a second for a
node of 8 ranks that each step once a second at a moment of their own, and closing it once a
second cost the open of the next second."""
FILE_GATE_POLL_S = 0.1
ORPHAN_S = 5.0
WATCH_S = 0.5
"""How often the relay checks that the agent it watches (``--watch-pid``) is still there."""
HUBLESS_S = 300.0
IDLE_S = 120.0
MAX_LINE = 1 << 20


def relay_file(run_dir: Path, node: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in node)
    return Path(run_dir) / "events" / f"{safe}{RELAY_FILE_SUFFIX}"


# --- the relay ------------------------------------------------------------------------------


class _Rank:
    __slots__ = ("buf", "ok", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf, self.ok = sock, b"", False


class Relay:
    """The node's relay process (see the module docstring)."""

    def __init__(self, run_dir: Path, node: str, secret: str, hub: str | None,
                 watch_pid: int | None = None) -> None:
        self.run_dir, self.node = Path(run_dir), node
        self.watch_pid = watch_pid
        self.watch_start = _start_time(watch_pid) if watch_pid else None
        self.next_watch = 0.0
        self._secret = secret.encode()
        self.hub_addr = hub
        self.path = relay_file(self.run_dir, node)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(socket_name(self.run_dir, node))  # EADDRINUSE: one is running
        self.listener.listen(1024)
        self.listener.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ, "listen")
        self.ranks: dict[socket.socket, _Rank] = {}
        self.pending: list[bytes] = []
        self.first_pending_t = 0.0
        self.open_gates: set[int] = set()
        self.waiters: dict[int, list[socket.socket]] = {}
        self.fd: int | None = None
        """The events file, open for appending from here until the relay leaves (None:
        closed)."""
        self.fd, self.size = self._open_file()
        self.unsynced_t: float | None = None
        """When the oldest batch not yet sent to the file server by ``fdatasync`` was written
        (None: every byte is synced)."""
        self.hub: socket.socket | None = None
        self.hub_in = b""
        self.hub_out = bytearray()
        self.hub_ready = False
        self.hub_since = self.rank_since = time.monotonic()
        self.next_hub_try = 0.0
        self.next_gate_read = 0.0
        self.stop = False
        self.controls: dict[int, tuple[str, int, int]] = {}  # rank -> (host, port, pid)
        self.answers: list[bytes] = []  # control replies from the worker threads
        self._answers_lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self.sel.register(self._wake_r, selectors.EVENT_READ, "wake")

    def _open_file(self) -> tuple[int, int]:
        """The events file, opened for appending for the relay's life, and its size. A relay
        before this one may have died mid-line: its torn line is ended. ``os.open``, not
        ``open``: Python's ``open`` adds an ``fstat``."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.lseek(fd, 0, os.SEEK_END)
            if size and os.pread(fd, 1, size - 1) != b"\n":
                size += os.write(fd, b"\n")
        except OSError:
            os.close(fd)
            raise
        return fd, size

    # the loop

    def run(self) -> None:
        try:
            self._loop()
            self._flush()
        finally:
            self._close_file()  # before the hub hears the relay hang up: the file is whole
        self._hub_drain()

    def _loop(self) -> None:
        while not self.stop:
            now = time.monotonic()
            if self.hub_addr and self.hub is None and now >= self.next_hub_try:
                self._hub_connect()
            timeout = BATCH_S if self.pending else \
                FILE_GATE_POLL_S if self.waiters and not self.hub_addr else 0.2
            if self.unsynced_t is not None:
                timeout = min(timeout, max(0.0, self.unsynced_t + FILE_SYNC_S - now))
            for key, mask in self.sel.select(timeout):
                if key.data == "listen":
                    self._accept()
                elif key.data == "wake":
                    self._answered()
                elif key.data == "hub":
                    self._hub_io(mask)
                else:
                    self._rank_read(key.fileobj)  # type: ignore[arg-type]
            now = time.monotonic()
            if self.pending and now - self.first_pending_t >= BATCH_S:
                self._flush()
            self._sync_if_due(now)
            if not self.hub_addr and self.waiters and now >= self.next_gate_read:
                self._read_gates_file()
                self.next_gate_read = now + FILE_GATE_POLL_S
            self._maybe_exit(now)

    def _maybe_exit(self, now: float) -> None:
        if self.watch_pid and now >= self.next_watch:
            self.next_watch = now + WATCH_S
            if self.watch_start is None or _start_time(self.watch_pid) != self.watch_start:
                print(f"faultlab relay {self.node}: the node's agent {self.watch_pid} is gone: "
                      f"exiting", flush=True)
                self._flush()
                self._sync()
                if self.hub is not None and self.hub_ready:
                    self._hub_send(b"X agent-gone\n")
                self.stop = True
                return
        if self.ranks:
            self.rank_since = now
        if self.hub is not None and self.hub_ready:
            self.hub_since = now
        if self.hub_addr:
            no_hub = now - self.hub_since
            if (no_hub > ORPHAN_S and now - self.rank_since > ORPHAN_S) or no_hub > HUBLESS_S:
                print(f"faultlab relay {self.node}: no hub for {no_hub:.0f} s and no rank for "
                      f"{now - self.rank_since:.0f} s: exiting", flush=True)
                self.stop = True
        elif now - self.rank_since > IDLE_S:
            self.stop = True

    # ranks

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            conn.setblocking(False)
            self.ranks[conn] = _Rank(conn)
            self.sel.register(conn, selectors.EVENT_READ, "rank")

    def _drop(self, conn: socket.socket) -> None:
        self.ranks.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(conn)
        for waiting in self.waiters.values():
            if conn in waiting:
                waiting.remove(conn)
        conn.close()

    def _rank_read(self, conn: socket.socket) -> None:
        r = self.ranks.get(conn)
        if r is None:
            return
        try:
            data = conn.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # gone; a torn last record of a killed rank is never written
            self._drop(conn)
            return
        r.buf += data
        if b"\n" not in data:
            if len(r.buf) > MAX_LINE:
                self._drop(conn)
            return
        *lines, r.buf = r.buf.split(b"\n")
        for line in lines:
            if not r.ok:
                if not self._hello(line):
                    self._drop(conn)
                    return
                r.ok = True
            elif line.startswith(b"E "):
                if not self.pending:
                    self.first_pending_t = time.monotonic()
                self.pending.append(line[2:] + b"\n")
            elif line.startswith(b"C "):
                try:
                    info = json.loads(line[2:])
                    rank = int(info["rank"])
                    self.controls[rank] = (str(info["host"]), int(info["port"]),
                                           int(info["pid"]))
                except (ValueError, KeyError, TypeError):
                    continue
                if self.hub is not None and self.hub_ready:
                    self._hub_send(b"C " + json.dumps({"rank": rank}).encode() + b"\n")
            elif line.startswith(b"G "):
                try:
                    step = int(line[2:])
                except ValueError:
                    continue
                if step in self.open_gates:
                    self._tell(conn, step)
                else:
                    self.waiters.setdefault(step, []).append(conn)
                    self.next_gate_read = 0.0

    def _hello(self, line: bytes) -> bool:
        if not line.startswith(b"H "):
            return False
        try:
            hello = json.loads(line[2:])
            secret = str(hello["secret"]).encode()
        except (ValueError, KeyError, TypeError):
            return False
        return hmac.compare_digest(secret, self._secret)

    def _tell(self, conn: socket.socket, step: int) -> None:
        try:
            conn.setblocking(True)
            conn.settimeout(1.0)
            conn.sendall(f"G {step}\n".encode())
            conn.setblocking(False)
        except OSError:
            self._drop(conn)

    def _open_gate(self, step: int) -> None:
        self.open_gates.add(step)
        for conn in self.waiters.pop(step, []):
            self._tell(conn, step)

    def _read_gates_file(self) -> None:
        try:
            with open(self.run_dir / "runtime" / GATES_FILE, encoding="utf-8") as f:
                text = f.read()
        except OSError:
            return
        for word in text.split():
            with contextlib.suppress(ValueError):
                if int(word) not in self.open_gates:
                    self._open_gate(int(word))

    # the durable file, then the hub

    def _flush(self) -> None:
        """Append the gathered records to the node's file, *then* push them to the hub: the
        file never lacks what the engine saw, whoever dies next."""
        if not self.pending:
            return
        data = b"".join(self.pending)
        self.pending = []
        # One write of whole lines to the file, open since the relay started (no user-space
        # buffer: the bytes are in the kernel when the push goes out, and outlive this
        # process); fdatasync sends them to the file server: at once on the file channel,
        # whose reader is on another host, within FILE_SYNC_S on the socket channel.
        if self.fd is None:  # closed: the relay is leaving
            raise OSError(f"the events file {self.path} is closed")
        os.write(self.fd, data)
        self.size += len(data)
        if not self.hub_addr:
            self._sync()
        elif self.unsynced_t is None:
            self.unsynced_t = time.monotonic()
        if self.hub is not None and self.hub_ready:
            self._hub_send(f"B {self.size} {len(data)}\n".encode() + data)

    def _sync_if_due(self, now: float) -> None:
        if self.unsynced_t is not None and now - self.unsynced_t >= FILE_SYNC_S:
            self._sync()

    def _sync(self) -> None:
        """Send the written bytes to the file server (on NFS: the write-back and commit a
        ``close`` does), so other hosts see them at their next open."""
        self.unsynced_t = None
        if self.fd is not None:
            with contextlib.suppress(OSError):  # the next batch's sync tries again
                os.fdatasync(self.fd)

    def _close_file(self) -> None:
        """Close the events file when the relay leaves (NFS writes its bytes back on close)."""
        self.unsynced_t = None
        if self.fd is not None:
            fd, self.fd = self.fd, None
            with contextlib.suppress(OSError):
                os.close(fd)

    def _hub_connect(self) -> None:
        assert self.hub_addr is not None
        host, _, port = self.hub_addr.rpartition(":")
        self.next_hub_try = time.monotonic() + 0.5
        try:
            sock = socket.create_connection((host.strip("[]"), int(port)), timeout=2.0)
        except OSError:
            return
        sock.setblocking(False)
        self.hub, self.hub_in, self.hub_out, self.hub_ready = sock, b"", bytearray(), False
        hello = {"secret": self._secret.decode(), "node": self.node, "file": self.path.name,
                 "pid": os.getpid(), "size": self.size}
        self._hub_send(b"H " + json.dumps(hello).encode() + b"\n")
        self.sel.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, "hub")

    def _hub_lost(self) -> None:
        if self.hub is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(self.hub)
            self.hub.close()
        self.hub, self.hub_ready = None, False

    def _hub_send(self, data: bytes) -> None:
        self.hub_out += data
        if self.hub is not None and self.hub_ready:  # at once: the node may die any moment
            try:
                del self.hub_out[:self.hub.send(self.hub_out)]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self._hub_lost()
                return
        if self.hub is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.modify(self.hub, selectors.EVENT_READ | selectors.EVENT_WRITE, "hub")

    def _hub_io(self, mask: int) -> None:
        assert self.hub is not None
        if mask & selectors.EVENT_WRITE and self.hub_out:
            try:
                sent = self.hub.send(self.hub_out)
                del self.hub_out[:sent]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self._hub_lost()
                return
        if not self.hub_out:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.modify(self.hub, selectors.EVENT_READ, "hub")
        if mask & selectors.EVENT_READ:
            try:
                data = self.hub.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self._hub_lost()
                return
            self.hub_in += data
            *lines, self.hub_in = self.hub_in.split(b"\n")
            for line in lines:
                self._hub_message(line)

    def _hub_message(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            return
        op = msg.get("op")
        if op == "have":  # the hub's reply to hello: push what it has not had from the file
            have = int(msg.get("off", 0))
            self.hub_ready = True
            if have < self.size:
                with open(self.path, "rb") as f:
                    f.seek(have)
                    data = f.read(self.size - have)
                self._hub_send(f"B {have + len(data)} {len(data)}\n".encode() + data)
            for step in msg.get("gates", []):
                self._open_gate(int(step))
            for rank in self.controls:
                self._hub_send(b"C " + json.dumps({"rank": rank}).encode() + b"\n")
        elif op == "control":  # one message for this node's ranks; answered from a thread
            threading.Thread(target=self._control, args=(msg,), daemon=True,
                             name="faultlab-relay-control").start()
        elif op == "gate":
            self._open_gate(int(msg["step"]))
        elif op == "bye":
            self.stop = True

    def _control(self, msg: dict[str, object]) -> None:
        replies: dict[str, object] = {}
        msgs = msg.get("msgs")
        for rank_text, message in (msgs.items() if isinstance(msgs, dict) else ()):
            replies[rank_text] = self._ask(int(rank_text), message)
        line = b"A " + json.dumps({"id": msg.get("id"), "replies": replies}).encode() + b"\n"
        with self._answers_lock:
            self.answers.append(line)
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _ask(self, rank: int, message: object) -> dict[str, object]:
        where = self.controls.get(rank)
        if where is None:
            return {"ok": False, "unreachable": f"rank {rank} has no control server on "
                                                f"{self.node}"}
        host, port, pid = where
        try:
            reply = json.loads(exchange(host, port, self._secret.decode(),
                                        message if isinstance(message, dict) else {}))
        except (OSError, ValueError) as e:
            return {"ok": False, "unreachable": f"rank {rank}'s agent at {host}:{port} (pid "
                                                f"{pid} on {self.node}): {e}"}
        return reply if isinstance(reply, dict) else {"ok": False, "unreachable": "no reply"}

    def _answered(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_r.recv(4096)
        with self._answers_lock:
            answers, self.answers = self.answers, []
        for line in answers:
            if self.hub is not None:
                self._hub_send(line)

    def _hub_drain(self) -> None:
        if self.hub is None or not self.hub_out:
            return
        with contextlib.suppress(OSError):
            self.hub.setblocking(True)
            self.hub.settimeout(2.0)
            self.hub.sendall(bytes(self.hub_out))


def _start_time(pid: int) -> int | None:
    """``pid``'s start time (clock ticks since boot), None if it is gone or a zombie: the
    pair (pid, start time) names one process, even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


JOB_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
"""The signals a job's processes get as notices: the relay ignores them (``ignore_job_signals``)."""


def ignore_job_signals() -> None:
    """The relay reports the job's reaction to a notice, so the notice must not end it.
    Slurm's preemption (``scancel --signal=TERM``) signals every process of the job's steps,
    the relay among them (a descendant of a rank, or in the step's cgroup): a relay that died
    on it took the ranks' ``preemption_notice`` records and their step-gate wake-up with it,
    and the ranks that started a new one waited for it while the grace time ran out (seen once
    under load: no notice within 5 s, no emergency checkpoint, 4 steps lost). It leaves by its
    own rules (its agent gone, the hub's bye, orphaned), and SIGKILL still ends it."""
    for sig in JOB_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m faultlab.runtime.relay")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--node", required=True)
    parser.add_argument("--watch-pid", type=int, default=None,
                        help="the node's agent: the relay exits when it is gone")
    args = parser.parse_args(argv)
    ignore_job_signals()
    secret = os.environ.get(SECRET_ENV, "")
    if not secret:
        print(f"faultlab relay: {SECRET_ENV} is not set", file=sys.stderr)
        return 2
    hub = os.environ.get(HUB_ENV) if os.environ.get(CHANNEL_ENV) == "socket" else None
    try:
        relay = Relay(args.run_dir, args.node, secret, hub, args.watch_pid)
    except OSError as e:
        if e.errno == 98:  # EADDRINUSE: another rank's relay won the race; it serves the node
            return 0
        raise
    print(f"faultlab relay {args.node}: pid {os.getpid()}, channel "
          f"{'socket to ' + hub if hub else 'file'}, writing {relay.path}", flush=True)
    relay.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
