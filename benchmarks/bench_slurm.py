"""The same experiment on local nodes and as a Slurm job: what the scheduler adds to recovery.

    python benchmarks/bench_slurm.py                  # ~6 min on 2 idle CPU cores, needs root
    python benchmarks/bench_slurm.py --rounds 2 --out slurm.json

Brings up the local Slurm test cluster (``scripts/slurm-cluster.sh up 3``; taken down at the
end) and runs, alternately and ``--rounds`` times each:

rank kill
    ``experiments/slurm_rank_kill.yaml`` (a team's own sbatch script, the unchanged FSDP2 + DCP
    example, SIGKILL rank 1 after step 9) against the same experiment with
    ``topology.launcher: local`` (torchrun agents on this host, the same command). torchrun
    restarts the workers in both; Slurm adds nothing to the path, so the resume times should
    be alike.
node loss
    ``experiments/node_loss_elastic.yaml`` (local: node 0's processes killed, rank 0's, the job
    shrinks to the survivors and goes on) against ``experiments/slurm_node_down.yaml`` and
    ``experiments/slurm_machine_loss.yaml`` (Slurm kills and requeues the whole job, which
    waits ``cred_expire`` + 1 s, then starts again on the spare). Different mechanisms, the
    same question: how long until the job trains again after it lost a node.

Printed: per experiment, the median over rounds of resume time, requeue latency (Slurm),
queue time and wall time, and each Slurm median over its local counterpart's. No golden run
(the SLAs that need one are dropped): recovery times only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks._slurm import cluster_down, cluster_up  # noqa: E402
from benchmarks._table import print_table  # noqa: E402
from faultlab.engine import run_experiment  # noqa: E402
from faultlab.spec import experiment_from_dict, load_experiment  # noqa: E402

EXP = REPO_ROOT / "experiments"
PAIRS = [("rank kill", "local_rank_kill", "slurm_rank_kill"),
         ("node loss", "node_loss_elastic", "slurm_node_down"),
         ("node loss", "node_loss_elastic", "slurm_machine_loss")]


def _experiment(name: str) -> Any:
    if name == "local_rank_kill":  # the Slurm experiment's job on local nodes
        doc = load_experiment(EXP / "slurm_rank_kill.yaml").model_dump(mode="json",
                                                                      exclude_none=True)
        doc["topology"] = {k: v for k, v in doc["topology"].items() if k != "slurm"}
        doc["topology"]["launcher"] = "local"
        doc["name"] = name
    else:
        doc = load_experiment(EXP / f"{name}.yaml").model_dump(mode="json", exclude_none=True)
    doc["expect"].pop("bitwise_equal_to_golden", None)
    return experiment_from_dict(doc)


def _run(name: str, reports: Path) -> dict[str, Any]:
    result = run_experiment(_experiment(name), report_dir=reports,
                            golden_cache=reports / ".golden")
    m = result.metrics
    wall = json.loads(result.journal_path.read_text())["run"]["wall_s"]
    row = {"experiment": name, "verdict": result.verdict, "resume_s": m.resume_time_s,
           "requeue_latency_s": m.requeue_latency_s, "queue_s": m.queue_time_s,
           "lost_steps": m.lost_steps, "wall_s": wall}
    print(json.dumps(row), flush=True)
    return row


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r[key] is not None]
    return statistics.median(values) if values else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_slurm: needs root (the local Slurm test cluster); skipped")
        return 0
    if not cluster_up(3):
        return 1
    names = sorted({n for _what, *pair in PAIRS for n in pair})
    rows: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-slurm-") as tmp:
            for _ in range(args.rounds):
                for name in names:  # alternating: every round runs each once
                    rows[name].append(_run(name, Path(tmp)))
    finally:
        cluster_down()
    table = []
    for what, local, slurm in PAIRS:
        for name in (local, slurm):
            r = rows[name]
            resume = _median(r, "resume_s")
            base = _median(rows[local], "resume_s")
            table.append([what, name, f"{sum(x['verdict'] == 'pass' for x in r)}/{len(r)}",
                          _fmt(resume), _fmt(_median(r, "requeue_latency_s")),
                          _fmt(_median(r, "queue_s")), _fmt(_median(r, "wall_s")),
                          "1.00" if name == local or not (resume and base)
                          else f"{resume / base:.2f}"])
    print_table("the same faults on local nodes and as a Slurm job",
                [f"{args.rounds} round(s), alternating; medians; local Slurm test cluster "
                 f"(cred_expire=10, sched_interval=2, SlurmdTimeout=10)"],
                ["fault", "experiment", "passed", "resume s", "requeue s", "queue s",
                 "wall s", "resume / local"], table,
                ["requeue s: the fault -> the job running again after Slurm requeued it; on "
                 "a cluster with Slurm's defaults add 110 s of hold (cred_expire 120 s) and up "
                 "to 58 s of scheduler pass"])
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


if __name__ == "__main__":
    sys.exit(main())
