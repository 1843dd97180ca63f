"""The largest real job this machine holds (issue 37, item 6): the reference trainer at 32
ranks, 8 nodes of 4, on the local target, beside the 2- and 3-rank shipped experiments.

    python benchmarks/bench_large.py                 # ~15 min on 2 idle CPU cores
    python benchmarks/bench_large.py --nodes 4 --procs 4
    python benchmarks/bench_large.py --only slurm_rank_kill --slurm 8   # the Slurm cluster

Runs, each with its fault-free golden run (its own, at the same size):

- ``rank_kill``: SIGKILL rank 1 after step 15 of 40; must pass, bitwise equal to the golden run;
- ``node_loss_elastic``: node 0's processes (rank 0's node) killed after step 15; the job goes
  on with one node fewer (resharded), sample accounting exact (bitwise is not expected across
  world sizes).

Printed per run: verdict, wall time, the job's time, the engine's CPU per second of job (this
process's user + system time during the run, golden run excluded: it is cached first), the
resume time, and the step gate's wait (the engine opens the gate at the fault's step once the
fault is in; the wait is from each rank's record of that step to the gate's opening, as the
hub timed it: median and max over ranks), with the relays the hub saw.

- ``slurm_rank_kill`` with ``--slurm NODES``: the team's sbatch script (one rank a node) on the
  local Slurm test cluster, brought up with NODES nodes (``scripts/slurm-cluster.sh up NODES``,
  root and Docker; left up), at the shipped 2 nodes and at NODES; must pass, bitwise.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks._slurm import cluster_up  # noqa: E402
from benchmarks._table import print_table  # noqa: E402
from faultlab.engine import run_experiment  # noqa: E402
from faultlab.engine.golden import golden_run  # noqa: E402
from faultlab.runtime.events import read_events  # noqa: E402
from faultlab.spec import experiment_from_dict, load_experiment  # noqa: E402

EXP = REPO_ROOT / "experiments"


def _experiment(name: str, nodes: int | None, procs: int | None) -> Any:
    doc = load_experiment(EXP / f"{name}.yaml").model_dump(mode="json", exclude_none=True)
    if nodes is not None and doc["topology"].get("launcher") == "slurm":
        doc["topology"]["nodes"] = nodes  # the script runs one rank a node
        doc["name"] = f"{name}_{nodes}x1"
        for key in ("resume_time_s", "recovery_time_s", "detection_latency_s"):
            doc["expect"].pop(key, None)
        doc["run"]["timeout_s"] = 900
    elif nodes is not None:
        topo = doc["topology"]
        elastic = topo.get("min_nodes") is not None
        topo.update(nodes=nodes, procs_per_node=procs)
        if elastic:
            topo["min_nodes"] = nodes - 1
        doc["name"] = f"{name}_{nodes}x{procs}"
        # two samples a rank (the shipped 12 would leave ranks without one)
        doc["target"].setdefault("overrides", {})["global_batch"] = 2 * nodes * procs
        # every rank a process on 2 cores: the resume and detection bounds are for 2 ranks
        for key in ("resume_time_s", "recovery_time_s", "detection_latency_s"):
            doc["expect"].pop(key, None)
        doc["run"]["timeout_s"] = 1800
    return experiment_from_dict(doc)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _run(name: str, nodes: int | None, procs: int | None, reports: Path) -> list[str]:
    exp = _experiment(name, nodes, procs)
    if exp.expect.bitwise_equal_to_golden is not None:  # cached first: not the engine's CPU
        golden_run(exp, reports / ".golden", timeout_s=exp.run.timeout_s)
    cpu0, t0 = _cpu(), time.monotonic()
    result = run_experiment(exp, report_dir=reports, golden_cache=reports / ".golden")
    cpu, wall = _cpu() - cpu0, time.monotonic() - t0
    journal = json.loads(result.journal_path.read_text())
    run = journal["run"]
    plane = run.get("control_plane") or {}
    fault = journal["faults"][0] if journal["faults"] else {}
    waits: list[float] = []
    opened = plane.get("gates_opened_t", {}).get(str(fault.get("at_step")))
    if opened is not None:
        events = read_events(Path(run["job_dir"]) / "events")
        at = [e["t"] for e in events if e["kind"] == "step" and e.get("step") ==
              fault.get("at_step") and e.get("restart", 0) == 0]
        waits = [max(0.0, opened - t) for t in at]
    m = result.metrics
    topo = exp.topology
    row = {"experiment": name, "ranks": topo.nodes * topo.procs_per_node, "nodes": topo.nodes,
           "verdict": result.verdict, "wall_s": wall, "job_s": run["job_s"],
           "engine_cpu_per_job_s": cpu / run["job_s"] if run["job_s"] else None,
           "resume_s": m.resume_time_s, "lost_steps": m.lost_steps,
           "gate_wait_median_s": statistics.median(waits) if waits else None,
           "gate_wait_max_s": max(waits) if waits else None,
           "relays": len(plane.get("relays", {})),
           "failures": [f"{s.name}: {s.measured}" for s in result.failures()]}
    print(json.dumps(row), flush=True)

    def f(v: float | None, d: int = 2) -> str:
        return "-" if v is None else f"{v:.{d}f}"
    return [name, str(row["ranks"]), str(row["relays"]), result.verdict, f(wall, 1),
            f(run["job_s"], 1), f(row["engine_cpu_per_job_s"], 3), f(m.resume_time_s),
            str(m.lost_steps), f(row["gate_wait_median_s"], 3), f(row["gate_wait_max_s"], 3)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--procs", type=int, default=4, help="ranks per node")
    parser.add_argument("--only", choices=["rank_kill", "node_loss_elastic", "slurm_rank_kill"],
                        default=None)
    parser.add_argument("--slurm", type=int, default=0, metavar="NODES",
                        help="also run slurm_rank_kill on the local Slurm test cluster at 2 "
                             "nodes and at NODES (brought up with NODES nodes)")
    args = parser.parse_args(argv)
    rows = []
    failed = False
    runs: list[tuple[str, list[tuple[int | None, int | None]]]] = [
        ("rank_kill", [(None, None), (args.nodes, args.procs)]),
        ("node_loss_elastic", [(None, None), (args.nodes, args.procs)])]
    if args.slurm:
        if not cluster_up(args.slurm):
            return 1
        runs.append(("slurm_rank_kill", [(None, None), (args.slurm, 1)]))
    with tempfile.TemporaryDirectory(prefix="faultlab-bench-large-") as tmp:
        for name, sizes in runs:
            if args.only not in (None, name):
                continue
            for nodes, procs in sizes:
                row = _run(name, nodes, procs, Path(tmp))
                failed |= row[3] != "pass"
                rows.append(row)
    print_table(
        "the largest real job on this machine", [
            "reference trainer (tiny), local target, gloo on 2 CPU cores; shipped sizes "
            f"(2 and 3 ranks) beside {args.nodes} nodes x {args.procs} ranks"
            + (f"; slurm_rank_kill: examples/fsdp2_dcp's sbatch job on the local Slurm "
               f"cluster, 2 and {args.slurm} nodes of 1 rank" if args.slurm else ""),
            "engine CPU: faultlab's own process (user + system) per second of job, golden "
            "run excluded; gate wait: from a rank's record of the fault's step to the gate's "
            "opening"],
        ["experiment", "ranks", "relays", "verdict", "wall s", "job s", "engine CPU/s",
         "resume s", "lost", "gate wait med s", "gate wait max s"], rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
