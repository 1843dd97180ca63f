"""AWS EC2 instance metadata service (IMDS), versions 1 and 2, as far as spot clients read it.

Served paths (``GET`` unless said otherwise)::

    PUT /latest/api/token                              IMDSv2 session token
    /latest/meta-data/                                  directory listing (dirs end in "/")
    /latest/meta-data/instance-id, instance-type, ami-id, hostname, local-ipv4
    /latest/meta-data/placement/availability-zone, region
    /latest/meta-data/spot/instance-action              {"action": "terminate", "time": "...Z"}
    /latest/meta-data/spot/termination-time             the same time, plain text
    /latest/meta-data/events/recommendations/rebalance  {"noticeTime": "...Z"}
    /latest/meta-data/events/maintenance/scheduled      JSON list, [] when nothing is scheduled
    /latest/dynamic/instance-identity/document          the JSON identity document

The spot and rebalance paths answer 404 until a notice is issued, as AWS does; times are
ISO-8601 UTC to the second, truncated (a client never reads a later deadline than the real
one). A leaf also answers with a trailing slash (botocore asks for ``availability-zone/``).

IMDSv2 rules as AWS applies them: the token ``PUT`` needs
``X-aws-ec2-metadata-token-ttl-seconds`` between 1 and 21600 (else 400) and is refused with
403 when it carries ``X-Forwarded-For``; a token lives for its TTL. A ``GET`` that sends
``X-aws-ec2-metadata-token`` must send a live token (else 401), whether or not v2 is required;
with ``imds_v2_required`` a ``GET`` without one is 401 too (AWS's ``HttpTokens=required``).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from faultlab.metadata._board import Maintenance, NoticeBoard, Request, Response, stable_hex

TOKEN_PATH = "/latest/api/token"
TOKEN_HEADER = "x-aws-ec2-metadata-token"
TTL_HEADER = "x-aws-ec2-metadata-token-ttl-seconds"
MIN_TOKEN_TTL_S, MAX_TOKEN_TTL_S = 1, 21600

REGION = "us-east-1"
AVAILABILITY_ZONE = "us-east-1a"
INSTANCE_TYPE = "p5.48xlarge"

_NOT_FOUND = """<?xml version="1.0" encoding="iso-8859-1"?>
<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Transitional//EN"
\t"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd">
<html xmlns="http://www.w3.org/1999/xhtml" xml:lang="en" lang="en">
 <head>
  <title>404 - Not Found</title>
 </head>
 <body>
  <h1>404 - Not Found</h1>
 </body>
</html>
"""


def iso_utc(t: float) -> str:
    """``2026-11-21T17:03:00Z``: seconds precision, truncated."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(t)))


def aws_event_time(t: float) -> str:
    """The scheduled-events format: ``21 Jan 2019 09:00:43 GMT``."""
    return time.strftime("%d %b %Y %H:%M:%S GMT", time.gmtime(int(t)))


def instance_id(node: str) -> str:
    return "i-" + stable_hex("aws", node, num_chars=17)


def _tree(board: NoticeBoard) -> dict[str, Any]:
    """The metadata the node would see now; dicts are directories, strings are leaves."""
    node = board.node
    iid = instance_id(node)
    private_ip = f"10.0.{int(stable_hex(node, num_chars=2), 16)}.{10 + len(node) % 200}"
    meta: dict[str, Any] = {
        "ami-id": "ami-" + stable_hex("ami", num_chars=17),
        "hostname": f"ip-{private_ip.replace('.', '-')}.ec2.internal",
        "instance-id": iid,
        "instance-life-cycle": "spot",
        "instance-type": INSTANCE_TYPE,
        "local-ipv4": private_ip,
        "placement": {"availability-zone": AVAILABILITY_ZONE, "region": REGION},
        "events": {"maintenance": {"history": "[]", "scheduled": json.dumps(
            [_scheduled_event(m) for m in board.maintenance], indent=2)}},
    }
    p = board.preemption
    if p is not None:
        spot = {"instance-action": json.dumps({"action": p.action, "time": iso_utc(p.deadline)})}
        if p.action == "terminate":
            spot["termination-time"] = iso_utc(p.deadline)
        meta["spot"] = spot
    if board.rebalance_at is not None:
        meta["events"]["recommendations"] = {
            "rebalance": json.dumps({"noticeTime": iso_utc(board.rebalance_at)})}
    document = {
        "accountId": "123456789012", "architecture": "x86_64",
        "availabilityZone": AVAILABILITY_ZONE, "billingProducts": None,
        "devpayProductCodes": None, "marketplaceProductCodes": None,
        "imageId": meta["ami-id"], "instanceId": iid, "instanceType": INSTANCE_TYPE,
        "kernelId": None, "pendingTime": "2026-01-01T00:00:00Z", "privateIp": private_ip,
        "ramdiskId": None, "region": REGION, "version": "2017-09-30",
    }
    return {"latest": {"meta-data": meta, "dynamic": {
        "instance-identity": {"document": json.dumps(document, indent=2)}}}}


def _scheduled_event(m: Maintenance) -> dict[str, str]:
    code, description = (("system-maintenance", "scheduled system maintenance")
                         if m.kind == "migrate" else ("system-reboot", "scheduled reboot"))
    return {"Code": code, "Description": description,
            "EventId": "instance-event-" + m.event_id.replace("-", "").lower()[:17],
            "NotBefore": aws_event_time(m.not_before), "NotAfter": aws_event_time(m.not_after),
            "State": "active"}


def handle(board: NoticeBoard, req: Request, *, imds_v2_required: bool) -> Response:
    if req.path == TOKEN_PATH:
        return _token(board, req)
    if req.method != "GET":
        return Response(405, "", headers={"Allow": "GET"})
    token = req.headers.get(TOKEN_HEADER)
    if token is not None and not board.token_valid(token):
        return Response(401, "")  # an expired or made-up token, even where v1 is allowed
    if token is None and imds_v2_required:
        return Response(401, "")
    with board.lock:
        node: Any = _tree(board)
    for part in [p for p in req.path.split("/") if p]:
        if not isinstance(node, dict) or part not in node:
            return Response(404, _NOT_FOUND, content_type="text/html")
        node = node[part]
    if isinstance(node, dict):
        if not req.path.endswith("/"):
            # AWS redirects a directory without its slash; clients always send it.
            return Response(301, "", headers={"Location": req.path + "/"})
        return Response(200, "\n".join(k + "/" if isinstance(v, dict) else k
                                       for k, v in node.items()))
    return Response(200, node)


def _token(board: NoticeBoard, req: Request) -> Response:
    if req.method != "PUT":
        return Response(405, "", headers={"Allow": "PUT"})
    if "x-forwarded-for" in req.headers:
        return Response(403, "")
    raw = req.headers.get(TTL_HEADER, "")
    # Plain decimal digits only: int() would also take " 5", "+5" and "2_1".
    ttl_s = int(raw) if re.fullmatch(r"[0-9]{1,6}", raw) else None
    if ttl_s is None or not MIN_TOKEN_TTL_S <= ttl_s <= MAX_TOKEN_TTL_S:
        return Response(400, "")
    return Response(200, board.issue_token(ttl_s),
                    headers={"X-aws-ec2-metadata-token-ttl-seconds": str(ttl_s)})
