"""The docker target and the network faults against a real Docker engine.

The job's "trainer" here is ``sleep``: these tests are about containers, addresses, network
namespaces, qdiscs and clean-up, not training (the shipped docker experiments train). Whether
a packet gets through is checked from inside a node's own network namespace with a real TCP
connect: a closed port answers at once with a reset ("refused"), a dropped packet never does
("timed out"), and the rendezvous store's open port accepts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from faultlab.errors import InvalidExperimentError
from faultlab.fault_api.netns import run_in
from faultlab.faults import Victim
from faultlab.faults.network import NetworkFlapFault, NetworkPartitionFault, NetworkThrottleFault
from faultlab.faults.process import NodePauseFault
from faultlab.spec import experiment_from_dict, parse_experiment
from faultlab.targets.docker import DockerTarget
from faultlab.targets.docker.engine import run_resources

REPO = Path(__file__).resolve().parents[2]


def _sleeping_job(nodes: int = 3) -> dict[str, Any]:
    # faultlab's launcher: its store on the gateway, outside every node, is what the partition
    # checks below reach or cut (under a team's c10d line the store is in node 0)
    return {"name": "docker_sleep", "target": {"command": ["sleep", "300"],
                                               "launch": "faultlab"},
            "topology": {"nodes": nodes, "launcher": "docker"}, "run": {"timeout_s": 300}}


def _reach(pid: int, host: str, port: int) -> str:
    """From inside ``pid``'s network namespace: connect to host:port; one word for what
    happened."""
    code = ("import socket,sys\ntry:\n socket.create_connection((sys.argv[1], int(sys.argv[2])),"
            " timeout=1.5).close(); print('open')\nexcept ConnectionRefusedError: "
            "print('refused')\nexcept OSError: print('timeout')")
    done = run_in(pid, [sys.executable, "-c", code, host, str(port)])
    return done.stdout.strip()


def _chains(pid: int) -> str:
    return run_in(pid, ["iptables", "-w", "5", "-S"]).stdout


def _qdisc(pid: int | None, dev: str) -> str:
    return run_in(pid, ["tc", "qdisc", "show", "dev", dev]).stdout


def test_network_faults_are_refused_on_local_nodes() -> None:
    text = ("name: x\ntopology: {nodes: 2}\nfaults:\n  - type: network_partition\n"
            "    target: {node: 1}\n    trigger: {at_step: 5}\n    duration_s: 10\n")
    with pytest.raises(InvalidExperimentError) as err:
        parse_experiment(text, "x.yaml")
    problem = err.value.problems[0]
    assert (problem.line, problem.path) == (4, "faults[0].type")
    assert "needs node_network (nodes with a network stack of their own" in problem.message
    assert "which launcher 'local' does not offer; launchers that do: docker" in problem.message


@pytest.mark.parametrize(("fault", "params", "message"), [
    ("network_partition", {"groups": [[0, 1], [1, 2]]}, "node 1 is in two groups"),
    ("network_partition", {"method": "disconnect", "scope": "nodes"}, "needs scope: all"),
    ("network_flap", {"period_s": 2, "down_s": 2}, "must be shorter than period_s"),
    ("network_throttle", {"rate": "fast"}, "is not a tc rate"),
    ("network_throttle", {"burst": "lots"}, "is not a tc size"),
])
def test_bad_network_params_are_located(fault: str, params: dict[str, Any],
                                        message: str) -> None:
    doc = {**_sleeping_job(), "faults": [{"type": fault, "target": {"node": 1},
                                          "trigger": {"at_time_s": 5}, "duration_s": 5,
                                          "params": params}]}
    with pytest.raises(InvalidExperimentError) as err:
        experiment_from_dict(doc)
    assert any(p.path.startswith("faults[0].params") and message in p.message
               for p in err.value.problems), err.value.problems


def test_faults_act_on_real_containers_and_stop_leaves_nothing(docker_client: Any,
                                                               tmp_path: Path) -> None:
    exp = experiment_from_dict(_sleeping_job(3))
    target = DockerTarget(exp, tmp_path / "job")
    run_id = target.run_id
    target.start()
    try:
        nodes = target.node_names()
        assert nodes == ["node0", "node1", "node2"]
        ip = {n: target.node_address(n) for n in nodes}
        pid = {n: target.node_netns_pid(n) for n in nodes}
        assert len(set(ip.values())) == 3 and all(ip.values())
        store_host, store_port = json.loads(
            (tmp_path / "job" / "launch.json").read_text())["rdzv_endpoint"].split(":")
        assert store_host == target.store_address()
        closed = 9  # nothing listens on the discard port
        assert _reach(pid["node0"], ip["node2"], closed) == "refused"
        assert _reach(pid["node2"], store_host, int(store_port)) == "open"

        # -- node 2 cut off from its peers and the store, then healed
        cut = NetworkPartitionFault(NetworkPartitionFault.Params())
        details = cut.inject(target, Victim("node", 2))
        assert details["sides"] == [["node0", "node1"], ["node2"]]
        assert _reach(pid["node0"], ip["node2"], closed) == "timeout"
        assert _reach(pid["node2"], ip["node1"], closed) == "timeout"
        assert _reach(pid["node2"], store_host, int(store_port)) == "timeout"
        assert _reach(pid["node0"], ip["node1"], closed) == "refused"  # the others still talk
        assert details["chain"] in _chains(pid["node2"])
        assert cut.undo(target) == {"rules_removed": ["node2"], "reconnected": []}
        assert details["chain"] not in _chains(pid["node2"])
        assert _reach(pid["node0"], ip["node2"], closed) == "refused"
        assert cut.undo(target)["rules_removed"] == []  # idempotent

        # -- split into sets: {0} | {1, 2}; the store stays with the first set
        split = NetworkPartitionFault(NetworkPartitionFault.Params(groups=[[0], [1, 2]]))
        split.inject(target, Victim("all"))
        assert _reach(pid["node1"], ip["node0"], closed) == "timeout"
        assert _reach(pid["node1"], ip["node2"], closed) == "refused"
        assert _reach(pid["node0"], store_host, int(store_port)) == "open"
        assert _reach(pid["node1"], store_host, int(store_port)) == "timeout"
        split.undo(target)
        assert _reach(pid["node1"], ip["node0"], closed) == "refused"

        # -- disconnect: the node loses its address, and gets one back
        gone = NetworkPartitionFault(NetworkPartitionFault.Params(method="disconnect"))
        gone.inject(target, Victim("node", 1))
        assert target.node_address("node1") is None
        assert gone.undo(target)["reconnected"] == ["node1"]
        assert target.node_address("node1") is not None

        # -- throttle both ways: tbf on the node's eth0 and on the host side of its veth
        slow = NetworkThrottleFault(NetworkThrottleFault.Params(rate="5mbit",
                                                                direction="both"))
        shaped = slow.inject(target, Victim("node", 0))
        veth = shaped["tc"]["node0"][1].split()[4]
        assert "tbf" in _qdisc(pid["node0"], "eth0") and "5Mbit" in _qdisc(pid["node0"], "eth0")
        assert "tbf" in _qdisc(None, veth)
        assert len(slow.undo(target)["removed"]) == 2
        assert "tbf" not in _qdisc(pid["node0"], "eth0") and "tbf" not in _qdisc(None, veth)

        # -- flap: the cut comes and goes until undone
        flap = NetworkFlapFault(NetworkFlapFault.Params(period_s=1.0, down_s=0.5))
        flap.inject(target, Victim("node", 2))
        seen = set()
        t_end = time.monotonic() + 3.0
        while time.monotonic() < t_end:
            seen.add("faultlab-" in _chains(pid["node2"]))
            time.sleep(0.1)
        assert seen == {True, False}
        assert flap.undo(target)["cycles"] >= 2
        assert "faultlab-" not in _chains(pid["node2"])

        # -- pause: the cgroup freezer, thawed by undo
        pause = NodePauseFault(NodePauseFault.Params())
        pause.inject(target, Victim("node", 1))
        assert docker_client.containers.get(f"faultlab-{run_id}-node1").status == "paused"
        assert pause.undo(target) == {"unpaused": ["node1"]}
        assert docker_client.containers.get(f"faultlab-{run_id}-node1").status == "running"
        pause.inject(target, Victim("node", 1))  # left paused on purpose: stop must cope
    finally:
        target.stop()
    assert run_resources(docker_client, run_id) == {"containers": [], "networks": [],
                                                     "images": []}


@pytest.mark.parametrize("launch", ["torchrun", "faultlab"])
def test_killed_faultlab_leaves_no_container_network_or_image(docker_client: Any,
                                                              tmp_path: Path,
                                                              launch: str) -> None:
    # torchrun: the team's line inside each container (the store in node 0's agent);
    # faultlab: the tuned agents, with faultlab's store process on the host
    exp = tmp_path / "sleepers.yaml"
    exp.write_text(f"name: sleepers\ntarget: {{command: [sleep, '300'], launch: {launch}}}\n"
                   "topology: {nodes: 2, launcher: docker}\nrun: {timeout_s: 200}\n"
                   "faults:\n  - type: node_pause\n    target: {node: 1}\n"
                   "    trigger: {at_time_s: 1}\n    duration_s: 150\n")
    out = tmp_path / "faultlab.out"
    with open(out, "wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "faultlab.cli", "run", str(exp),
                                 "--report-dir", str(tmp_path / "reports")], cwd=REPO,
                                stdout=sink, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def said() -> str:  # what faultlab printed and its journal: all CI shows of a failure
        journal = "".join(j.read_text()[-3000:]
                          for j in (tmp_path / "reports").glob("*/journal*"))
        return f"faultlab printed:\n{out.read_text()[-3000:]}\njournal:\n{journal}"

    try:
        deadline = time.monotonic() + 90
        run_id = None
        while time.monotonic() < deadline and run_id is None and proc.poll() is None:
            for found in (tmp_path / "reports").glob("*/job/launch.json"):
                started = json.loads(found.read_text())
                run_id = started["run_id"]
                assert (started["launch"] == "faultlab") == (launch == "faultlab"), started
            time.sleep(0.2)
        assert run_id is not None, f"the job never started\n{said()}"
        paused: list[Any] = []
        while time.monotonic() < deadline and proc.poll() is None:  # until node 1 is paused
            paused = [c for c in docker_client.containers.list(
                filters={"label": f"faultlab.run={run_id}"}, ignore_removed=True)
                if c.status == "paused"]
            if paused:
                break
            time.sleep(0.2)
        assert paused, f"node_pause never struck\n{said()}"
        # What the guard will undo, kept by the engine: DockerTarget.guard_record (the run's
        # label), known before the containers were created, and the launcher that undoes it.
        [kept] = (tmp_path / "reports").glob("*/.job-pids-target-guard.json")
        assert json.loads(kept.read_text()) == {"launcher": "docker",
                                                "record": {"run_id": run_id}}
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        left: dict[str, list[str]] = {}
        deadline = time.monotonic() + 60  # the guard's own time, whatever the start took
        while time.monotonic() < deadline:
            left = run_resources(docker_client, run_id)
            if not any(left.values()):
                break
            time.sleep(0.5)
        assert left == {"containers": [], "networks": [], "images": []}
    finally:
        if proc.poll() is None:
            proc.kill()


def test_no_engine_skips_with_the_reason_or_fails_where_one_is_required(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from faultlab.testing import require_docker_engine

    # A real client against a socket nobody serves: the way a machine without an engine looks.
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    monkeypatch.delenv("FAULTLAB_REQUIRE_DOCKER", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no Docker engine answers.*docker.io"):
        require_docker_engine()
    monkeypatch.setenv("FAULTLAB_REQUIRE_DOCKER", "1")
    # Where make test's start script left a log, the failure quotes its end: that is all CI shows.
    log = tmp_path / "dockerd.log"
    log.write_text("level=info msg=\"Starting up\"\nfailed to start daemon: failed to dial "
                   "\"/run/containerd/containerd.sock\"\n")
    monkeypatch.setattr("faultlab.testing.ENGINE_LOG", log)
    with pytest.raises(pytest.fail.Exception,
                       match="FAULTLAB_REQUIRE_DOCKER=1 but no Docker.*the end of "
                             ".*dockerd.log: .*Starting up.* [|] failed to start daemon"):
        require_docker_engine()
    monkeypatch.setattr("faultlab.testing.ENGINE_LOG", tmp_path / "absent.log")
    with pytest.raises(pytest.fail.Exception, match="FAULTLAB_REQUIRE_DOCKER=1 but no Docker") as e:
        require_docker_engine()
    assert "the end of" not in str(e.value)


def test_docker_clean_removes_what_a_run_left(docker_client: Any) -> None:
    run_id = f"cleantest{os.getpid()}"
    labels = {"faultlab": "1", "faultlab.run": run_id}
    docker_client.networks.create(f"faultlab-{run_id}", driver="bridge", internal=True,
                                  labels=labels)
    other = docker_client.networks.create(f"faultlab-{run_id}-other", driver="bridge",
                                          internal=True, labels={"faultlab": "1",
                                                                 "faultlab.run": "other"})
    try:
        done = subprocess.run([sys.executable, "-m", "faultlab.cli", "docker", "clean",
                               "--run", run_id], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert f"removed 1 networks: faultlab-{run_id}" in done.stdout
        assert run_resources(docker_client, run_id)["networks"] == []
        assert run_resources(docker_client, "other")["networks"] == [other.name]  # not its run
    finally:
        other.remove()
