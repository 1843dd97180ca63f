"""A rank's link to its node's relay (``faultlab.runtime.relay``): events out, step gates in.

This is what a rank imports of the relay: the emitter (``faultlab.runtime.events``), the step
gates and the runtime agent reach their node's relay through ``uplink_for``. The relay itself
(the daemon) is never imported into a rank: the first rank of a node that finds none starts it
as ``python -m faultlab.runtime.relay``, a process of its own. Both ends agree on the socket's
name (``socket_name``) and the environment that says which channel the job uses
(``CHANNEL_ENV``, ``SECRET_ENV``); the wire protocol is described in the relay's docstring.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from faultlab.errors import RelayDown
from faultlab.runtime.identity import Identity

if TYPE_CHECKING:
    import subprocess

__all__ = ["CHANNEL_ENV", "SECRET_ENV", "RelayDown", "Uplink", "socket_name", "uplink_for"]

CHANNEL_ENV = "FAULTLAB_CHANNEL"
"""``socket`` or ``file``: which channel the relays use (unset: every process writes its own
events file and polls gate files, as outside the engine)."""
SECRET_ENV = "FAULTLAB_RUNTIME_SECRET"


def socket_name(run_dir: str | os.PathLike[str], node: str) -> bytes:
    """The abstract Unix socket name of ``node``'s relay for the job in ``run_dir`` (one per
    network namespace: a container's is its own; local nodes differ by name)."""
    key = hashlib.sha256(f"{os.fspath(run_dir)}\0{node}".encode()).hexdigest()[:24]
    return f"\0faultlab-relay-{key}".encode()



class Uplink:
    """One process's connection to its node's relay: events out, gates in. Thread-safe."""

    def __init__(self, run_dir: Path, node: str, secret: str, *, rank: int,
                 env: Mapping[str, str] | None = None) -> None:
        self.run_dir, self.node, self.rank = Path(run_dir), node, rank
        self._secret = secret
        self._env = dict(os.environ if env is None else env)
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()  # writes
        self._rlock = threading.Lock()  # reads (a gate wait)
        self._buf = b""
        self._opened: set[int] = set()
        self.spawned: subprocess.Popen[bytes] | None = None
        self.down = False
        """The relay could not be reached: the caller falls back to its own file."""

    def _connect(self) -> socket.socket:
        name = socket_name(self.run_dir, self.node)
        deadline = time.monotonic() + 10.0
        spawned = False
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(name)
                hello = {"secret": self._secret, "rank": self.rank, "pid": os.getpid()}
                s.sendall(b"H " + json.dumps(hello).encode() + b"\n")
                return s
            except OSError:
                s.close()
                if not spawned:
                    self._spawn()
                    spawned = True
                if time.monotonic() > deadline:
                    raise RelayDown(f"the relay of node {self.node} did not come up within "
                                    f"10 s (its log: {self._log_path()})") from None
                time.sleep(0.02)

    def _log_path(self) -> Path:
        return self.run_dir / "logs" / f"relay-{self.node}.log"

    def _spawn(self) -> None:
        import subprocess  # only the rank that starts its node's relay pays for it

        env = {k: v for k, v in self._env.items() if k != "FAULTLAB_BOOTSTRAP"}
        log = self._log_path()
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            self.spawned = subprocess.Popen(
                [sys.executable, "-m", "faultlab.runtime.relay", "--run-dir",
                 str(self.run_dir), "--node", self.node, "--watch-pid", str(os.getppid())],
                env=env, stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
        threading.Thread(target=self.spawned.wait, daemon=True,
                         name="faultlab-relay-reaper").start()

    def _send(self, data: bytes) -> None:
        with self._lock:
            for attempt in (0, 1):
                try:
                    if self._sock is None:
                        self._sock = self._connect()
                    self._sock.sendall(data)
                    return
                except RelayDown:
                    self.down = True
                    raise
                except OSError:
                    with contextlib.suppress(OSError):
                        if self._sock is not None:
                            self._sock.close()
                    self._sock = None  # the relay died: the next try starts a new one
                    if attempt:
                        self.down = True
                        raise RelayDown(f"the relay of node {self.node} is gone") from None

    def register_control(self, host: str, port: int) -> None:
        """Tell the relay where this process's control server listens (live faults come
        through the relay, one message per node)."""
        info = {"rank": self.rank, "host": host, "port": port, "pid": os.getpid()}
        self._send(b"C " + json.dumps(info).encode() + b"\n")

    def emit_line(self, line: str) -> None:
        """Send one record (a JSON line with its newline)."""
        self._send(b"E " + line.encode())

    def wait_gate(self, step: int, timeout_s: float, beat: Callable[[], None] | None,
                  beat_every_s: float = 0.5) -> tuple[float, bool]:
        """Wait until the relay says gate ``step`` is open; (seconds, opened)."""
        t0 = time.monotonic()
        if step in self._opened:
            return 0.0, True
        self._send(f"G {step}\n".encode())
        with self._rlock:
            while step not in self._opened:
                now = time.monotonic()
                if now - t0 >= timeout_s:
                    return now - t0, False
                sock = self._sock
                if sock is None:
                    self._send(f"G {step}\n".encode())  # reconnected: ask again
                    continue
                # select, not a timeout on the socket: emits from other threads share it
                wait = min(beat_every_s, max(0.01, timeout_s - (now - t0)))
                try:
                    ready = select.select([sock], [], [], wait)[0]
                    data = sock.recv(4096) if ready else None
                except OSError:
                    data = b""
                if data is None:
                    if beat is not None:
                        beat()
                    continue
                if not data:  # the relay died: reconnect (a new relay) and ask again
                    with self._lock:
                        with contextlib.suppress(OSError):
                            sock.close()
                        if self._sock is sock:
                            self._sock = None
                    self._send(f"G {step}\n".encode())
                    continue
                self._buf += data
                *lines, self._buf = self._buf.split(b"\n")
                for line in lines:
                    if line.startswith(b"G "):
                        with contextlib.suppress(ValueError):
                            self._opened.add(int(line[2:]))
        return time.monotonic() - t0, True

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    self._sock.close()
                self._sock = None


_UPLINKS: dict[tuple[str, str], Uplink] = {}
_UPLINKS_LOCK = threading.Lock()


def uplink_for(run_dir: Path, env: Mapping[str, str] | None = None) -> Uplink | None:
    """This process's uplink for the job in ``run_dir``, or None when the job has no relay
    channel (``FAULTLAB_CHANNEL`` unset, or the run dir is another job's, or no secret)."""
    env = os.environ if env is None else env
    if env.get(CHANNEL_ENV) not in ("socket", "file") or not env.get(SECRET_ENV):
        return None
    if not env.get("FAULTLAB_RUN_DIR") or \
            os.path.abspath(env["FAULTLAB_RUN_DIR"]) != os.path.abspath(run_dir):
        return None
    ident = Identity.from_env(env)
    key = (os.fspath(run_dir), ident.node)
    with _UPLINKS_LOCK:
        up = _UPLINKS.get(key)
        if up is None or up.down:
            up = _UPLINKS[key] = Uplink(Path(env["FAULTLAB_RUN_DIR"]), ident.node,
                                        env[SECRET_ENV], rank=ident.rank, env=env)
        return up


def _forget_uplinks_after_fork() -> None:
    _UPLINKS.clear()  # a forked child (a dataloader worker) opens its own connection


os.register_at_fork(after_in_child=_forget_uplinks_after_fork)
