"""examples/plugin's target, ``netns``: every node a process of this host in a network namespace
of its own, installed as a team installs its package (the Makefile's venv stamp).

- Cheap, in this process: ``faultlab list targets`` shows it with what it offers and its
  settings; its ``topology.netns:`` block and its launch check are judged by faultlab's loader,
  with file:line locations.
- Real jobs (sleeping workers, no training): the built-in network faults reach its nodes
  through ``node_network`` (drop rules, a disconnect, a throttle), and everything it created
  is gone after ``stop`` with faults still in place; and after a SIGKILL of faultlab itself,
  through the guard (``guard_record``/``undo_from_guard``).

Its shipped experiment runs in test_example_plugin_e2e.py. Needs root, iproute2 and iptables
(CI's machine has them; the docker tests need the same).
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
from faultlab_example_plugin.netns import NetnsSettings, NetnsTarget
from faultlab_example_plugin.netns_network import present

from faultlab.cli import main
from faultlab.errors import InvalidExperimentError
from faultlab.fault_api import Victim
from faultlab.faults.network import NetworkPartitionFault, NetworkThrottleFault
from faultlab.spec import load_experiment
from faultlab.spec.loader import parse_experiment

REPO = Path(__file__).resolve().parents[2]
SLEEPERS = ("name: sleepers\ntarget: {command: [sleep, '120'], launch: faultlab}\n"
            "topology: {nodes: 2, launcher: netns, netns: {prefix: flt}}\n"
            "run: {timeout_s: 100}\n")


@pytest.fixture(scope="module", autouse=True)
def root_with_tools() -> None:
    assert os.geteuid() == 0, "the netns target needs root (namespaces, links, iptables)"


def _in_ns(ns: str, *argv: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True,
                          check=True).stdout


def test_faultlab_list_shows_the_target_what_it_offers_and_its_settings(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "targets"]) == 0
    out = capsys.readouterr().out
    assert "netns  (faultlab_example_plugin.netns:NetnsTarget; offers: node_network, " \
           "node_restart)" in out
    assert "    - topology.netns.subnet = IPv4Network('10.213.0.0/16'): " in out
    assert "    - topology.netns.prefix = 'fl': " in out
    assert main(["list", "faults"]) == 0
    [partition] = [line for line in capsys.readouterr().out.splitlines()
                   if line.startswith("network_partition  ")]
    assert "(topology.launcher: docker or netns)" in partition


def test_its_settings_and_launch_check_are_judged_with_locations(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ntarget: {trainer: reference, preset: tiny}\n"
                   "topology:\n  nodes: 2\n  launcher: netns\n  netns:\n"
                   "    prefix: Team-A\n    subnet: 10.213.0.5/16\n    bridge: br0\n")
    with pytest.raises(InvalidExperimentError) as e:
        load_experiment(bad)
    said = str(e.value)
    assert f"{bad}:7 topology.netns.prefix: 'Team-A': give 1-4 lower-case letters" in said
    assert f"{bad}:8 topology.netns.subnet: '10.213.0.5/16' is not an IPv4 subnet " \
           f"(10.213.0.5/16 has host bits set): give one such as '10.213.0.0/16'" in said
    assert f"{bad}:9 topology.netns.bridge: unknown key" in said
    # a team's own launch line: refused where it is written
    line = tmp_path / "line.yaml"
    line.write_text("name: line\ntarget:\n  command: [sleep, '1']\n  launch: torchrun\n"
                    "topology: {nodes: 2, launcher: netns}\n")
    with pytest.raises(InvalidExperimentError) as e:
        load_experiment(line)
    assert f"{line}:4 target.launch: " in str(e.value)
    assert "runs faultlab's own launcher only" in str(e.value)
    # no block: the defaults; a command with no launch runs under faultlab's launcher
    good = parse_experiment(SLEEPERS.replace(", netns: {prefix: flt}", ""),
                            tmp_path / "good.yaml")
    assert good.topology.settings == NetnsSettings()
    assert good.target.launch_line(good.topology.launcher) is None


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_network_faults_reach_its_nodes_and_stop_leaves_nothing(tmp_path: Path) -> None:
    exp = parse_experiment(SLEEPERS, tmp_path / "sleepers.yaml")
    target = NetnsTarget(exp, tmp_path / "job")
    record = target.guard_record()
    assert record is not None and record["namespaces"][0].startswith("flt-")
    target.start()
    try:
        nodes = target.node_names()
        gateway, addresses = target.store_address(), [target.node_address(n) for n in nodes]
        assert gateway and None not in addresses and len({gateway, *addresses}) == 3
        ns = record["namespaces"]
        assert target.node_netns_pid("node1") == target.job.agent_pid("node1")
        assert os.readlink(f"/proc/{target.node_netns_pid('node1')}/ns/net") != \
            os.readlink("/proc/self/ns/net")
        # drop rules in node 1's namespace only, for its peer and the store
        cut = NetworkPartitionFault(NetworkPartitionFault.Params.model_validate({}))
        done = cut.inject(target, Victim("node", 1))
        assert done["rules"]["node1"] == [
            f"{hook} {flag} {peer} DROP" for peer in (addresses[0], gateway)
            for hook, flag in (("INPUT", "-s"), ("OUTPUT", "-d"))]
        assert done["chain"] in _in_ns(ns[1], "iptables", "-S")
        assert done["chain"] not in _in_ns(ns[0], "iptables", "-S")
        # a throttle both ways: tbf on the node's eth0 and on the host side of its veth
        slow = NetworkThrottleFault(
            NetworkThrottleFault.Params.model_validate({"direction": "both"}))
        slow.inject(target, Victim("node", 0))
        assert "tbf" in _in_ns(ns[0], "tc", "qdisc", "show", "dev", "eth0")
        host = subprocess.run(["tc", "qdisc", "show", "dev", record["veths"][0]],
                              capture_output=True, text=True, check=True).stdout
        assert "tbf" in host
        # a disconnect takes the address away; undo gives it back
        off = NetworkPartitionFault(
            NetworkPartitionFault.Params.model_validate({"method": "disconnect"}))
        off.inject(target, Victim("node", 0))
        assert target.node_address("node0") is None
        assert off.undo(target) == {"rules_removed": [], "reconnected": ["node0"]}
        assert target.node_address("node0") == addresses[0]
        assert present(record)["namespaces"] == ns  # the cut and the throttle stay: stop
    finally:
        target.stop()
    assert present(record) == {"namespaces": [], "links": [], "iptables": []}


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_killed_faultlab_leaves_no_namespace_link_or_rule(tmp_path: Path) -> None:
    exp = tmp_path / "sleepers.yaml"
    exp.write_text(SLEEPERS + "faults:\n  - type: network_partition\n    target: {node: 1}\n"
                   "    trigger: {at_time_s: 1}\n    duration_s: 90\n")
    out = tmp_path / "faultlab.out"
    with open(out, "wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "faultlab.cli", "run", str(exp),
                                 "--report-dir", str(tmp_path / "reports")], cwd=REPO,
                                stdout=sink, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def said() -> str:  # what faultlab printed: all CI shows of a failure
        return f"faultlab printed:\n{out.read_text()[-3000:]}"

    try:
        record: dict[str, Any] | None = None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and record is None and proc.poll() is None:
            for found in (tmp_path / "reports").glob("*/job/launch.json"):
                record = json.loads(found.read_text())["network"]
            time.sleep(0.2)
        assert record is not None, f"the job never started\n{said()}"
        cut = False
        while time.monotonic() < deadline and not cut and proc.poll() is None:
            cut = "faultlab-" in _in_ns(record["namespaces"][1], "iptables", "-S")
            time.sleep(0.2)
        assert cut, f"network_partition never struck\n{said()}"
        assert present(record)["links"], "nothing to leave behind: the test proves nothing"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        left = present(record)
        deadline = time.monotonic() + 60  # the guard's own time, whatever the start took
        while time.monotonic() < deadline and any(left.values()):
            time.sleep(0.5)
            left = present(record)
        assert left == {"namespaces": [], "links": [], "iptables": []}, said()
    finally:
        if proc.poll() is None:
            proc.kill()
