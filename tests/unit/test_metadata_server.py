"""The fake cloud metadata server, through real sockets and, for AWS, botocore's own client."""

from __future__ import annotations

import http.client
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest
from botocore.session import Session
from botocore.utils import IMDSFetcher, IMDSRegionProvider

from faultlab.metadata import CONTROL_TOKEN_HEADER, MetadataServer

SPOT_ACTION = "latest/meta-data/spot/instance-action"
TTL = "X-aws-ec2-metadata-token-ttl-seconds"
GOOGLE = {"Metadata-Flavor": "Google"}
AZURE = {"Metadata": "true"}
EVENTS = "/metadata/scheduledevents?api-version=2020-07-01"


def request(url: str, method: str, path: str, headers: dict[str, str] | None = None,
            body: bytes | str | None = None, timeout_s: float = 5.0
            ) -> tuple[int, dict[str, str], str]:
    """One request on a fresh connection: (status, lower-cased headers, body text)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read().decode()
    finally:
        conn.close()


def epoch(iso_z: str) -> float:
    return datetime.fromisoformat(iso_z.replace("Z", "+00:00")).timestamp()


@pytest.fixture
def aws_v2() -> Any:
    with MetadataServer("aws", imds_v2_required=True, node="node1") as md:
        yield md


# --- AWS, through botocore ------------------------------------------------------------------


def test_botocore_reads_the_spot_notice_with_imdsv2_required(aws_v2: MetadataServer) -> None:
    endpoint = aws_v2.env()["AWS_EC2_METADATA_SERVICE_ENDPOINT"]
    fetcher = IMDSFetcher(config={"ec2_metadata_service_endpoint": endpoint}, env={})
    assert fetcher.get_base_url() == endpoint
    token = fetcher._fetch_metadata_token()
    assert token
    before = fetcher._get_request(SPOT_ACTION, retry_func=lambda r: False, token=token)
    assert before.status_code == 404  # no notice yet, as on AWS

    deadline = aws_v2.announce_preemption(notice_s=120)
    # botocore's default retry_func refuses non-200 and empty answers: returning is success.
    action = json.loads(fetcher._get_request(SPOT_ACTION, retry_func=None, token=token).text)
    assert action["action"] == "terminate"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", action["time"])
    assert epoch(action["time"]) == int(deadline)
    assert 119 < deadline - time.time() <= 120
    termination = fetcher._get_request("latest/meta-data/spot/termination-time", None, token)
    assert termination.text == action["time"]

    by_path = aws_v2.state()["requests_by_path"]
    assert by_path["/" + SPOT_ACTION] == 2 and by_path["/latest/api/token"] == 1


def test_botocore_finds_the_fake_through_the_environment(aws_v2: MetadataServer,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in aws_v2.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_EC2_METADATA_DISABLED", raising=False)
    # The region botocore would use comes from placement/availability-zone/, token first.
    assert IMDSRegionProvider(Session()).provide() == "us-east-1"
    status, _h, body = request(aws_v2.url, "PUT", "/latest/api/token", {TTL: "60"})
    token = {"X-aws-ec2-metadata-token": body}
    doc = json.loads(request(aws_v2.url, "GET", "/latest/dynamic/instance-identity/document",
                             token)[2])
    assert doc["region"] == "us-east-1" and doc["availabilityZone"] == "us-east-1a"
    assert doc["instanceId"] == request(aws_v2.url, "GET", "/latest/meta-data/instance-id",
                                        token)[2]
    listing = request(aws_v2.url, "GET", "/latest/meta-data/", token)[2].splitlines()
    assert {"instance-id", "placement/", "events/"} <= set(listing)


@pytest.mark.parametrize("ttl,status", [("0", 400), ("21601", 400), (None, 400), ("abc", 400),
                                        ("1.5", 400), ("-1", 400), ("1", 200), ("21600", 200)])
def test_token_ttl_bounds(aws_v2: MetadataServer, ttl: str | None, status: int) -> None:
    headers = {} if ttl is None else {TTL: ttl}
    got, resp_headers, body = request(aws_v2.url, "PUT", "/latest/api/token", headers)
    assert got == status
    if status == 200:
        assert body and resp_headers[TTL.lower()] == ttl


def test_token_rules(aws_v2: MetadataServer) -> None:
    url, path = aws_v2.url, "/latest/meta-data/instance-id"
    assert request(url, "GET", path)[0] == 401  # v2 required, no token
    assert request(url, "PUT", "/latest/api/token",
                   {TTL: "60", "X-Forwarded-For": "10.0.0.9"})[0] == 403
    token = request(url, "PUT", "/latest/api/token", {TTL: "1"})[2]
    assert request(url, "GET", path, {"X-aws-ec2-metadata-token": token})[0] == 200
    time.sleep(1.05)
    assert request(url, "GET", path, {"X-aws-ec2-metadata-token": token})[0] == 401  # expired


def test_imds_v1_allowed_by_default_but_a_bad_token_is_refused() -> None:
    with MetadataServer("aws") as md:
        path = "/latest/meta-data/instance-id"
        status, _h, body = request(md.url, "GET", path)
        assert status == 200 and body.startswith("i-")
        assert request(md.url, "GET", path, {"X-aws-ec2-metadata-token": "made-up"})[0] == 401


def test_rebalance_maintenance_and_clear() -> None:
    with MetadataServer("aws") as md:
        rebalance = "/latest/meta-data/events/recommendations/rebalance"
        scheduled = "/latest/meta-data/events/maintenance/scheduled"
        assert request(md.url, "GET", rebalance)[0] == 404
        assert json.loads(request(md.url, "GET", scheduled)[2]) == []
        notice = md.announce_rebalance()
        assert epoch(json.loads(request(md.url, "GET", rebalance)[2])["noticeTime"]) == \
            int(notice)
        start = md.announce_maintenance(notice_s=3600, kind="reboot", duration_s=600)
        [event] = json.loads(request(md.url, "GET", scheduled)[2])
        assert set(event) == {"Code", "Description", "EventId", "NotBefore", "NotAfter",
                              "State"}
        assert event["Code"] == "system-reboot" and event["State"] == "active"
        assert event["EventId"].startswith("instance-event-")
        assert event["NotBefore"] == time.strftime("%d %b %Y %H:%M:%S GMT",
                                                   time.gmtime(int(start)))
        md.clear()
        assert request(md.url, "GET", rebalance)[0] == 404
        assert json.loads(request(md.url, "GET", scheduled)[2]) == []


def test_announce_validates_its_arguments() -> None:
    md = MetadataServer("aws")
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="notice_s"):
            md.announce_preemption(bad)
    with pytest.raises(ValueError, match="'reboot' is not one of terminate, stop, hibernate"):
        md.announce_preemption(10, action="reboot")
    with pytest.raises(ValueError, match="'oci' is not one of aws, gce, azure"):
        MetadataServer("oci")
    with pytest.raises(ValueError, match="rebalance recommendations are AWS's"):
        MetadataServer("gce").announce_rebalance()


# --- GCE ------------------------------------------------------------------------------------


def test_gce_requires_the_flavor_header_and_answers_with_etags() -> None:
    with MetadataServer("gce") as md:
        path = "/computeMetadata/v1/instance/preempted"
        assert request(md.url, "GET", path)[0] == 403
        status, headers, body = request(md.url, "GET", path, GOOGLE)
        assert (status, body) == (200, "FALSE")
        assert headers["metadata-flavor"] == "Google" and headers["etag"]
        assert request(md.url, "GET", "/computeMetadata/v1/instance/maintenance-event",
                       GOOGLE)[2] == "NONE"
        assert request(md.url, "GET", "/computeMetadata/v1/instance/zone", GOOGLE)[2] \
            .endswith("/zones/us-central1-a")
        assert request(md.url, "GET", "/computeMetadata/v1/instance/id", GOOGLE)[2].isdigit()
        md.announce_maintenance(notice_s=60)
        assert request(md.url, "GET", "/computeMetadata/v1/instance/maintenance-event",
                       GOOGLE)[2] == "MIGRATE_ON_HOST_MAINTENANCE"


def test_gce_wait_for_change_returns_promptly_after_the_change() -> None:
    with MetadataServer("gce") as md:
        path = "/computeMetadata/v1/instance/preempted?wait_for_change=true"
        timer = threading.Timer(0.3, md.announce_preemption)
        t0 = time.monotonic()
        timer.start()
        status, headers, body = request(md.url, "GET", path, GOOGLE)
        elapsed = time.monotonic() - t0
        assert (status, body) == (200, "TRUE")
        assert 0.3 <= elapsed < 10  # blocked until the change, woke on it (it has no timeout)
        event = request(md.url, "GET", "/computeMetadata/v1/instance/maintenance-event",
                        GOOGLE)[2]
        assert event == "TERMINATE_ON_HOST_MAINTENANCE"

        # An out-of-date last_etag answers at once; timeout_sec answers the unchanged value.
        t0 = time.monotonic()
        assert request(md.url, "GET", path + "&last_etag=0123456789abcdef", GOOGLE)[2] == "TRUE"
        assert time.monotonic() - t0 < 5  # not blocked: a wait would last forever
        status, _h, body = request(md.url, "GET", path + f"&last_etag={headers['etag']}"
                                                         "&timeout_sec=1", GOOGLE)
        assert (status, body) == (200, "TRUE") and time.monotonic() - t0 >= 1.0


# --- Azure ----------------------------------------------------------------------------------


def test_azure_scheduled_events_preempt_and_acknowledge() -> None:
    with MetadataServer("azure", node="vm-7") as md:
        assert request(md.url, "GET", EVENTS)[0] == 400  # no Metadata: true
        assert request(md.url, "GET", "/metadata/scheduledevents", AZURE)[0] == 400
        empty = json.loads(request(md.url, "GET", EVENTS, AZURE)[2])
        assert empty["Events"] == []

        deadline = md.announce_preemption(notice_s=30)
        doc = json.loads(request(md.url, "GET", EVENTS, AZURE)[2])
        assert doc["DocumentIncarnation"] == empty["DocumentIncarnation"] + 1
        [event] = doc["Events"]
        assert event == {"EventId": event["EventId"], "EventType": "Preempt",
                         "ResourceType": "VirtualMachine", "Resources": ["vm-7"],
                         "EventStatus": "Scheduled",
                         "NotBefore": formatdate(int(deadline), usegmt=True),
                         "Description": event["Description"], "EventSource": "Platform",
                         "DurationInSeconds": -1}
        assert re.fullmatch(r"[0-9A-F]{8}(-[0-9A-F]{4}){3}-[0-9A-F]{12}", event["EventId"])

        def ack(event_id: str) -> tuple[int, dict[str, str], str]:
            return request(md.url, "POST", EVENTS, AZURE,
                           json.dumps({"StartRequests": [{"EventId": event_id}]}))

        status, _h, body = ack("00000000-0000-0000-0000-000000000000")
        assert status == 400 and "00000000-0000-0000-0000-000000000000" in body
        assert request(md.url, "POST", EVENTS, AZURE, "{not json")[0] == 400
        assert md.state()["acknowledged"] == []
        assert ack(event["EventId"])[0] == 200
        assert [a["event_id"] for a in md.state()["acknowledged"]] == [event["EventId"]]
        after = json.loads(request(md.url, "GET", EVENTS, AZURE)[2])
        assert after["Events"][0]["EventStatus"] == "Started"
        assert after["DocumentIncarnation"] == doc["DocumentIncarnation"] + 1

        md.announce_maintenance(notice_s=300, kind="migrate", duration_s=9)
        freeze = json.loads(request(md.url, "GET", EVENTS, AZURE)[2])["Events"][1]
        assert (freeze["EventType"], freeze["DurationInSeconds"]) == ("Freeze", 9)
        compute = json.loads(request(md.url, "GET", "/metadata/instance?api-version=2021-02-01",
                                     AZURE)[2])["compute"]
        assert compute["name"] == "vm-7" and compute["priority"] == "Spot"


# --- control endpoints and life cycle -------------------------------------------------------


def test_control_endpoints_need_the_token() -> None:
    with MetadataServer("gce") as md:
        auth = {CONTROL_TOKEN_HEADER: md.control_token}
        for method, path in [("POST", "/_faultlab/preempt"), ("POST", "/_faultlab/clear"),
                             ("POST", "/_faultlab/rebalance"), ("GET", "/_faultlab/state")]:
            assert request(md.url, method, path)[0] == 401
            assert request(md.url, method, path, {CONTROL_TOKEN_HEADER: "guess"})[0] == 401
        status, _h, body = request(md.url, "POST", "/_faultlab/preempt", auth, "{oops")
        assert status == 400 and "not JSON" in json.loads(body)["error"]
        status, _h, body = request(md.url, "POST", "/_faultlab/preempt", auth,
                                   '{"notice_s": -5}')
        assert status == 400 and "notice_s: -5" in json.loads(body)["error"]
        status, _h, body = request(md.url, "POST", "/_faultlab/preempt", auth, '{"notise_s": 5}')
        assert status == 400 and "notise_s" in json.loads(body)["error"]
        assert request(md.url, "POST", "/_faultlab/rebalance", auth)[0] == 400  # not on GCE

        status, _h, body = request(md.url, "POST", "/_faultlab/preempt", auth,
                                   '{"notice_s": 90}')
        assert status == 200 and 89 < json.loads(body)["deadline"] - time.time() <= 90
        state = json.loads(request(md.url, "GET", "/_faultlab/state", auth)[2])
        assert state["preemption"]["action"] == "terminate"
        assert request(md.url, "POST", "/_faultlab/clear", auth)[0] == 200
        assert md.state()["preemption"] is None


def test_stop_wakes_waiters_frees_the_port_and_is_idempotent() -> None:
    md = MetadataServer("gce").start()
    port, answers = md.port, []
    waiter = threading.Thread(target=lambda: answers.append(request(
        md.url, "GET", "/computeMetadata/v1/instance/preempted?wait_for_change=true", GOOGLE)))
    waiter.start()
    deadline = time.monotonic() + 10  # the request reaches its handler and blocks there
    while md.state()["num_waiting"] == 0:
        assert time.monotonic() < deadline and waiter.is_alive(), answers
        time.sleep(0.02)
    t0 = time.monotonic()
    md.stop()
    waiter.join(10)
    assert not waiter.is_alive() and time.monotonic() - t0 < 5  # woken, not timed out
    assert answers and answers[0][0] == 200
    md.stop()  # idempotent
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    with MetadataServer("gce", port=port) as again:  # the port is free to bind again
        assert again.port == port
    MetadataServer("aws").stop()  # never started: nothing to do


# --- CLI ------------------------------------------------------------------------------------

FAULTLAB = str(Path(sys.executable).with_name("faultlab"))


def test_cli_serves_until_sigterm_and_exits_zero() -> None:
    proc = subprocess.Popen([FAULTLAB, "metadata", "serve", "--provider", "aws", "--port", "0",
                             "--imds-v2-required", "--notice-in-s", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(4)]
        url = re.search(r"serving at (http://\S+)", lines[0]).group(1)  # type: ignore[union-attr]
        assert lines[1].strip() == f"export AWS_EC2_METADATA_SERVICE_ENDPOINT={url}/"
        token = re.search(r"control token: (\S+)", lines[2]).group(1)  # type: ignore[union-attr]
        assert "preemption announced" in lines[3]
        fetcher = IMDSFetcher(config={"ec2_metadata_service_endpoint": url + "/"}, env={})
        action = fetcher._get_request(SPOT_ACTION, None, fetcher._fetch_metadata_token())
        assert json.loads(action.text)["action"] == "terminate"
        assert request(url, "GET", "/_faultlab/state", {CONTROL_TOKEN_HEADER: token})[0] == 200
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "stopped" in out and err == ""


@pytest.mark.parametrize("port", ["70000", "-1", "http"])
def test_cli_bad_port_exits_2_naming_the_flag(port: str) -> None:
    proc = subprocess.run([FAULTLAB, "metadata", "serve", "--provider", "gce", "--port", port],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert f"argument --port: '{port}' is not a port in 0-65535" in proc.stderr
    assert proc.stdout == ""
