"""The live control channel: each rank's agent listens for faults decided during the run.

Time triggers and Chaos Toolkit actions decide *while* the job runs, so the agent serves a tiny
protocol on an ephemeral TCP port: one JSON line in, one JSON line out, then the connection
closes. The port is published in ``RUN_DIR/runtime/rank{rank}.json`` (written atomically, so a
reader never sees half a file), which is how ``faultlab.runtime.client.send`` finds it.

Why it is safe enough to run inside a training job:

- it binds loopback (default) or the job's own interface, never a wildcard address
  (``@hostname``: the address the node's hostname resolves to, e.g. a container's own);
- every request must carry the run's secret (``FAULTLAB_RUNTIME_SECRET``), compared in constant
  time; a wrong secret gets ``{"ok": false, "error": "bad secret"}`` and nothing else happens;
- it runs in daemon threads, one per connection, with a read timeout, so a stuck client cannot
  block an ``undo`` and the listener never keeps the process alive;
- a request is at most 64 KiB; anything malformed is answered with an error, never raised.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["BAD_SECRET", "MAX_REQUEST_BYTES", "WILDCARDS", "ControlServer", "write_json_atomic"]

MAX_REQUEST_BYTES = 64 * 1024
BAD_SECRET = "bad secret"
WILDCARDS = ("", "0.0.0.0", "::", "*")
"""Addresses that would listen on every interface: refused by whatever accepts connections."""

Handler = Callable[[dict[str, Any]], dict[str, Any]]


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` via a temporary file and rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj) + "\n", encoding="utf-8")
    os.replace(tmp, path)


class ControlServer:
    """Listens on ``host``:ephemeral and answers each request with ``handler(request)``."""

    def __init__(self, *, host: str, secret: str, handler: Handler, info_path: Path,
                 info: dict[str, Any]) -> None:
        if host.strip() in WILDCARDS:
            raise ValueError(f"FAULTLAB_RUNTIME_HOST={host!r} would listen on every interface; "
                             f"use 127.0.0.1 (the default) or the job's own interface address")
        if not secret:
            raise ValueError("the control channel needs a non-empty FAULTLAB_RUNTIME_SECRET")
        if host.strip() == "@hostname":  # a container node: its own address on its network
            host = socket.gethostbyname(socket.gethostname())
        self._secret = secret.encode()
        self._handler = handler
        self.info_path = info_path
        self._sock = socket.create_server((host, 0), family=_family(host))
        self._sock.settimeout(None)
        self.host, self.port = host, int(self._sock.getsockname()[1])
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="faultlab-runtime-control",
                                        daemon=True)
        self._thread.start()
        write_json_atomic(info_path, {**info, "host": self.host, "port": self.port,
                                      "pid": os.getpid()})

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._sock.close()
        # Remove the address file only if it is still ours (a restarted process may own it).
        try:
            if json.loads(self.info_path.read_text(encoding="utf-8")).get("pid") == os.getpid():
                self.info_path.unlink()
        except (OSError, ValueError):
            pass

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _addr = self._sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._answer, args=(conn,), daemon=True,
                             name="faultlab-runtime-request").start()

    def _answer(self, conn: socket.socket) -> None:
        # One failed request must never kill the listener nor the training process.
        with conn:
            conn.settimeout(5.0)
            try:
                line = conn.makefile("rb").readline(MAX_REQUEST_BYTES + 1)
                reply = self._reply(line)
                conn.sendall(json.dumps(reply, default=str).encode() + b"\n")
            except OSError:
                pass

    def _reply(self, line: bytes) -> dict[str, Any]:
        if len(line) > MAX_REQUEST_BYTES:
            return {"ok": False, "error": f"request longer than {MAX_REQUEST_BYTES} bytes"}
        try:
            request = json.loads(line)
        except ValueError:
            return {"ok": False, "error": "request is not one line of JSON"}
        if not isinstance(request, dict):
            return {"ok": False, "error": "request must be a JSON object"}
        secret = request.pop("secret", None)
        if not isinstance(secret, str) or not hmac.compare_digest(secret.encode(),
                                                                  self._secret):
            return {"ok": False, "error": BAD_SECRET}
        try:
            return self._handler(request)
        except Exception as e:  # the handler's bug must not take the listener down
            return {"ok": False, "error": f"{type(e).__name__}: {e}"}


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
