"""faultlab's command on a Slurm node: start the node's torchrun agent, or act on the job there.

It runs on the compute node, inside the job's allocation, never on the controller or login
host: ``run`` is each node's task of the batch script's ``srun``; the others are what the slurm
target's faults run through ``srun --jobid J --overlap -w NODE -N1 -n1`` (so they reach a node
of a real cluster the way Slurm lets a job's owner reach it, and see the node's own process
table). A process counts as the job's only if its environment names the job's run directory
(``FAULTLAB_RUN_DIR``, which every agent and worker of the job inherits) or it descends from
one that does: nothing else on the node is ever signalled.

    python -m faultlab.targets.slurm.node run --run-dir D --nnodes 1:2 ... -- CMD ...
    python -m faultlab.targets.slurm.node pids --run-dir D
    python -m faultlab.targets.slurm.node signal --run-dir D --sig KILL (--pid P ... | --all)

``pids`` and ``signal`` print one JSON line: ``{"node": ..., "pids": [...], ...}`` (``pids``
adds each process's state letter, ``signal`` what it signalled and when).
Exit codes: 0 done, 2 bad arguments, 3 a named process is not the job's (or is gone).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["job_processes", "main"]

RDZV_BASE_PORT = 29400
"""The c10d rendezvous listens on the first node at this port plus the job id modulo 1000, so
two faultlab jobs sharing a node do not collide."""


def job_processes(run_dir: str) -> list[int]:
    """This node's processes whose environment names ``run_dir`` (agent and workers of the
    job), and their descendants, topmost first; this command itself and its ancestors excluded.

    A descendant counts though its environment does not name the run: a child a rank started
    with an environment of its own is the job's, and so is a worker the agent has just forked,
    whose ``/proc`` environ reads empty until its ``execve`` has laid out the new stack (a
    ``signal --all`` in that window would otherwise leave it running)."""
    mine = {os.getpid(), os.getppid()}
    table: dict[int, int] = {}  # pid -> ppid of every live process
    named: set[int] = set()
    marker = f"FAULTLAB_RUN_DIR={run_dir}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        fields = _stat(int(entry.name))
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if fields is None or fields[0] == "Z":  # gone, or an unreaped zombie: gone
            continue
        table[int(entry.name)] = int(fields[1])
        if marker in env:
            named.add(int(entry.name))
    pids = set(named)
    grew = True
    while grew:  # the descendants of the job's processes
        grown = {pid for pid, ppid in table.items() if ppid in pids} - pids
        pids |= grown
        grew = bool(grown)
    # topmost first: a process whose parent is not the job's comes before its descendants
    return sorted(pids, key=lambda pid: (table[pid] in pids, pid))


def _run(args: argparse.Namespace) -> int:
    """Exec this node's torchrun agent (the batch script's srun task)."""
    nodelist = os.environ["SLURM_JOB_NODELIST"]
    hosts = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                           text=True, check=True).stdout.split()
    job_id = int(os.environ["SLURM_JOB_ID"])
    restart = os.environ.get("SLURM_RESTART_COUNT", "0")
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    env = {**os.environ,
           "FAULTLAB_NODE": node, "FAULTLAB_RUN_DIR": args.run_dir, "PYTHONUNBUFFERED": "1",
           # the runtime agent's control channel listens on the node's own address, where the
           # engine on the login host reaches it
           "FAULTLAB_RUNTIME_HOST": "@hostname",
           # torch 2.13: survivors of the node holding group rank 0 disagree on MASTER_PORT if
           # the rendezvous store is shared with the workers (see the launcher)
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    env.setdefault("OMP_NUM_THREADS", "1")
    endpoint = f"{hosts[0]}:{RDZV_BASE_PORT + job_id % 1000}"
    argv = [sys.executable, "-m", "faultlab.targets.torchrun_agent",
            "--nnodes", args.nnodes, "--nproc-per-node", str(args.nproc_per_node),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
            # a requeued job starts a rendezvous of its own
            "--rdzv-id", f"slurm-{job_id}-{restart}",
            "--rdzv-conf", "join_timeout=300,last_call_timeout=1,keep_alive_interval=1,"
                           "keep_alive_max_attempt=3",
            "--monitor-interval", "0.1", "--max-restarts", str(args.max_restarts),
            "--no-python", *args.command]
    print(f"faultlab node {node}: job {job_id} restart {restart}: {' '.join(argv)}",
          flush=True)
    os.execve(sys.executable, argv, env)
    return 0  # not reached


def _signal(args: argparse.Namespace) -> int:
    owned = job_processes(args.run_dir)
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    pids = owned if args.all else list(args.pid)
    strangers = [p for p in pids if p not in owned]
    sig = signal.Signals[f"SIG{args.sig}"]
    done = []
    for pid in pids:
        if pid in strangers:
            continue
        try:
            os.kill(pid, sig)
            done.append(pid)
        except ProcessLookupError:
            pass
    # when the signals went out, by this node's clock (the one its ranks' events use)
    print(json.dumps({"node": node, "pids": owned, "signalled": done, "not_owned": strangers,
                      "t": time.time()}), flush=True)
    return 3 if strangers else 0


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, ppid, ...); None if
    the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


def _state(pid: int) -> str:
    """The process's state letter (``R``, ``S``, ``T`` stopped ...); ``?`` if it is gone."""
    fields = _stat(pid)
    return "?" if fields is None else fields[0]


def _pids(args: argparse.Namespace) -> int:
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    pids = job_processes(args.run_dir)
    print(json.dumps({"node": node, "pids": pids, "states": {p: _state(p) for p in pids}}),
          flush=True)
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m faultlab.targets.slurm.node")
    sub = p.add_subparsers(dest="action", required=True)
    run = sub.add_parser("run", help="exec this node's torchrun agent")
    run.add_argument("--run-dir", required=True)
    run.add_argument("--nnodes", required=True, help="MIN:MAX")
    run.add_argument("--nproc-per-node", type=int, default=1)
    run.add_argument("--max-restarts", type=int, default=3)
    run.add_argument("command", nargs=argparse.REMAINDER)
    for name in ("pids", "signal"):
        q = sub.add_parser(name)
        q.add_argument("--run-dir", required=True)
        if name == "signal":
            q.add_argument("--sig", required=True,
                           choices=["KILL", "TERM", "STOP", "CONT", "SEGV", "ABRT", "USR1",
                                    "INT"])
            who = q.add_mutually_exclusive_group(required=True)
            who.add_argument("--pid", type=int, action="append", default=[])
            who.add_argument("--all", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.action == "run":
        if args.command and args.command[0] == "--":
            args.command = args.command[1:]
        if not args.command:
            print("faultlab node run: give the trainer's command after --", file=sys.stderr)
            return 2
        return _run(args)
    return _signal(args) if args.action == "signal" else _pids(args)


if __name__ == "__main__":
    sys.exit(main())
