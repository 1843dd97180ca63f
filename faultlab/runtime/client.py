"""The faultlab side of the control channel: talk to one rank's runtime agent.

    secret = new_secret()    # per run; the job gets it as FAULTLAB_RUNTIME_SECRET
    send(run_dir, 1, secret, {"op": "inject", "fault": {...plan entry...}})
    send(run_dir, 1, secret, {"op": "undo", "id": "delay#1"})

``send`` returns the agent's reply as-is (``{"ok": false, "error": ...}`` included: that is an
answer, and the caller decides what it means). It raises :class:`RuntimeControlError` only when
no answer can be had: no agent address file, a listener whose process is gone, a refused or
timed-out connection, a reply that is not JSON. No torch here: this runs in faultlab's process.
"""

from __future__ import annotations

import ipaddress
import json
import secrets
import socket
from pathlib import Path
from typing import Any

import psutil

from faultlab.errors import RuntimeControlError
from faultlab.runtime.plan import write_plan

__all__ = ["RuntimeControlError", "address_file", "exchange", "new_secret", "read_secret", "send",
           "write_plan"]

_MAX_REPLY_BYTES = 4 * 1024 * 1024



def new_secret() -> str:
    """A fresh per-run secret (256 bits, hex)."""
    return secrets.token_hex(32)


def address_file(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / "runtime" / f"rank{rank}.json"


def send(run_dir: Path, rank: int, secret: str, message: dict[str, Any],
         timeout_s: float = 5.0) -> dict[str, Any]:
    """Send ``message`` (plus ``secret``) to ``rank``'s agent; return its one-line reply."""
    path = address_file(run_dir, rank)
    where = f"rank {rank} of the job in {run_dir}"
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        host, port, pid = str(info["host"]), int(info["port"]), int(info["pid"])
    except FileNotFoundError:
        raise RuntimeControlError(
            f"{where}: no runtime agent is listening ({path} does not exist); the rank has not "
            f"attached faultlab.runtime yet, or runs without FAULTLAB_RUNTIME_SECRET") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RuntimeControlError(f"{where}: unreadable agent address file {path}: "
                                  f"{type(e).__name__}: {e}") from None
    if _is_loopback(host) and not _pid_alive(pid):
        # Only meaningful on this host: a container's pid lives in another namespace.
        raise RuntimeControlError(f"{where}: the agent's process {pid} (from {path}) is gone; "
                                  f"the rank died or is restarting — retry once it is back")
    try:
        line = exchange(host, port, secret, message, timeout_s)
    except TimeoutError:
        raise RuntimeControlError(f"{where}: the agent at {host}:{port} (pid {pid}) did not "
                                  f"answer within {timeout_s} s") from None
    except OSError as e:
        raise RuntimeControlError(f"{where}: cannot reach the agent at {host}:{port} "
                                  f"(pid {pid}): {e.strerror or e}") from None
    try:
        reply = json.loads(line)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        raise RuntimeControlError(f"{where}: the agent at {host}:{port} sent no valid reply "
                                  f"({line[:200]!r})")
    return reply


def exchange(host: str, port: int, secret: str, message: dict[str, Any],
             timeout_s: float = 5.0) -> bytes:
    """One request to the control server at ``host:port`` (``message`` plus ``secret``); its
    reply line, unparsed. Raises OSError (TimeoutError included) when there is none."""
    request = json.dumps({**message, "secret": secret}).encode() + b"\n"
    with socket.create_connection((host, port), timeout=timeout_s) as conn:
        conn.sendall(request)
        return conn.makefile("rb").readline(_MAX_REPLY_BYTES)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def read_secret(run_dir: Path) -> str | None:
    """The control channel's secret of the job in ``run_dir`` (``runtime/secret``, written by
    whoever launched it); None if the job has none."""
    try:
        return (run_dir / "runtime" / "secret").read_text().strip() or None
    except FileNotFoundError:
        return None
