"""End-to-end recovery of one trainer under different launch stacks, side by side in one run.

The same unchanged FSDP2 + DCP trainer (examples/fsdp2_dcp/train.py: 16 steps, a DCP checkpoint
every 4, 2 local nodes of 1 rank, elastic to 1, 2 restarts allowed) and the same faults, each
struck after step 8 through faultlab's step gate, under:

- ``torchrun``: plain torchrun, its defaults (the store in node 0's agent, a last call of 30 s,
  keep-alive 5 s x 3, workers sharing the agent's store);
- ``torchrun + flags``: the same line with only what faultlab recommends added, nothing of
  faultlab's in production: ``--rdzv-conf last_call_timeout=1,keep_alive_interval=1,
  keep_alive_max_attempt=3`` and ``env TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``;
- ``faultlab``: faultlab's tuned launcher (its store in a process of its own, 0.1 s rendezvous
  polls), the bar;
- ``ft_launcher``: NVIDIA Resiliency Extension 0.4.1's launcher (torchrun's flags, its own c10d
  rendezvous handler, a rank monitor beside every rank), running examples/nvrx_ft/train.py: the
  same model, data and DCP checkpoints, plus NVRx heartbeats (one per step; a rank silent for
  5 s is hung: its monitor kills it and ft_launcher restarts the group in place).

Faults: a rank SIGKILLed (rank 1), the loss of node 0 (agent and rank: under torchrun its
agent hosts the store), the loss of node 1. Runs are interleaved (stack after stack for each
round), so the machine's load falls on every stack alike. Columns per (stack, fault): survived
(the job completed) k/n, and the median [min-max] of detection, resume and lost steps over the
runs that measured them. Rank hang (SIGSTOP of rank 1) and collective hang (rank 1 held inside
its next collective) are measured for ft_launcher only (``--faults`` picks them; ``--stacks``
picks stacks): a plain trainer never notices either under torchrun or faultlab's launcher
(examples/*/collective_hang.yaml), so there the launcher does not enter and the run would only
wait out the hang; under ft_launcher its heartbeat timeout is what catches them. torchft is not
measured here yet (issue 32).

    python benchmarks/bench_launchers.py [--runs 3] [--faults rank,node0,node1,hang,coll_hang]
                                         [--stacks torchrun,ft_launcher]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _table import print_table

from faultlab.engine import run_experiment
from faultlab.spec import experiment_from_dict
from faultlab.spec.launch import TORCHRUN_DEFAULT

ROOT = Path(__file__).resolve().parents[1]
RDZV = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3"
STACKS: dict[str, object] = {
    "torchrun": list(TORCHRUN_DEFAULT),
    "torchrun + flags": ["env", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1", *TORCHRUN_DEFAULT,
                         "--rdzv-conf", RDZV],
    "faultlab": "faultlab",
    "ft_launcher": ["ft_launcher", "--nnodes", "{nnodes}", "--nproc-per-node", "{nproc_per_node}",
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", "{rdzv_endpoint}",
                    "--rdzv-id", "{rdzv_id}", "--max-restarts", "{max_restarts}",
                    "--ft-initial-rank-heartbeat-timeout", "60",
                    "--ft-rank-heartbeat-timeout", "5", "--ft-workload-check-interval", "1"],
}
TRAINERS = {"ft_launcher": "examples/nvrx_ft/train.py"}
"""A stack's trainer where it is not examples/fsdp2_dcp/train.py (the same work, its API added)."""
HANG_STACKS = ("ft_launcher",)
"""Stacks whose launcher can notice a hang of a plain trainer (module docstring)."""
FAULTS = {
    "rank": {"id": "kill", "type": "rank_kill", "target": {"rank": 1}},
    "node0": {"id": "kill", "type": "node_kill", "target": {"node": 0}},
    "node1": {"id": "kill", "type": "node_kill", "target": {"node": 1}},
    # until the job reacts, and in any case after 60 s (then the run goes on as if it had not)
    "hang": {"id": "hang", "type": "rank_hang", "target": {"rank": 1}, "until": "reaction",
             "duration_s": 60},
    "coll_hang": {"id": "hang", "type": "collective_hang", "target": {"rank": 1},
                  "until": "reaction", "duration_s": 60},
}
FAULT_NAMES = {"rank": "rank kill", "node0": "loss of the store's node (0)",
               "node1": "loss of node 1", "hang": "rank hang (SIGSTOP)",
               "coll_hang": "collective hang"}


def experiment(stack: str, fault: str):  # type: ignore[no-untyped-def]
    return experiment_from_dict({
        "name": f"bench_{fault}_{stack.replace(' + ', '_').replace(' ', '_')}",
        "target": {"command": ["python", str(ROOT / TRAINERS.get(stack,
                                                                 "examples/fsdp2_dcp/train.py")),
                               "--steps",
                               "16", "--ckpt-every", "4", "--ckpt-dir",
                               "{run_dir}/checkpoints"],
                   "launch": STACKS[stack]},
        "topology": {"nodes": 2, "procs_per_node": 1, "min_nodes": 1, "max_restarts": 2},
        "run": {"steps": 16, "timeout_s": 240},
        "faults": [{**FAULTS[fault], "trigger": {"at_step": 9}}],
        "expect": {"completes": True}})


def spread(values: list[float], unit: str = " s") -> str:
    if not values:
        return "—"
    fmt = (lambda v: f"{v:.2f}") if unit else (lambda v: f"{v:g}")
    return (f"{fmt(statistics.median(values))}{unit} [{fmt(min(values))}-{fmt(max(values))}]"
            if len(values) > 1 else f"{fmt(values[0])}{unit}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--faults", default="rank,node0,node1,hang,coll_hang")
    p.add_argument("--stacks", default=",".join(STACKS))
    args = p.parse_args(argv)
    faults = args.faults.split(",")
    stacks = args.stacks.split(",")
    for name, known in (("fault", FAULTS), ("stack", STACKS)):
        bad = [x for x in (faults if name == "fault" else stacks) if x not in known]
        if bad:
            p.error(f"--{name}s: {', '.join(map(repr, bad))} unknown; choose from "
                    f"{', '.join(known)}")

    def pairs(fault: str) -> list[str]:
        hang = fault in ("hang", "coll_hang")
        return [s for s in stacks if not hang or s in HANG_STACKS]

    results: dict[tuple[str, str], list] = {(s, f): [] for f in faults for s in pairs(f)}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-launchers-") as tmp:
        for round_ in range(args.runs):
            for fault in faults:
                for stack in pairs(fault):
                    r = run_experiment(experiment(stack, fault), report_dir=Path(tmp),
                                       golden_cache=Path(tmp) / ".golden")
                    m = r.metrics
                    results[(stack, fault)].append(r)
                    print(f"round {round_ + 1} {fault:5} {stack:16} completes={m.completes} "
                          f"restarts={m.restarts} detection={m.detection_latency_s} "
                          f"resume={m.resume_time_s} lost={m.lost_steps}", flush=True)
    rows = []
    for fault in faults:
        for stack in pairs(fault):
            runs = results[(stack, fault)]
            ms = [r.metrics for r in runs]
            rows.append([FAULT_NAMES[fault], stack,
                         f"{sum(m.completes for m in ms)}/{len(ms)}",
                         spread([m.detection_latency_s for m in ms
                                 if m.detection_latency_s is not None]),
                         spread([m.resume_time_s for m in ms if m.resume_time_s is not None]),
                         spread([float(m.lost_steps) for m in ms if m.lost_steps is not None],
                                unit=""),
                         spread([float(m.restarts) for m in ms], unit="")])
    print_table(f"recovery of one trainer under {len(stacks)} launch stacks",
                [f"examples/fsdp2_dcp/train.py (ft_launcher: examples/nvrx_ft/train.py, the "
                 f"same work with NVRx heartbeats), 16 steps, checkpoint every 4, 2 nodes x 1 "
                 f"rank (elastic to 1), fault after step 8; {args.runs} interleaved runs each; "
                 f"{time.monotonic() - t0:.0f} s in all",
                 "median [min-max] over the runs that measured it"],
                ["fault", "stack", "survived", "detection", "resume", "lost steps", "restarts"],
                rows, notes=[f"{FAULT_NAMES[f]}: not run under {', '.join(left)}, where this "
                             f"trainer never notices a hang (gloo waits 30 min; "
                             f"examples/fsdp2_dcp/experiments/collective_hang.yaml)"
                             for f in faults if f in ("hang", "coll_hang")
                             for left in [[s for s in stacks if s not in pairs(f)]] if left])
    return 0


if __name__ == "__main__":
    sys.exit(main())
