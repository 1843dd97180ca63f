"""The notice board: what has been announced to one fake node, shared by its request threads.

Every provider renders its own documents from the same few facts (a preemption with its
deadline, a rebalance recommendation, scheduled maintenance, acknowledgements), so the
provider modules hold no state of their own. One lock guards everything; a Condition on it
wakes the GCE ``wait_for_change`` requests whenever anything changes or the server stops.
"""

from __future__ import annotations

import collections
import hashlib
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

Provider = Literal["aws", "gce", "azure"]
PROVIDERS: tuple[Provider, ...] = ("aws", "gce", "azure")
MaintenanceKind = Literal["migrate", "reboot"]
MAINTENANCE_KINDS: tuple[MaintenanceKind, ...] = ("migrate", "reboot")

# How much warning each cloud gives before it takes a spot/preemptible VM back.
DEFAULT_NOTICE_S: dict[str, float] = {"aws": 120.0, "gce": 30.0, "azure": 30.0}

NUM_RECENT_REQUESTS = 256
"""How many requests ``state()["recent_requests"]`` keeps (oldest dropped first)."""


@dataclass(frozen=True, slots=True)
class Request:
    """One parsed HTTP request, as the provider modules see it."""

    method: str
    path: str
    """The URL path without the query string, percent-decoding not applied."""
    query: dict[str, str]
    """The first value of each query parameter."""
    headers: dict[str, str]
    """Header names lower-cased."""
    body: bytes


@dataclass(slots=True)
class Response:
    status: int
    body: bytes | str = b""
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "text/plain"

    def body_bytes(self) -> bytes:
        return self.body.encode() if isinstance(self.body, str) else self.body


@dataclass(frozen=True, slots=True)
class Preemption:
    deadline: float
    """When the node goes away, as ``time.time()``."""
    action: str
    """AWS ``instance-action``: terminate, stop or hibernate."""
    announced_at: float
    event_id: str


@dataclass(frozen=True, slots=True)
class Maintenance:
    kind: MaintenanceKind
    not_before: float
    not_after: float
    announced_at: float
    event_id: str


def stable_hex(*parts: str, num_chars: int) -> str:
    """A deterministic hex id, so a node keeps its instance id across restarts of the fake."""
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:num_chars]


class NoticeBoard:
    """Thread-safe state of one fake metadata endpoint."""

    def __init__(self, provider: Provider, node: str) -> None:
        self.provider = provider
        self.node = node
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.stopping = False
        self.preemption: Preemption | None = None
        self.rebalance_at: float | None = None
        self.maintenance: list[Maintenance] = []
        self.acknowledged: dict[str, float] = {}
        """Event id → when a StartRequests acknowledgement for it arrived (Azure)."""
        self.incarnation = 1
        """Azure's DocumentIncarnation: bumped on every change of the scheduled events."""
        self._tokens: dict[str, float] = {}  # IMDSv2 token -> expiry (time.monotonic())
        self._num_tokens_issued = 0
        self._num_waiting = 0  # requests blocked in wait_for_change now
        self._requests_by_path: collections.Counter[str] = collections.Counter()
        self._recent: collections.deque[dict[str, Any]] = collections.deque(
            maxlen=NUM_RECENT_REQUESTS)

    # --- changes (callers hold no lock) ---------------------------------------------------

    def _change(self, mutate: Callable[[], None]) -> None:
        with self.changed:
            mutate()
            self.incarnation += 1
            self.changed.notify_all()

    def announce_preemption(self, notice_s: float, action: str) -> Preemption:
        now = time.time()
        p = Preemption(deadline=now + notice_s, action=action, announced_at=now,
                       event_id=str(uuid.uuid4()).upper())

        def mutate() -> None:
            self.preemption = p
        self._change(mutate)
        return p

    def announce_rebalance(self) -> float:
        now = time.time()

        def mutate() -> None:
            self.rebalance_at = now
        self._change(mutate)
        return now

    def announce_maintenance(self, kind: MaintenanceKind, notice_s: float,
                             duration_s: float) -> Maintenance:
        now = time.time()
        m = Maintenance(kind=kind, not_before=now + notice_s,
                        not_after=now + notice_s + duration_s, announced_at=now,
                        event_id=str(uuid.uuid4()).upper())
        self._change(lambda: self.maintenance.append(m))
        return m

    def clear(self) -> None:
        def mutate() -> None:
            self.preemption = None
            self.rebalance_at = None
            self.maintenance.clear()
            self.acknowledged.clear()
        self._change(mutate)

    def acknowledge(self, event_ids: list[str]) -> list[str]:
        """Record StartRequests; returns the ids that are not scheduled (nothing is recorded
        then, so a bad request changes nothing)."""
        with self.changed:
            known = {m.event_id for m in self.maintenance}
            if self.preemption is not None:
                known.add(self.preemption.event_id)
            unknown = [e for e in event_ids if e not in known]
            if unknown:
                return unknown
            now = time.time()
            for e in event_ids:
                self.acknowledged.setdefault(e, now)
            self.incarnation += 1
            self.changed.notify_all()
            return []

    def stop(self) -> None:
        with self.changed:
            self.stopping = True
            self.changed.notify_all()

    # --- IMDSv2 tokens ---------------------------------------------------------------------

    def issue_token(self, ttl_s: int) -> str:
        token = secrets.token_urlsafe(42)
        now = time.monotonic()
        with self.lock:
            # Drop expired tokens so a client that asks for one per request cannot grow this.
            for t in [t for t, expiry in self._tokens.items() if expiry <= now]:
                del self._tokens[t]
            self._tokens[token] = now + ttl_s
            self._num_tokens_issued += 1
        return token

    def token_valid(self, token: str) -> bool:
        with self.lock:
            expiry = self._tokens.get(token)
        return expiry is not None and time.monotonic() < expiry

    # --- GCE wait_for_change -----------------------------------------------------------------

    def wait_for_change(self, render: Callable[[], str | None], reference_etag: str | None,
                        timeout_s: float | None) -> str | None:
        """Block until ``render()``'s ETag differs from ``reference_etag`` (taken from the
        current value when None), the timeout passes or the server stops; return the value."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self.changed:
            if reference_etag is None:
                reference_etag = etag(render())
            self._num_waiting += 1
            try:
                while etag(render()) == reference_etag and not self.stopping:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        break
                    self.changed.wait(remaining)
            finally:
                self._num_waiting -= 1
            return render()

    # --- bookkeeping -----------------------------------------------------------------------

    def record_request(self, method: str, path: str, status: int) -> None:
        with self.lock:
            self._requests_by_path[path] += 1
            self._recent.append({"t": time.time(), "method": method, "path": path,
                                 "status": status})

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            p = self.preemption
            return {
                "provider": self.provider,
                "node": self.node,
                "preemption": None if p is None else {
                    "deadline": p.deadline, "action": p.action,
                    "announced_at": p.announced_at, "event_id": p.event_id},
                "rebalance": None if self.rebalance_at is None else {
                    "notice_time": self.rebalance_at},
                "maintenance": [{"kind": m.kind, "not_before": m.not_before,
                                 "not_after": m.not_after, "announced_at": m.announced_at,
                                 "event_id": m.event_id} for m in self.maintenance],
                "acknowledged": [{"event_id": e, "t": t} for e, t in self.acknowledged.items()],
                "document_incarnation": self.incarnation,
                "num_tokens_issued": self._num_tokens_issued,
                "num_requests": sum(self._requests_by_path.values()),
                "num_waiting": self._num_waiting,
                "requests_by_path": dict(self._requests_by_path),
                "recent_requests": list(self._recent),
            }


def etag(value: str | None) -> str:
    """GCE-style ETag: a hash of the content, so an unchanged value keeps its tag."""
    return hashlib.sha256(b"\0" if value is None else value.encode()).hexdigest()[:16]
