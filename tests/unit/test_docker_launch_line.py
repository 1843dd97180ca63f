"""The team's launch line on docker nodes: what it is filled with there, and the located errors
for a line that cannot work inside a container (no engine needed: the containers see exactly
``docker_node_paths``, which these tests read)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from faultlab.spec import experiment_from_dict, parse_experiment
from faultlab.spec.launch import TORCHRUN_DEFAULT, docker_node_paths
from faultlab.targets.docker.job import DockerJob
from tests.unit.test_spec import doc, one_problem

TRAIN = "[python, examples/fsdp2_dcp/train.py, --steps, '4']"
DOCKER = "topology: {nodes: 2, procs_per_node: 1, launcher: docker}"


def launch(line: str) -> str:
    return doc(target=f"target: {{command: {TRAIN}, launch: {line}}}", topology=DOCKER)


def _script(path: Path, shebang: str) -> Path:
    path.write_text(f"#!{shebang}\nexec torchrun \"$@\"\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_docker_runs_the_teams_line_with_torchrun_as_the_commands_default() -> None:
    for launch_ in (None, "torchrun"):
        exp = experiment_from_dict({"name": "a", "topology": {"nodes": 2, "launcher": "docker"},
                                    "target": {"command": ["python",
                                                           "examples/fsdp2_dcp/train.py"],
                                               **({"launch": launch_} if launch_ else {})}})
        assert exp.target.launch_line("docker") == TORCHRUN_DEFAULT
    reference = experiment_from_dict({"name": "a", "topology": {"launcher": "docker"}})
    assert reference.target.launch_line("docker") is None  # the reference stack stays tuned


def test_a_launcher_outside_what_the_containers_see_is_located(tmp_path: Path) -> None:
    assert not any(str(tmp_path).startswith(r.rstrip("/") + "/") for r in docker_node_paths())
    outside = _script(tmp_path / "my_launcher", "/bin/sh")
    _line, at, text = one_problem(launch(f"['{outside}', --rdzv-endpoint, '{{rdzv_endpoint}}']"))
    assert at == "target.launch[0]"
    assert text.startswith(f"'{outside}' is not inside the docker nodes: each container sees "
                           f"only "), text
    assert sys.prefix in text and "install the launcher in the virtual environment" in text


def test_a_launcher_whose_interpreter_the_containers_lack_is_located(tmp_path: Path) -> None:
    # A console script inside the project (seen by the containers) whose #! names an
    # interpreter outside them (a pipx or ~/.local install): it would fail in every node.
    inside = Path(os.getcwd()) / f".test_launcher_{os.getpid()}"
    try:
        _script(inside, str(tmp_path / "python3"))
        _line, at, text = one_problem(launch(f"['{inside}', --rdzv-endpoint, "
                                             f"'{{rdzv_endpoint}}']"))
        assert at == "target.launch[0]"
        assert f"starts with #!{tmp_path / 'python3'}, which is not inside the docker " \
               "nodes" in text, text
    finally:
        inside.unlink(missing_ok=True)


@pytest.mark.parametrize(("line", "where", "bad"), [
    ("[torchrun, --nnodes, '2', --rdzv-backend, c10d, --rdzv-endpoint, 'localhost:{master_port}']",
     "target.launch[6]", "'localhost'"),
    ("[torchrun, --nnodes, '2', --node-rank, '{node_rank}', --master-addr, '127.0.0.1', "
     "--master-port, '{master_port}']", "target.launch[6]", "'127.0.0.1'"),
    ("[torchrun, --nnodes, '2', --rdzv-endpoint, '{rdzv_endpoint}', --local-addr, localhost]",
     "target.launch[6]", "'localhost'"),
])
def test_a_loopback_address_is_located_on_docker_but_not_on_local(line: str, where: str,
                                                                    bad: str) -> None:
    _line, at, text = one_problem(launch(line))
    assert at == where
    assert text.startswith(f"{bad} is each container's own loopback on docker nodes: the "
                           f"nodes would never meet"), text
    local = doc(target=f"target: {{command: {TRAIN}, launch: {line}}}",
                topology="topology: {nodes: 2, procs_per_node: 1}")
    assert parse_experiment(local, "local.yaml").topology.launcher == "local"  # valid there


def test_a_fixed_port_is_refused_on_docker_too() -> None:
    _line, at, text = one_problem(launch("[torchrun, --nnodes, '2', --rdzv-endpoint, "
                                         "'node0:29400']"))
    assert at == "target.launch[4]" and text.startswith("'node0:29400' is a fixed port"), text


def test_docker_fills_node0s_name_and_torchruns_ports(tmp_path: Path) -> None:
    job = DockerJob(command=[sys.executable, "train.py"], run_dir=tmp_path, nodes=2,
                    min_nodes=1, launch_line=(
                        "torchrun", "--nnodes", "{nnodes}", "--rdzv-backend", "c10d",
                        "--rdzv-endpoint", "{rdzv_endpoint}", "--master-addr", "{master_addr}",
                        "--master-port", "{master_port}"))
    endpoint, conf = job._start_rendezvous("172.30.0.1")  # no store of faultlab's is started
    assert (endpoint, conf, job._store) == ("node0:29400", "", None)
    line = job.node_line(1, endpoint)
    assert line[1:] == ["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                        "node0:29400", "--master-addr", "node0", "--master-port", "29500",
                        "train.py"]


def test_a_torchrun_world_per_node_is_refused_on_docker_at_its_placeholder() -> None:
    # torchft's replica groups: each node's own port is filled on local nodes only
    _line, at, text = one_problem(launch("[torchrun, --nnodes, '1', --master-port, "
                                         "'{node_master_port}']"))
    assert at == "target.launch[4]"
    assert text == ("a torchrun world per node (torchft's replica groups) runs on local nodes "
                    "only (topology.launcher: local)")
