"""``MetadataServer``: one fake cloud metadata endpoint for one node, on a background thread.

The HTTP side is the standard library's ``ThreadingHTTPServer`` speaking HTTP/1.1 with
``Content-Length`` (keep-alive works, as real clients expect). Nothing is written to stderr;
requests are counted per path and the last ``NUM_RECENT_REQUESTS`` are kept for ``state()``.

Control endpoints, for standalone and staging use, all needing ``X-Faultlab-Token``::

    POST /_faultlab/preempt       {"notice_s": 120, "action": "terminate"}  (both optional)
    POST /_faultlab/rebalance     (AWS only)
    POST /_faultlab/maintenance   {"kind": "migrate", "notice_s": 300, "duration_s": 600}
    POST /_faultlab/clear
    GET  /_faultlab/state

They answer JSON; a missing or wrong token is 401, a body that is not a JSON object or has a
bad value is 400 with a message naming the field.
"""

from __future__ import annotations

import hmac
import json
import math
import secrets
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast
from urllib.parse import parse_qsl, urlsplit

from faultlab.metadata import aws, azure, gce
from faultlab.metadata._board import (
    DEFAULT_NOTICE_S,
    MAINTENANCE_KINDS,
    PROVIDERS,
    MaintenanceKind,
    NoticeBoard,
    Provider,
    Request,
    Response,
)

CONTROL_PREFIX = "/_faultlab/"
CONTROL_TOKEN_HEADER = "X-Faultlab-Token"
SPOT_ACTIONS = ("terminate", "stop", "hibernate")
MAX_BODY_BYTES = 1 << 20
_SERVER_HEADER = {"aws": "EC2ws", "gce": "Metadata Server for VM", "azure": "Microsoft-IIS/10.0"}


class MetadataServer:
    """A fake metadata endpoint of one cloud (``provider``) for one node.

    ``with MetadataServer("aws") as md:`` starts it on a free loopback port; point the node's
    clients at it with ``md.env()``, then ``md.announce_preemption(notice_s=120)``.
    """

    def __init__(self, provider: str, host: str = "127.0.0.1", port: int = 0, *,
                 node: str = "node0", imds_v2_required: bool = False) -> None:
        if provider not in PROVIDERS:
            raise ValueError(f"provider: {provider!r} is not one of {', '.join(PROVIDERS)}")
        if not 0 <= port <= 65535:
            raise ValueError(f"port: {port!r} is outside 0-65535 (0 picks a free port)")
        if imds_v2_required and provider != "aws":
            raise ValueError(f"imds_v2_required: IMDSv2 is AWS's; provider is {provider!r}")
        self.provider = provider
        self.host = host
        self.node = node
        self.imds_v2_required = imds_v2_required
        self.control_token = secrets.token_urlsafe(24)
        """The value control requests must send in ``X-Faultlab-Token``."""
        self._requested_port = port
        self._board = NoticeBoard(cast(Provider, provider), node)
        self._httpd: _HTTPServer | None = None
        self._serve_thread: threading.Thread | None = None
        self._stop_lock = threading.Lock()
        self._stopped = False

    # --- life cycle ------------------------------------------------------------------------

    def start(self) -> MetadataServer:
        if self._httpd is not None or self._stopped:
            raise RuntimeError("a MetadataServer starts once; create a new one")
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        self._httpd = _HTTPServer((self.host, self._requested_port), self, family)
        self._serve_thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1},
            name=f"faultlab-metadata-{self.provider}-{self.port}", daemon=True)
        self._serve_thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and free the port; answers every waiting ``wait_for_change`` first.
        Safe to call twice, or on a server that never started."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
        self._board.stop()
        httpd = self._httpd
        if httpd is None:
            return
        httpd.shutdown()
        if self._serve_thread is not None:
            self._serve_thread.join()
        httpd.close_connections_and_join(timeout_s=5.0)
        httpd.server_close()

    def __enter__(self) -> MetadataServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("the port is known once start() has bound it")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """``http://host:port`` (no trailing slash)."""
        return f"http://{self._host_port()}"

    def _host_port(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def env(self) -> dict[str, str]:
        """Environment variables that point this provider's clients here.

        AWS: ``AWS_EC2_METADATA_SERVICE_ENDPOINT`` (botocore and the other AWS SDKs).
        GCE: ``GCE_METADATA_HOST`` and ``GCE_METADATA_IP`` (google-auth's names, host:port).
        Azure: ``FAULTLAB_AZURE_METADATA_ENDPOINT`` — Azure's clients have no standard
        override, so a trainer reads this one and falls back to ``http://169.254.169.254``.
        """
        if self.provider == "aws":
            return {"AWS_EC2_METADATA_SERVICE_ENDPOINT": self.url + "/"}
        if self.provider == "gce":
            return {"GCE_METADATA_HOST": self._host_port(), "GCE_METADATA_IP": self._host_port()}
        return {"FAULTLAB_AZURE_METADATA_ENDPOINT": self.url}

    # --- notices ---------------------------------------------------------------------------

    def announce_preemption(self, notice_s: float | None = None, *,
                            action: str = "terminate") -> float:
        """Announce that the node goes away in ``notice_s`` seconds (default: the cloud's own
        notice, 120 s AWS, 30 s GCE and Azure); returns the deadline as ``time.time()``.

        AWS: ``spot/instance-action`` (with ``action``) and, for terminate,
        ``spot/termination-time``. GCE: ``preempted`` TRUE and ``maintenance-event``
        TERMINATE_ON_HOST_MAINTENANCE. Azure: a ``Preempt`` event with ``NotBefore`` the deadline.
        """
        if notice_s is None:
            notice_s = DEFAULT_NOTICE_S[self.provider]
        _check_seconds("notice_s", notice_s)
        if action not in SPOT_ACTIONS:
            raise ValueError(f"action: {action!r} is not one of {', '.join(SPOT_ACTIONS)}")
        return self._board.announce_preemption(float(notice_s), action).deadline

    def announce_rebalance(self) -> float:
        """AWS only: an EC2 rebalance recommendation (``events/recommendations/rebalance``);
        returns its notice time. GCE and Azure have no such signal: ``ValueError``."""
        if self.provider != "aws":
            raise ValueError(f"rebalance recommendations are AWS's; this server is "
                             f"{self.provider!r} (use announce_maintenance or "
                             f"announce_preemption)")
        return self._board.announce_rebalance()

    def announce_maintenance(self, notice_s: float, *, kind: str = "migrate",
                             duration_s: float = 600.0) -> float:
        """Schedule host maintenance starting in ``notice_s`` seconds and lasting
        ``duration_s``; returns its start as ``time.time()``.

        ``kind="migrate"``: AWS ``system-maintenance``, GCE MIGRATE_ON_HOST_MAINTENANCE, Azure
        ``Freeze``. ``kind="reboot"``: AWS ``system-reboot``, GCE
        TERMINATE_ON_HOST_MAINTENANCE, Azure ``Reboot``.
        """
        _check_seconds("notice_s", notice_s)
        _check_seconds("duration_s", duration_s)
        if kind not in MAINTENANCE_KINDS:
            raise ValueError(f"kind: {kind!r} is not one of {', '.join(MAINTENANCE_KINDS)}")
        return self._board.announce_maintenance(
            cast(MaintenanceKind, kind), float(notice_s), float(duration_s)).not_before

    def clear(self) -> None:
        """Withdraw every notice and acknowledgement: the node is back to normal."""
        self._board.clear()

    def state(self) -> dict[str, Any]:
        """What is announced, acknowledgements, and the requests seen (JSON-serialisable):
        ``preemption``, ``rebalance``, ``maintenance``, ``acknowledged``,
        ``document_incarnation``, ``num_tokens_issued``, ``num_requests``, ``num_waiting``
        (requests blocked in GCE's ``wait_for_change`` now), ``requests_by_path`` (path →
        count) and ``recent_requests``."""
        snap = self._board.snapshot()
        snap["url"] = self.url if self._httpd is not None else None
        snap["imds_v2_required"] = self.imds_v2_required
        return snap

    def __repr__(self) -> str:
        where = self.url if self._httpd is not None else "not started"
        return f"MetadataServer({self.provider!r}, node={self.node!r}, {where})"

    # --- request handling (called from handler threads) -------------------------------------

    def _handle(self, req: Request) -> Response:
        if req.path.startswith(CONTROL_PREFIX):
            return self._control(req)
        if self.provider == "aws":
            return aws.handle(self._board, req, imds_v2_required=self.imds_v2_required)
        if self.provider == "gce":
            return gce.handle(self._board, req)
        return azure.handle(self._board, req)

    def _control(self, req: Request) -> Response:
        sent = req.headers.get(CONTROL_TOKEN_HEADER.lower(), "")
        if not hmac.compare_digest(sent.encode(), self.control_token.encode()):
            return _json(401, {"error": f"missing or wrong {CONTROL_TOKEN_HEADER} header (the "
                                        f"token is printed by `faultlab metadata serve`)"})
        action = req.path[len(CONTROL_PREFIX):].rstrip("/")
        if action == "state":
            if req.method != "GET":
                return _json(405, {"error": "use GET for /_faultlab/state"})
            return _json(200, self.state())
        if action not in ("preempt", "rebalance", "maintenance", "clear"):
            return _json(404, {"error": f"no control endpoint {req.path!r}; valid: preempt, "
                                        f"rebalance, maintenance, clear, state"})
        if req.method != "POST":
            return _json(405, {"error": f"use POST for {req.path}"})
        try:
            args = json.loads(req.body) if req.body.strip() else {}
        except (ValueError, UnicodeDecodeError) as e:
            return _json(400, {"error": f"{req.path}: the body is not JSON ({e})"})
        if not isinstance(args, dict):
            return _json(400, {"error": f"{req.path}: the body must be a JSON object, got "
                                        f"{args!r}"})
        allowed = {"preempt": {"notice_s", "action"}, "rebalance": set(),
                   "maintenance": {"kind", "notice_s", "duration_s"}, "clear": set()}[action]
        if set(args) - allowed:
            return _json(400, {"error": f"{req.path}: unknown field(s) "
                                        f"{sorted(set(args) - allowed)}; valid: "
                                        f"{sorted(allowed) or 'none'}"})
        try:
            if action == "preempt":
                return _json(200, {"deadline": self.announce_preemption(**args)})
            if action == "rebalance":
                return _json(200, {"notice_time": self.announce_rebalance()})
            if action == "maintenance":
                args.setdefault("notice_s", 300.0)
                return _json(200, {"not_before": self.announce_maintenance(**args)})
            self.clear()
            return _json(200, {"cleared": True})
        except (TypeError, ValueError) as e:
            return _json(400, {"error": f"{req.path}: {e}"})


def _check_seconds(name: str, value: object) -> None:
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or value < 0):
        raise ValueError(f"{name}: {value!r} is not a number of seconds >= 0")


def _json(status: int, doc: Any) -> Response:
    return Response(status, json.dumps(doc), content_type="application/json")


class _HTTPServer(ThreadingHTTPServer):
    """Tracks its connections and handler threads so that ``stop()`` can end them."""

    daemon_threads = True
    block_on_close = False  # we join our own threads, with a bound

    def __init__(self, address: tuple[str, int], app: MetadataServer, family: int) -> None:
        self.address_family = family
        self.app = app
        self._lock = threading.Lock()
        self._open: dict[threading.Thread, socket.socket] = {}
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        t = threading.Thread(target=self.process_request_thread,
                             args=(request, client_address), daemon=True,
                             name=f"faultlab-metadata-conn-{client_address}")
        with self._lock:
            self._open[t] = request
        t.start()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._lock:
                self._open.pop(threading.current_thread(), None)

    def close_connections_and_join(self, timeout_s: float) -> None:
        with self._lock:
            open_ = dict(self._open)
        for sock in open_.values():
            # Read side only: a handler still writing a woken wait_for_change answer finishes
            # it; one idling on keep-alive reads EOF and returns.
            try:
                sock.shutdown(socket.SHUT_RD)
            except OSError:
                pass
        for t in open_:
            t.join(timeout_s)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-answer is normal for a metadata poller; stay quiet.
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    sys_version = ""
    timeout = 60  # an idle keep-alive connection gives its thread back after this
    server: _HTTPServer

    def version_string(self) -> str:
        return _SERVER_HEADER[self.server.app.provider]

    def log_message(self, format: str, *args: Any) -> None:
        pass  # requests are recorded in state() instead of printed

    def do_GET(self) -> None:
        self._dispatch()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = do_GET

    def _dispatch(self) -> None:
        app = self.server.app
        split = urlsplit(self.path)
        length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            resp = Response(411, "send Content-Length, not chunked\n")
            body = b""
        elif length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            resp = Response(413, f"Content-Length {length!r} is not 0-{MAX_BODY_BYTES}\n")
            body = b""
        else:
            body = self.rfile.read(int(length)) if length else b""
            resp = None
        if resp is None:
            query: dict[str, str] = {}
            for k, v in parse_qsl(split.query, keep_blank_values=True):
                query.setdefault(k, v)
            req = Request(method=self.command, path=split.path, query=query,
                          headers={k.lower(): v for k, v in self.headers.items()}, body=body)
            try:
                resp = app._handle(req)
            except Exception as e:  # a bug here must answer 500, not kill the connection
                resp = Response(500, f"faultlab metadata fake: {type(e).__name__}: {e}\n")
        else:
            self.close_connection = True
        app._board.record_request(self.command, split.path, resp.status)
        payload = resp.body_bytes()
        self.send_response(resp.status)
        self.send_header("Content-Type", resp.content_type)
        self.send_header("Content-Length", str(len(payload)))
        for name, value in resp.headers.items():
            self.send_header(name, value)
        if app._board.stopping:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)
