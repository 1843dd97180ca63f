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
  5 s is hung: its monitor kills it and ft_launcher restarts the group in place);
- ``torchft``: torchft 0.2.0 as its docs launch it, on the same model and data
  (examples/torchft_ddp/train.py, 16 steps): its lighthouse as a service and one torchrun per
  replica group (node), each restarting its own rank (``--max-restarts 2``), the lighthouse
  with ``--min_replicas 2`` as in the examples and torchft's own recovery tests (with 1, the
  groups do not start together here: runs were decided by which group's manager came up
  first), a quorum timeout of 10 s (train.py's default is 30). Its resume column is the
  heal time (the fault → the struck group's first committed step; ``--`` when no group was
  struck) and its lost steps the survivors' (``faultlab.observe.healing``); torchft keeps no
  checkpoint, so a healed group's steps are its peer's;
- ``torchrun + etcd``: the recommended line with its rendezvous in etcd, outside the nodes
  (``--rdzv-backend etcd-v2``): Debian's ``etcd-server`` 3.4 as a ``target.services`` entry
  (``--enable-v2=true``, its client URL on ``{etcd_port}``), the client library
  ``python-etcd``;
- ``torchrun + store``: the recommended line with ``--rdzv-conf is_host=false``, every agent a
  client of a TCPStore that the team runs as a service (``faultlab.observe.launch_fixes``'
  store, the fix ``--with-fix`` applies for ``store_lost``).

Faults: a rank SIGKILLed (rank 1), the loss of node 0 (agent and rank: under torchrun its
agent hosts the store; torchft's group 0), the loss of node 1, rank 1 hung (SIGSTOP) and rank
1 held inside its next collective, both lifted at the stack's first reaction or after 20 s,
and the service the stack depends on killed (torchft's lighthouse, the etcd server, the
store). Runs are interleaved (stack after stack for each
round), so the machine's load falls on every stack alike. Columns per (stack, fault): survived
(the job completed) k/n, and the median [min-max] of detection, resume and lost steps over the
runs that measured them. A hang that no part of the stack notices (the plain trainer waits
gloo's 30 min under torchrun or faultlab's launcher: examples/*/collective_hang.yaml) is lifted
by faultlab after 20 s: such a run "survives" only because of that, and shows no detection. A
collective hang is left out for torchft: its DDP reduces through torchft's own
ProcessGroupGloo object, not through ``torch.distributed``'s functions, which is where
faultlab's interposer waits.

    python benchmarks/bench_launchers.py [--runs 3]
        [--faults rank,node0,node1,hang,coll_hang,service]
        [--stacks torchrun,"torchrun + flags",faultlab,ft_launcher,torchft,
                  "torchrun + etcd","torchrun + store"]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from _table import print_table, spread

from faultlab.engine import run_experiment
from faultlab.observe.launch_findings import RECOMMENDED_RDZV_CONF
from faultlab.observe.launch_fixes import ETCD_SERVICE, STORE_SERVICE
from faultlab.spec import experiment_from_dict
from faultlab.spec.launch import TORCHRUN_DEFAULT

ROOT = Path(__file__).resolve().parents[1]
STACKS: dict[str, object] = {
    "torchrun": list(TORCHRUN_DEFAULT),
    "torchrun + flags": ["env", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1", *TORCHRUN_DEFAULT,
                         "--rdzv-conf", RECOMMENDED_RDZV_CONF],
    "faultlab": "faultlab",
    "ft_launcher": ["ft_launcher", "--nnodes", "{nnodes}", "--nproc-per-node", "{nproc_per_node}",
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", "{rdzv_endpoint}",
                    "--rdzv-id", "{rdzv_id}", "--max-restarts", "{max_restarts}",
                    "--ft-initial-rank-heartbeat-timeout", "60",
                    "--ft-rank-heartbeat-timeout", "5", "--ft-workload-check-interval", "1"],
    "torchft": "torchft",
    "torchrun + etcd": {
        "services": {"etcd": list(ETCD_SERVICE)},
        "launch": ["env", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1", "torchrun", "--nnodes",
                   "{nnodes}", "--nproc-per-node", "{nproc_per_node}", "--rdzv-backend",
                   "etcd-v2", "--rdzv-endpoint", "127.0.0.1:{etcd_port}", "--rdzv-id",
                   "{rdzv_id}", "--rdzv-conf", RECOMMENDED_RDZV_CONF, "--max-restarts",
                   "{max_restarts}"]},
    "torchrun + store": {
        "services": {"store": list(STORE_SERVICE)},
        "launch": ["env", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1", "torchrun", "--nnodes",
                   "{nnodes}", "--nproc-per-node", "{nproc_per_node}", "--rdzv-backend",
                   "c10d", "--rdzv-endpoint", "127.0.0.1:{store_port}", "--rdzv-id",
                   "{rdzv_id}", "--rdzv-conf", f"is_host=false,{RECOMMENDED_RDZV_CONF}",
                   "--max-restarts", "{max_restarts}"]},
}
SERVICE = {"torchft": "lighthouse", "torchrun + etcd": "etcd", "torchrun + store": "store"}
"""The service a stack depends on, which the ``service`` fault kills."""
TRAINERS = {"ft_launcher": "examples/nvrx_ft/train.py"}
"""A stack's trainer where it is not examples/fsdp2_dcp/train.py (the same work, its API added)."""
SERVICE_STEPS = 200
"""The service fault's job runs this many steps (a checkpoint every 20), not 16: torchrun's
agents read the rendezvous state from the store at most once a second, so a 16-step job (about
0.4 s of training left after step 8) can finish before any agent notices its store is gone, a
survival that a job with hours left never sees (measured: the store 3/3 "survived" that way)."""
HANG_CAP_S = 20
"""A hang nothing reacts to is lifted after this long (module docstring)."""
TORCHFT = {  # examples/torchft_ddp's launch (module docstring)
    "command": ["python", str(ROOT / "examples/torchft_ddp/train.py"), "--steps", "16",
                "--ckpt-dir", "{run_dir}/checkpoints", "--quorum-timeout-s", "10"],
    "services": {"lighthouse": ["torchft_lighthouse", "--min_replicas", "2", "--quorum_tick_ms",
                                "100", "--join_timeout_ms", "1000", "--heartbeat_timeout_ms",
                                "2000", "--bind", "[::]:{lighthouse_port}"]},
    "launch": ["env", "REPLICA_GROUP_ID={node_rank}", "NUM_REPLICA_GROUPS={num_nodes}",
               "TORCHFT_LIGHTHOUSE=http://127.0.0.1:{lighthouse_port}", "torchrun", "--nnodes",
               "1", "--nproc-per-node", "{nproc_per_node}", "--master-port",
               "{node_master_port}", "--max-restarts", "{max_restarts}"],
}
FAULTS = {
    "rank": {"id": "kill", "type": "rank_kill", "target": {"rank": 1}},
    "node0": {"id": "kill", "type": "node_kill", "target": {"node": 0}},
    "node1": {"id": "kill", "type": "node_kill", "target": {"node": 1}},
    # until the job reacts, and in any case after HANG_CAP_S (then the run goes on)
    "hang": {"id": "hang", "type": "rank_hang", "target": {"rank": 1}, "until": "reaction",
             "duration_s": HANG_CAP_S},
    "coll_hang": {"id": "hang", "type": "collective_hang", "target": {"rank": 1},
                  "until": "reaction", "duration_s": HANG_CAP_S},
    "service": {"id": "kill", "type": "service_kill", "target": "all"},
}
FAULT_NAMES = {"rank": "rank kill", "node0": "loss of the store's node (0)",
               "node1": "loss of node 1", "hang": "rank hang (SIGSTOP)",
               "coll_hang": "collective hang",
               "service": "its service killed (lighthouse, etcd, store)"}


def applies(stack: str, fault: str) -> bool:
    """Whether ``stack`` takes ``fault`` (the module docstring says why not)."""
    if fault == "service":
        return stack in SERVICE
    return not (fault == "coll_hang" and stack == "torchft")


def experiment(stack: str, fault: str):  # type: ignore[no-untyped-def]
    spec = {**FAULTS[fault], "trigger": {"at_step": 9}}
    steps, every = (SERVICE_STEPS, 20) if fault == "service" else (16, 4)
    if fault == "service":
        spec["params"] = {"service": SERVICE[stack]}
    if stack == "torchft":
        command = list(TORCHFT["command"])  # type: ignore[call-overload]
        command[command.index("--steps") + 1] = str(steps)
        return experiment_from_dict({
            "name": f"bench_{fault}_torchft", "target": {**TORCHFT, "command": command},
            "topology": {"nodes": 2, "procs_per_node": 1, "max_restarts": 2},
            "run": {"steps": steps, "timeout_s": 120},
            "faults": [spec], "expect": {"completes": True}})
    given = STACKS[stack]
    launch = given if not isinstance(given, dict) else given["launch"]
    services = {} if not isinstance(given, dict) else given["services"]
    return experiment_from_dict({
        "name": f"bench_{fault}_{stack.replace(' + ', '_').replace(' ', '_')}",
        "target": {"command": ["python", str(ROOT / TRAINERS.get(stack,
                                                                 "examples/fsdp2_dcp/train.py")),
                               "--steps",
                               str(steps), "--ckpt-every", str(every), "--ckpt-dir",
                               "{run_dir}/checkpoints"],
                   "launch": launch, "services": services},
        "topology": {"nodes": 2, "procs_per_node": 1, "min_nodes": 1, "max_restarts": 2},
        "run": {"steps": steps, "timeout_s": 120},
        "faults": [spec], "expect": {"completes": True}})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--faults", default="rank,node0,node1,hang,coll_hang,service")
    p.add_argument("--stacks", default=",".join(STACKS))
    args = p.parse_args(argv)
    faults = args.faults.split(",")
    stacks = args.stacks.split(",")
    for name, given, known in (("fault", faults, FAULTS), ("stack", stacks, STACKS)):
        bad = [x for x in given if x not in known]
        if bad:
            p.error(f"--{name}s: {', '.join(map(repr, bad))} unknown; choose from "
                    f"{', '.join(known)}")
    results: dict[tuple[str, str], list] = {(s, f): [] for s in stacks for f in faults
                                            if applies(s, f)}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-launchers-") as tmp:
        for round_ in range(args.runs):
            for fault in faults:
                for stack in [s for s in stacks if applies(s, fault)]:
                    r = run_experiment(experiment(stack, fault), report_dir=Path(tmp),
                                       golden_cache=Path(tmp) / ".golden")
                    m = r.metrics
                    results[(stack, fault)].append(r)
                    found = [f["cause"] for f in json.loads(r.journal_path.read_text())
                             ["run"].get("launch_findings") or []] \
                        if r.journal_path.exists() else []
                    print(f"round {round_ + 1} {fault:5} {stack:16} completes={m.completes} "
                          f"restarts={m.restarts} detection={m.detection_latency_s} "
                          f"resume={m.resume_time_s} lost={m.lost_steps} "
                          f"heal={m.heal_time_s} survivors_lost={m.survivor_lost_steps} "
                          f"findings={','.join(found) or '-'}", flush=True)
    rows = []
    for fault in faults:
        for stack in [s for s in stacks if applies(s, fault)]:
            runs = results[(stack, fault)]
            ms = [r.metrics for r in runs]
            ft = stack == "torchft"  # heal time and the survivors' lost steps (docstring)
            resume = [m.heal_time_s if ft else m.resume_time_s for m in ms]
            lost = [m.survivor_lost_steps if ft else m.lost_steps for m in ms]
            rows.append([FAULT_NAMES[fault], stack,
                         f"{sum(m.completes for m in ms)}/{len(ms)}",
                         spread([m.detection_latency_s for m in ms
                                 if m.detection_latency_s is not None]),
                         spread([v for v in resume if v is not None]),
                         spread([float(v) for v in lost if v is not None], unit=""),
                         spread([float(m.restarts) for m in ms], unit="")])
    subset = "" if set(faults) == set(FAULTS) else f" ({', '.join(faults)})"
    print_table(f"recovery of one trainer's work under {len(stacks)} launch stacks{subset}",
                [f"examples/fsdp2_dcp/train.py, 16 steps, checkpoint every 4, 2 nodes x 1 "
                 f"rank (elastic to 1), fault after step 8; {args.runs} interleaved runs each; "
                 f"{time.monotonic() - t0:.0f} s in all",
                 "ft_launcher: examples/nvrx_ft/train.py, the same work with NVRx heartbeats",
                 "torchft: examples/torchft_ddp/train.py on the same model and data, 2 replica "
                 "groups of 1 rank, its lighthouse with --min_replicas 2; resume = heal time, "
                 "lost steps = the survivors'",
                 f"its service killed: a {SERVICE_STEPS}-step job (a checkpoint every 20), "
                 f"the fault after step 8",
                 "median [min-max] over the runs that measured it"],
                ["fault", "stack", "survived", "detection", "resume (torchft: heal)",
                 "lost steps", "restarts"],
                rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
