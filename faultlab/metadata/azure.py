"""Azure Instance Metadata Service: scheduled events (how a Spot VM learns of its eviction).

Served paths (header ``Metadata: true`` and ``?api-version=YYYY-MM-DD`` required, else 400;
``X-Forwarded-For`` is refused with 400 as Azure does)::

    GET  /metadata/scheduledevents   {"DocumentIncarnation": N, "Events": [...]}
    POST /metadata/scheduledevents   {"StartRequests": [{"EventId": "..."}]} acknowledges
    GET  /metadata/instance          a minimal {"compute": {...}, "network": {...}} document

An announced preemption is a ``Preempt`` event; maintenance is ``Freeze`` (a live migration's
pause) or ``Reboot``. ``NotBefore`` is RFC 1123 (``Mon, 19 Sep 2016 18:29:47 GMT``).
Acknowledging an event records it and turns its ``EventStatus`` from ``Scheduled`` to
``Started``; an unknown ``EventId`` is a 400 and records nothing. ``DocumentIncarnation`` goes
up by one on every change of the document.
"""

from __future__ import annotations

import json
import re
import uuid
from email.utils import formatdate
from typing import Any

from faultlab.metadata._board import NoticeBoard, Request, Response, stable_hex

SCHEDULED_EVENTS_PATH = "/metadata/scheduledevents"
INSTANCE_PATH = "/metadata/instance"
LOCATION = "eastus"
VM_SIZE = "Standard_ND96isr_H100_v5"
_JSON = "application/json; charset=utf-8"


def rfc1123(t: float) -> str:
    return formatdate(int(t), usegmt=True)


def _error(status: int, message: str) -> Response:
    return Response(status, json.dumps({"error": message}), content_type=_JSON)


def _events(board: NoticeBoard) -> list[dict[str, Any]]:
    """Caller holds ``board.lock``."""
    node = board.node
    events: list[dict[str, Any]] = []

    def event(event_id: str, event_type: str, not_before: float, duration_s: int,
              description: str) -> dict[str, Any]:
        return {"EventId": event_id, "EventType": event_type, "ResourceType": "VirtualMachine",
                "Resources": [node],
                "EventStatus": "Started" if event_id in board.acknowledged else "Scheduled",
                "NotBefore": rfc1123(not_before), "Description": description,
                "EventSource": "Platform", "DurationInSeconds": duration_s}

    p = board.preemption
    if p is not None:
        events.append(event(p.event_id, "Preempt", p.deadline, -1,
                            "Virtual machine is being evicted from Azure Spot capacity."))
    for m in board.maintenance:
        if m.kind == "migrate":
            events.append(event(m.event_id, "Freeze", m.not_before,
                                int(m.not_after - m.not_before),
                                "Host server is undergoing maintenance; the virtual machine "
                                "will be paused."))
        else:
            events.append(event(m.event_id, "Reboot", m.not_before, -1,
                                "Virtual machine is going to be restarted as requested by "
                                "host maintenance."))
    return events


def _instance_document(board: NoticeBoard) -> dict[str, Any]:
    node = board.node
    return {
        "compute": {
            "azEnvironment": "AzurePublicCloud", "location": LOCATION, "name": node,
            "osType": "Linux", "priority": "Spot", "provider": "Microsoft.Compute",
            "resourceGroupName": "faultlab",
            "subscriptionId": str(uuid.UUID(stable_hex("subscription", num_chars=32))),
            "vmId": str(uuid.UUID(stable_hex("azure", node, num_chars=32))),
            "vmScaleSetName": "", "vmSize": VM_SIZE, "zone": "1",
        },
        "network": {"interface": []},
    }


def handle(board: NoticeBoard, req: Request) -> Response:
    if "x-forwarded-for" in req.headers:
        return _error(400, "Bad request. X-Forwarded-For header is not allowed.")
    if req.headers.get("metadata", "").lower() != "true":
        return _error(400, "Bad request. Required metadata header not specified")
    version = req.query.get("api-version")
    if version is None or not re.fullmatch(r"\d{4}-\d{2}-\d{2}", version):
        return _error(400, "Bad request. api-version was not specified in the request, or is "
                           f"not a date like 2020-07-01 (got {version!r})")
    path = req.path.rstrip("/")
    if path == SCHEDULED_EVENTS_PATH:
        if req.method == "GET":
            with board.lock:
                body = {"DocumentIncarnation": board.incarnation, "Events": _events(board)}
            return Response(200, json.dumps(body), content_type=_JSON)
        if req.method == "POST":
            return _start_requests(board, req.body)
        return Response(405, "", headers={"Allow": "GET, POST"})
    if path == INSTANCE_PATH or path.startswith(INSTANCE_PATH + "/"):
        if req.method != "GET":
            return Response(405, "", headers={"Allow": "GET"})
        node: Any = _instance_document(board)
        for part in [p for p in path[len(INSTANCE_PATH):].split("/") if p]:
            if not isinstance(node, dict) or part not in node:
                return _error(404, "Not found")
            node = node[part]
        if isinstance(node, dict | list):
            return Response(200, json.dumps(node), content_type=_JSON)
        return Response(200, str(node))
    return _error(404, "Not found")


def _start_requests(board: NoticeBoard, body: bytes) -> Response:
    try:
        doc = json.loads(body or b"null")
    except (ValueError, UnicodeDecodeError) as e:
        return _error(400, f"Bad request. The body is not JSON: {e}")
    requests = doc.get("StartRequests") if isinstance(doc, dict) else None
    if (not isinstance(requests, list)
            or not all(isinstance(r, dict) and isinstance(r.get("EventId"), str)
                       for r in requests)):
        return _error(400, 'Bad request. Expected {"StartRequests": [{"EventId": "..."}]}')
    unknown = board.acknowledge([r["EventId"] for r in requests])
    if unknown:
        return _error(400, f"Bad request. No scheduled event has EventId {unknown[0]!r}")
    return Response(200, "", content_type=_JSON)
