"""Google Compute Engine metadata server, the part preemptible/spot VMs watch.

Served paths (``GET``, header ``Metadata-Flavor: Google`` required, else 403)::

    /computeMetadata/v1/                         directory listing (dirs end in "/")
    /computeMetadata/v1/instance/id, name, hostname, zone, machine-type
    /computeMetadata/v1/instance/preempted       FALSE, TRUE once a preemption is announced
    /computeMetadata/v1/instance/maintenance-event
                        NONE | MIGRATE_ON_HOST_MAINTENANCE | TERMINATE_ON_HOST_MAINTENANCE
    /computeMetadata/v1/instance/scheduling/preemptible, provisioning-model, ...
    /computeMetadata/v1/project/project-id, numeric-project-id

Every answer carries ``Metadata-Flavor: Google`` and, for values, an ``ETag`` (a hash of the
content). ``?wait_for_change=true`` on a value blocks until it changes: with ``last_etag=E``
it answers at once when the current ETag is not E; ``timeout_sec=N`` bounds the wait and then
answers the current value; stopping the server answers every waiter. Requests carrying
``X-Forwarded-For`` are refused with 403, as GCE does.

GCE gives no deadline with a preemption (the VM has about 30 s once ``preempted`` turns
TRUE), so ``announce_preemption`` flips ``preempted`` at once and also reports
``TERMINATE_ON_HOST_MAINTENANCE`` for clients that only watch ``maintenance-event``.
"""

from __future__ import annotations

import re
from typing import Any

from faultlab.metadata._board import NoticeBoard, Request, Response, etag, stable_hex

ROOT = "/computeMetadata/v1"
ZONE = "us-central1-a"
PROJECT_ID = "faultlab-staging"
NUMERIC_PROJECT_ID = "123456789012"
MACHINE_TYPE = "a3-highgpu-8g"


def _maintenance_event(board: NoticeBoard) -> str:
    if board.preemption is not None:
        return "TERMINATE_ON_HOST_MAINTENANCE"
    if board.maintenance:
        return {"migrate": "MIGRATE_ON_HOST_MAINTENANCE",
                "reboot": "TERMINATE_ON_HOST_MAINTENANCE"}[board.maintenance[-1].kind]
    return "NONE"


def _tree(board: NoticeBoard) -> dict[str, Any]:
    """What the node would see now (caller holds ``board.lock``)."""
    node = board.node
    return {
        "instance": {
            "hostname": f"{node}.{ZONE}.c.{PROJECT_ID}.internal",
            "id": str(int(stable_hex("gce", node, num_chars=15), 16)),
            "machine-type": f"projects/{NUMERIC_PROJECT_ID}/machineTypes/{MACHINE_TYPE}",
            "maintenance-event": _maintenance_event(board),
            "name": node,
            "preempted": "TRUE" if board.preemption is not None else "FALSE",
            "scheduling": {"automatic-restart": "FALSE", "on-host-maintenance": "TERMINATE",
                           "preemptible": "TRUE", "provisioning-model": "SPOT"},
            "zone": f"projects/{NUMERIC_PROJECT_ID}/zones/{ZONE}",
        },
        "project": {"numeric-project-id": NUMERIC_PROJECT_ID, "project-id": PROJECT_ID},
    }


def _lookup(board: NoticeBoard, parts: list[str]) -> Any:
    node: Any = _tree(board)
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def handle(board: NoticeBoard, req: Request) -> Response:
    flavor = {"Metadata-Flavor": "Google"}
    if "x-forwarded-for" in req.headers:
        return Response(403, "", headers=flavor)
    if req.headers.get("metadata-flavor") != "Google":
        return Response(403, "Missing required header: Metadata-Flavor\n", headers=flavor,
                        content_type="text/html")
    if req.method != "GET":
        return Response(405, "", headers={**flavor, "Allow": "GET"})
    if req.path != ROOT and not req.path.startswith(ROOT + "/"):
        return Response(404, "", headers=flavor, content_type="text/html")
    parts = [p for p in req.path[len(ROOT):].split("/") if p]
    with board.lock:
        value = _lookup(board, parts)
    if value is None:
        return Response(404, "", headers=flavor, content_type="text/html")
    if isinstance(value, dict):
        if not req.path.endswith("/"):
            return Response(301, "", headers={**flavor, "Location": req.path + "/"})
        listing = "".join(k + ("/" if isinstance(v, dict) else "") + "\n"
                          for k, v in value.items())
        return Response(200, listing, headers={**flavor, "ETag": etag(listing)},
                        content_type="application/text")
    if req.query.get("wait_for_change", "false").lower() == "true":
        timeout = req.query.get("timeout_sec")
        if timeout is not None and not re.fullmatch(r"[0-9]{1,9}", timeout):
            return Response(400, f"timeout_sec must be a whole number of seconds, got "
                                 f"{timeout!r}\n", headers=flavor)
        value = board.wait_for_change(lambda: _lookup(board, parts), req.query.get("last_etag"),
                                      None if timeout is None else float(timeout))
        if value is None:  # cannot happen for the paths served today; kept honest anyway
            return Response(404, "", headers=flavor, content_type="text/html")
    return Response(200, value, headers={**flavor, "ETag": etag(value)},
                    content_type="application/text")
