"""Node loss with each node a Docker container: the team's launch line inside every container
against faultlab's tuned launcher, side by side in one run.

The same unchanged FSDP2 + DCP trainer as bench_launchers.py (examples/fsdp2_dcp/train.py: 16
steps, a DCP checkpoint every 4, 2 nodes of 1 rank, elastic to 1, 2 restarts allowed), each node
a container on the run's own network, and a node lost (``docker kill``) after step 8, under:

- ``torchrun``: plain torchrun with its defaults, inside each container (its endpoint node 0's
  name, ``node0:29400``: node 0's agent hosts the c10d store);
- ``torchrun + flags``: the same line with only what faultlab recommends added
  (``--rdzv-conf last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3``,
  ``env TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``);
- ``faultlab``: faultlab's tuned agents in the containers, its store on the host (the bar).

Runs are interleaved (stack after stack in each round) so the machine's load falls on every
stack alike. Needs a Docker engine (scripts/docker-engine.sh).

    python benchmarks/bench_docker_launch.py [--runs 3] [--faults node0,node1]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from _table import print_table, spread
from bench_launchers import STACKS as LOCAL_STACKS

from faultlab.engine import run_experiment
from faultlab.spec import experiment_from_dict
from faultlab.targets.docker.engine import engine_problem

ROOT = Path(__file__).resolve().parents[1]
STACKS = {name: LOCAL_STACKS[name] for name in ("torchrun", "torchrun + flags", "faultlab")}
"""bench_launchers.py's lines, the same flags, on docker nodes."""
FAULT_NAMES = {"node0": "loss of the store's node (0)", "node1": "loss of node 1"}


def experiment(stack: str, fault: str):  # type: ignore[no-untyped-def]
    return experiment_from_dict({
        "name": f"bench_docker_{fault}_{stack.replace(' + ', '_')}",
        "target": {"command": ["python", str(ROOT / "examples/fsdp2_dcp/train.py"), "--steps",
                               "16", "--ckpt-every", "4", "--ckpt-dir",
                               "{run_dir}/checkpoints"],
                   "launch": STACKS[stack]},
        "topology": {"nodes": 2, "procs_per_node": 1, "min_nodes": 1, "max_restarts": 2,
                     "launcher": "docker"},
        "run": {"steps": 16, "timeout_s": 240},
        "faults": [{"id": "kill", "type": "node_kill", "target": {"node": int(fault[-1])},
                    "trigger": {"at_step": 9}}],
        "expect": {"completes": True}})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--faults", default="node0,node1", help="of: node0, node1")
    args = p.parse_args(argv)
    problem = engine_problem()
    if problem is not None:
        print(f"bench_docker_launch: {problem}", file=sys.stderr)
        return 2
    faults = args.faults.split(",")
    results: dict[tuple[str, str], list] = {(s, f): [] for s in STACKS for f in faults}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-docker-launch-") as tmp:
        for round_ in range(args.runs):
            for fault in faults:
                for stack in STACKS:
                    r = run_experiment(experiment(stack, fault), report_dir=Path(tmp))
                    m = r.metrics
                    results[(stack, fault)].append(r)
                    causes = [f["cause"] for f in json.loads(r.journal_path.read_text())
                              ["run"].get("launch_findings") or []]
                    print(f"round {round_ + 1} {fault:5} {stack:16} completes={m.completes} "
                          f"restarts={m.restarts} detection={m.detection_latency_s} "
                          f"resume={m.resume_time_s} lost={m.lost_steps} "
                          f"findings={causes or '-'} wall={m.wall_s:.1f}", flush=True)
    rows = []
    for fault in faults:
        for stack in STACKS:
            ms = [r.metrics for r in results[(stack, fault)]]
            rows.append([FAULT_NAMES[fault], stack,
                         f"{sum(m.completes for m in ms)}/{len(ms)}",
                         spread([m.detection_latency_s for m in ms
                                 if m.detection_latency_s is not None]),
                         spread([m.resume_time_s for m in ms if m.resume_time_s is not None]),
                         spread([float(m.lost_steps) for m in ms if m.lost_steps is not None],
                                unit=""),
                         spread([float(m.restarts) for m in ms], unit="")])
    print_table("node loss on docker nodes under three launch stacks",
                [f"examples/fsdp2_dcp/train.py, 16 steps, checkpoint every 4, 2 container "
                 f"nodes x 1 rank (elastic to 1), docker kill after step 8; {args.runs} "
                 f"interleaved runs each; {time.monotonic() - t0:.0f} s in all",
                 "median [min-max] over the runs that measured it"],
                ["fault", "stack", "survived", "detection", "resume", "lost steps", "restarts"],
                rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
