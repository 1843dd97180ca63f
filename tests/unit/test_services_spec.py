"""``target.services`` and nodes that are worlds of their own (torchft's lighthouse and replica
groups): the spec's located errors, each node's filled line and faultlab's rank numbering."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from faultlab.runtime.identity import Identity
from faultlab.spec import experiment_from_dict
from faultlab.targets.launcher import LocalJob
from tests.unit.test_spec import doc, one_problem

TRAIN = "[python, examples/torchft_ddp/train.py, --steps, '4']"
LIGHTHOUSE = "{lighthouse: [python, -c, 'pass', '{lighthouse_port}']}"
GROUPS = ("[env, 'TORCHFT_LIGHTHOUSE=http://127.0.0.1:{lighthouse_port}', torchrun, --nnodes, "
          "'1', --master-port, '{node_master_port}']")


def target(services: str = LIGHTHOUSE, launch: str = GROUPS) -> str:
    return f"target: {{command: {TRAIN}, services: {services}, launch: {launch}}}"


@pytest.mark.parametrize(("services", "launch", "where", "message"), [
    # the nodes name a service that is not there
    ("{}", GROUPS, "target.launch[1]",
     "{lighthouse_port} is not a placeholder faultlab fills; it fills {run_dir}, "),
    # torchft not installed: refused before anything starts, at the program's place
    ("{lighthouse: [no_torchft_lighthouse_here, --min_replicas, '1']}", GROUPS,
     "target.services.lighthouse[0]", "'no_torchft_lighthouse_here' is not found: not on PATH"),
    ("{lighthouse: [python, '{nope}']}", GROUPS, "target.services.lighthouse[1]",
     "{nope} is not a placeholder faultlab fills in a service's line"),
    # a service runs once for the job: a node's placeholder means nothing there
    ("{lighthouse: [python, '{node_rank}', '{lighthouse_port}']}", GROUPS,
     "target.services.lighthouse[1]", "{node_rank} is a node's or the rendezvous's"),
    ("{Light-House: [python]}", "[torchrun, --master-port, '{node_master_port}']",
     "target.services.Light-House", "'Light-House' is not a service name"),
])
def test_a_bad_service_is_one_located_error(services: str, launch: str, where: str,
                                            message: str) -> None:
    _line, at, text = one_problem(doc(target=target(services, launch)))
    assert at == where and text.startswith(message), text


def test_the_missing_services_placeholder_says_where_services_are_named() -> None:
    _line, _at, text = one_problem(doc(target=target("{}")))
    assert "(a service's port: name the service under target.services)" in text


def test_services_run_beside_local_nodes_only() -> None:
    """Where the target offers the services capability (of the built-ins, local only)."""
    _line, at, text = one_problem(doc(target=target(launch="faultlab"),
                                      topology="topology: {nodes: 2, launcher: docker}"))
    assert at == "target.services" and text.startswith(
        "services run beside the nodes only where the target offers them (")
    assert text.endswith("topology.launcher 'docker' does not; launchers that do: local")


def test_service_kill_must_name_a_service_of_the_experiment() -> None:
    kill = """\
    - type: service_kill
      target: all
      params: {service: lighthous}
      trigger: {at_step: 2}
    """
    _line, at, text = one_problem(doc(kill, target=target(),
                                      topology="topology: {nodes: 2, procs_per_node: 1}"))
    assert at == "faults[0].params.service"
    assert text == ("service_kill: no service 'lighthous': the experiment's services are "
                    "'lighthouse'")


def test_a_node_kill_cannot_be_aimed_at_a_service() -> None:
    kill = """\
    - type: service_kill
      target: {node: 0}
      params: {service: lighthouse}
      trigger: {at_step: 2}
    """
    _line, at, text = one_problem(doc(kill, target=target(),
                                      topology="topology: {nodes: 2, procs_per_node: 1}"))
    assert at == "faults[0].target" and "service_kill cannot target a node" in text


def test_each_replica_group_is_a_world_of_its_own_and_faultlab_numbers_its_ranks(
        tmp_path: Path) -> None:
    exp = experiment_from_dict({"name": "a", "topology": {"nodes": 2, "procs_per_node": 2},
                                "target": {"command": ["python", "examples/torchft_ddp/train.py"],
                                           "services": {"lighthouse": ["python"]},
                                           "launch": ["torchrun", "--master-port",
                                                      "{node_master_port}"]}})
    job = LocalJob(command=[sys.executable, "t.py"], run_dir=tmp_path, nodes=2,
                   procs_per_node=2, launch_line=exp.target.launch_line())
    ports = {job.node_line(i, "127.0.0.1:4242")[2] for i in (0, 1)}
    assert len(ports) == 2 and all(p.isdigit() for p in ports)  # a port of each node's own
    env = job.node_environment("node1")
    assert (env["FAULTLAB_RANK_OFFSET"], env["FAULTLAB_WORLD_SIZE"]) == ("2", "4")
    # node 1's second rank is RANK 1 of its own world, rank 3 of the job for faultlab
    ident = Identity.from_env({"FAULTLAB_RUN_DIR": str(tmp_path), "RANK": "1",
                               "WORLD_SIZE": "2", **env})
    assert (ident.rank, ident.world_size) == (3, 4)
    # a line whose nodes share one world keeps torchrun's numbering
    shared = LocalJob(command=[sys.executable, "t.py"], run_dir=tmp_path, nodes=2,
                      launch_line=("torchrun", "--rdzv-endpoint", "{rdzv_endpoint}"))
    assert "FAULTLAB_RANK_OFFSET" not in shared.node_environment("node1")
