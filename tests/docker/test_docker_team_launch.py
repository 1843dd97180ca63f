"""The team's own launch line inside docker nodes: real torchrun in real containers.

torchrun runs in every container as it would on a machine: its c10d endpoint is node 0's name on
the run's network (``node0:29400``), node 0's agent hosts the store, and each agent advertises its
hostname (``nodeN``, its alias on that network) to the others. What faultlab adds stays true:
the ranks get the runtime agent through the bootstrap (an in-rank fault strikes inside a
container), ``node_kill`` takes every process of the container, and nothing of the run is left
in the engine afterwards. (A killed faultlab leaves nothing either: test_docker_target.py.)
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import psutil

from faultlab.engine import run_experiment
from faultlab.spec import experiment_from_dict, load_experiment
from faultlab.spec.launch import TORCHRUN_DEFAULT
from faultlab.targets.docker import DockerTarget
from faultlab.targets.docker.engine import run_resources
from faultlab.targets.docker.job import listening_ports

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "fsdp2_dcp" / "experiments"
NOTHING = {"containers": [], "networks": [], "images": []}


def _until(check: Any, timeout_s: float, what: str, logs: Any = lambda: "") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout_s} s\n{logs()}")


def test_node_kill_takes_the_whole_container_under_the_teams_line(docker_client: Any,
                                                                  tmp_path: Path) -> None:
    # the team's own line, torchrun's INFO log on (it prints each rendezvous' result)
    line = ["env", "LOGLEVEL=INFO", "torchrun", "--nnodes", "{nnodes}", "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", "{rdzv_endpoint}", "--max-restarts",
            "0", "--no-python"]
    exp = experiment_from_dict({
        "name": "docker_team_sleep",
        "target": {"command": ["sh", "-c", "echo MASTER_ADDR=$MASTER_ADDR; exec sleep 300"],
                   "launch": line},
        "topology": {"nodes": 2, "launcher": "docker"}})
    target = DockerTarget(exp, tmp_path / "job")
    run_id = target.run_id
    target.start()
    try:
        job = target.job
        assert job.describe().count("--rdzv-endpoint node0:29400") == 2, job.describe()
        logs = [tmp_path / "job" / "logs" / f"node{i}.log" for i in (0, 1)]
        # one rendezvous of both nodes: group ranks 0 and 1, and the workers of both told the
        # master address rank 0's agent advertised, its hostname, which resolves in every
        # container of the run's network
        _until(lambda: all(log.read_text().count("MASTER_ADDR=node0") == 1 for log in logs),
               60, "both workers started", job.log_tail)
        for i, log in enumerate(logs):
            assert f"group_rank={i}\n" in log.read_text() and \
                "group_world_size=2\n" in log.read_text(), job.log_tail()
        # the c10d store listens in node 0's container only (torchrun's own, at the endpoint)
        assert [29400 in listening_ports(target.node_netns_pid(f"node{i}")) for i in (0, 1)] \
            == [True, False]
        victims = _until(lambda: job.worker_pids("node1"), 60, "node1's worker", job.log_tail)
        tree = {p.pid for p in psutil.Process(job.agent_pid("node1")).children(recursive=True)}
        survivors = job.worker_pids("node0")
        assert survivors and set(victims) <= tree
        killed = target.kill_node("node1", signal.SIGKILL)
        assert set(victims) | {job.agent_pid("node1")} <= set(killed)
        _until(lambda: not any(psutil.pid_exists(p) for p in killed), 10,
               "every process of node1 gone")
        _until(lambda: docker_client.containers.get(f"faultlab-{run_id}-node1").status
               == "exited", 30, "node1's container exited")  # dockerd learns it after
        assert all(psutil.pid_exists(p) for p in survivors)  # the other node is untouched
    finally:
        target.stop()
    assert run_resources(docker_client, run_id) == NOTHING


def test_an_in_rank_fault_reaches_a_rank_in_a_container_under_torchrun(
        docker_client: Any, tmp_path: Path) -> None:
    """examples/fsdp2_dcp's NaN-gradient experiment, its nodes containers under plain
    torchrun: the runtime agent, bootstrapped into the unchanged trainer, strikes in rank 0."""
    shipped = load_experiment(EXAMPLES / "grad_nan.yaml")
    exp = experiment_from_dict({
        **shipped.model_dump(mode="json", exclude_none=True, exclude={"expect", "target"}),
        "name": "docker_grad_nan_torchrun",
        "target": {"command": list(shipped.target.command or []), "launch": "torchrun"},
        "topology": {**shipped.topology.model_dump(mode="json", exclude_none=True),
                     "launcher": "docker"},
        "expect": {"completes": True}})
    result = run_experiment(exp, report_dir=tmp_path)
    table = "\n".join(s.describe() for s in result.slas) + f"\njournal: {result.journal_path}"
    assert result.verdict == "pass", table
    assert {s.name: s.passed for s in result.slas}["fault_injected[nan]"], table
    job = result.run_folder / "job"
    struck = [json.loads(line) for f in (job / "events").glob("*.jsonl")
              for line in f.read_text().splitlines() if '"fault_injected"' in line]
    assert [(e["node"], e["rank"]) for e in struck] == [("node0", 0)], struck
    launch = json.loads(result.journal_path.read_text())["run"]["launch"]
    assert launch == {"launch": list(TORCHRUN_DEFAULT),
                      "filled": {**launch["filled"], "rdzv_endpoint": "node0:29400"}}
    run_id = json.loads((job / "launch.json").read_text())["run_id"]
    assert run_resources(docker_client, run_id) == NOTHING

