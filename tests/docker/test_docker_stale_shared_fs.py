"""``stale_shared_fs`` and ``node_return`` on docker nodes: the shipped local experiment, its
nodes containers. The view answers for node 1's processes although they live in a container
(the storage passthrough names callers by host pid, their environment by ``FAULTLAB_NODE``),
and the node that comes back is waited for until the job has taken it back (its topmost
process is the container's init, not its agent)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from faultlab.engine import run_experiment
from faultlab.spec import experiment_from_dict
from faultlab.targets.docker.engine import run_resources

SHIPPED = Path(__file__).resolve().parents[2] / "experiments" / "stale_shared_fs.yaml"


def test_every_rank_resumes_from_one_step_when_node_1s_container_returns(
        docker_client: Any, tmp_path: Path) -> None:
    doc = yaml.safe_load(SHIPPED.read_text())
    doc["name"] = "stale_shared_fs_docker"
    doc["topology"]["launcher"] = "docker"
    result = run_experiment(experiment_from_dict(doc), report_dir=tmp_path)
    table = "\n".join(s.describe() for s in result.slas) + f"\njournal: {result.journal_path}"
    assert result.verdict == "pass", table  # fault_injected: node 1's view answered
    journal = json.loads(result.journal_path.read_text())
    by_id = {f["fault_id"]: f for f in journal["metrics"]["faults"]}
    # both ranks, node 1's container's included, resumed from node 0's step 12
    assert by_id["node-1-nfs-cache"]["resumed_by_rank"] == {
        "0": {"step": 12, "node": "node0"}, "1": {"step": 12, "node": "node1"}}, table
    [view] = [f for f in journal["faults"] if f["id"] == "node-1-nfs-cache"]
    assert view["details"]["undo"]["ops_answered"]["open"] > 0, view
    run_id = json.loads((result.run_folder / "job" / "launch.json").read_text())["run_id"]
    assert run_resources(docker_client, run_id) == {"containers": [], "networks": [],
                                                    "images": []}
