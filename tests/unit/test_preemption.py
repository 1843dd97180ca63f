"""The trainer's preemption watcher against the real fake metadata server, the emergency
checkpoint metrics, and the spot fault's set-up and clean-up (no training job here; the
shipped spot experiments run the whole thing)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest

from faultlab.faults.cloud import SpotPreemptionFault
from faultlab.metadata import MetadataServer
from faultlab.observe import FaultRecord, compute_metrics
from reference_trainer.preemption import GCE_NOTICE_S, Notice, PreemptionWatcher, resolve_endpoint


def watch(server: MetadataServer, provider: str, poll_s: float = 0.05
          ) -> tuple[PreemptionWatcher, list[Notice], list[str]]:
    found = resolve_endpoint(provider, server.env())
    assert found is not None and found[0] == provider
    seen: list[Notice] = []
    errors: list[str] = []
    w = PreemptionWatcher(provider, found[1], poll_s=poll_s, on_notice=seen.append,
                          on_error=errors.append)
    return w, seen, errors


def wait_for(pred: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.mark.parametrize("provider", ["aws", "gce", "azure"])
def test_watcher_sees_the_notice_within_a_poll(provider: str) -> None:
    kwargs = {"imds_v2_required": True} if provider == "aws" else {}
    with MetadataServer(provider, **kwargs) as md:
        w, seen, errors = watch(md, provider)
        w.start()
        wait_for(lambda: w.num_polls >= 3)
        assert not w.noticed and not seen
        deadline = md.announce_preemption(notice_s=60)
        t_announced = time.time()
        wait_for(lambda: seen)  # the watcher sets noticed before it calls back
        assert len(seen) == 1 and errors == [] and w.noticed
        notice = seen[0]
        assert notice.provider == provider
        # poll_s is 0.05: a few polls, however loaded the machine, and far inside the notice
        assert notice.seen_t - t_announced < 2
        if provider == "gce":  # GCE publishes no deadline
            assert notice.deadline_t == pytest.approx(notice.seen_t + GCE_NOTICE_S, abs=0.01)
        else:  # AWS and Azure publish it to the second
            assert notice.deadline_t == pytest.approx(deadline, abs=1.0)
        polls = w.num_polls
        time.sleep(0.2)
        assert w.num_polls == polls  # the thread ends after a notice
        if provider == "azure":
            w.acknowledge()
            acked = md.state()["acknowledged"]
            assert [a["event_id"] for a in acked] == notice.detail["event_ids"]


def test_aws_watcher_uses_imdsv2_tokens() -> None:
    with MetadataServer("aws", imds_v2_required=True) as md:
        w, _seen, _errors = watch(md, "aws")
        assert w.poll_once() is None and w.poll_once() is None
        state = md.state()
        assert state["num_tokens_issued"] == 1  # one token, reused
        assert state["requests_by_path"]["/latest/meta-data/spot/instance-action"] == 2


def test_a_watcher_that_cannot_reach_its_endpoint_says_so_once() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once we leave: nothing listens there
    errors: list[str] = []
    w = PreemptionWatcher("aws", f"http://127.0.0.1:{port}", poll_s=0.01,
                          on_notice=lambda n: None, on_error=errors.append).start()
    wait_for(lambda: w.num_polls >= 6)
    w.stop()
    assert len(errors) == 1 and f"127.0.0.1:{port}" in errors[0]


def test_resolve_endpoint() -> None:
    assert resolve_endpoint("auto", {}) is None
    assert resolve_endpoint("none", {"GCE_METADATA_HOST": "x:1"}) is None
    assert resolve_endpoint("auto", {"GCE_METADATA_HOST": "127.0.0.1:8080"}) == (
        "gce", "http://127.0.0.1:8080")
    assert resolve_endpoint("aws", {}) == ("aws", "http://169.254.169.254")
    assert resolve_endpoint(
        "auto", {"AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://127.0.0.1:9/"}) == (
        "aws", "http://127.0.0.1:9")
    with pytest.raises(ValueError, match="unknown preemption provider 'ibm'"):
        resolve_endpoint("ibm", {})


# --- metrics ---------------------------------------------------------------------------------

def rec(t: float, kind: str, **kw: Any) -> dict[str, Any]:
    return {"t": t, "kind": kind, "rank": kw.pop("rank", 0), "pid": kw.pop("pid", 10),
            "world_size": 2, **kw}


def spot(t: float = 100.0, deadline_t: float = 120.0) -> FaultRecord:
    return FaultRecord(id="spot", type="spot_preemption",
                       capabilities=("loses_node",), injected_t=t, target="node 1",
                       details={"deadline_t": deadline_t})


def test_emergency_checkpoint_metrics() -> None:
    base = [rec(90 + i, "step", step=i) for i in range(1, 10)]
    saved = [rec(101.0, "preemption_notice", deadline=120.0, rank=1, pid=11),
             rec(101.7, "checkpoint_saved", step=9, emergency=True),
             rec(101.8, "exit", reason="peer_preempted", code=5)]
    m = compute_metrics(base + saved, [spot()])
    assert m.emergency_checkpoint_s == pytest.approx(1.7)
    assert m.emergency_checkpoint_before_deadline is True
    assert m.faults[0].detected_by is not None and "preemption_notice" in m.faults[0].detected_by
    assert m.detection_latency_s == pytest.approx(1.0)

    late = compute_metrics(base + [rec(121.0, "checkpoint_saved", step=9, emergency=True)],
                           [spot()])
    assert late.emergency_checkpoint_before_deadline is False
    assert late.emergency_checkpoint_s == pytest.approx(21.0)

    periodic_only = compute_metrics(base + [rec(101.0, "checkpoint_saved", step=10)], [spot()])
    assert periodic_only.emergency_checkpoint_before_deadline is False
    assert periodic_only.emergency_checkpoint_s is None

    before_notice = compute_metrics(base + [rec(99.0, "checkpoint_saved", step=9,
                                                    emergency=True)], [spot()])
    assert before_notice.emergency_checkpoint_before_deadline is False

    no_deadline = compute_metrics(base + saved, [FaultRecord(id="k", type="rank_kill",
                                                             injected_t=100.0)])
    assert no_deadline.emergency_checkpoint_before_deadline is None
    assert no_deadline.emergency_checkpoint_s is None


# --- the fault's set-up and clean-up -----------------------------------------------------------

def test_spot_fault_gives_every_node_its_own_endpoint_and_stops_them() -> None:
    fault = SpotPreemptionFault(SpotPreemptionFault.Params(provider="gce", notice_s=5))
    env = fault.prepare(["node0", "node1"])
    assert set(env) == {"node0", "node1"}
    hosts = {node: e["GCE_METADATA_HOST"] for node, e in env.items()}
    assert hosts["node0"] != hosts["node1"]
    for host in hosts.values():  # each one answers as GCE does
        found = resolve_endpoint("auto", {"GCE_METADATA_HOST": host})
        assert found is not None
        w = PreemptionWatcher("gce", found[1], poll_s=1, on_notice=lambda n: None)
        assert w.poll_once() is None
    fault.release()
    fault.release()  # idempotent
    for host in hosts.values():
        h, _, p = host.rpartition(":")
        with pytest.raises(OSError):
            socket.create_connection((h, int(p)), timeout=1).close()


def test_spot_fault_params_are_checked() -> None:
    with pytest.raises(ValueError, match="IMDSv2 is AWS's"):
        SpotPreemptionFault.Params(provider="azure", imds_v2_required=True)
    with pytest.raises(ValueError):
        SpotPreemptionFault.Params(notice_s=0)
    with pytest.raises(ValueError):
        SpotPreemptionFault.Params(return_after_s=-1)


def test_release_cancels_a_pending_deadline() -> None:
    fault = SpotPreemptionFault(SpotPreemptionFault.Params(provider="aws", notice_s=30))
    fault.prepare(["node0"])

    class Ctx:  # the few FaultContext calls the deadline timer makes, recorded
        calls: list[str] = []

        def node_names(self) -> list[str]:
            return ["node0"]

        def node_pids(self, node: str) -> list[int]:
            return []

        def kill_node(self, node: str, sig: int) -> list[int]:
            self.calls.append("kill")
            return []

        def mark_lost(self, node: str) -> None:
            self.calls.append("lost")

    ctx = Ctx()
    victim = type("V", (), {"kind": "node", "value": 0})()
    details = fault.inject(ctx, victim)  # type: ignore[arg-type]
    assert details["deadline_t"] == pytest.approx(time.time() + 30, abs=1.5)
    t0 = time.monotonic()
    out = fault.release()
    assert time.monotonic() - t0 < 2
    assert "kill" not in ctx.calls  # the deadline never came
    assert out["node0"] == {"left_before_deadline": True} and ctx.calls == ["lost"]
    assert not [t for t in threading.enumerate() if t.name.startswith("spot-deadline")]


def test_straggler_detection_latency_is_measured_for_the_delayed_rank() -> None:
    base = [rec(90 + i, "step", step=i) for i in range(1, 10)]
    delay = FaultRecord(id="d", type="collective_delay",
                        capabilities=("slows_job",), injected_t=95.5, target="rank 1",
                        details={"ranks": [1]})
    other = rec(97.0, "anomaly", what="straggler", straggler_rank=0, step=7)
    right = rec(98.25, "anomaly", what="straggler", straggler_rank=1, step=8)
    m = compute_metrics(base + [other, right], [delay])
    assert m.faults[0].straggler_detected_s == pytest.approx(2.75)
    assert m.straggler_detected_within_s == pytest.approx(2.75)
    assert compute_metrics(base + [other], [delay]).straggler_detected_within_s is None
    kill = FaultRecord(id="k", type="rank_kill", injected_t=95.5, target="rank 1")
    assert compute_metrics(base + [right], [kill]).straggler_detected_within_s is None
