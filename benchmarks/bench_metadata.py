"""Metadata operations of real jobs on their run directory, counted with strace (issue 53).

On a cluster the run directory is on the shared filesystem (NFS, Lustre, GPFS), where every
open, ``stat`` and directory listing may be a request to the metadata server, and sites judge
jobs by them. The goal: at most 1 per node per second in steady training. ``bench_scale.py
--tables meta`` counts them for simulated ranks at up to 1,024; this counts them for real jobs:

- the reference trainer (``tiny``), fault-free, on the local target (each node a torchrun
  agent of local processes), at 2 nodes x 1 rank and 4 nodes x 2 ranks (``--runs``), for each
  control channel (``--channels``): ``socket`` (each node's relay pushes to faultlab's hub)
  and ``file`` (``run.control_channel: file``: faultlab reads each node's events file, the
  relays read ``runtime/gates.txt``);
- ``faultlab``'s engine (``run_experiment``), the agents, ranks and node relays all started
  under ``strace -f --seccomp-bpf -y`` (only the counted calls stop a process);
- counted: every ``openat``, ``stat``-family call (``fstat`` included), ``access``,
  ``getdents64``, ``mkdir``, ``rename``, ``unlink``... whose path or file descriptor is under
  the job's run directory (``close``, ``write`` and ``fdatasync`` are not), by whom (the
  engine's threads, or the nodes' processes) and where (``events/``, ``runtime/``,
  ``logs/``, ``checkpoints/``);
- **steady**: from the first step record of the job to its last (the start-up, the final
  checkpoint and the exit outside it), per node per second; **whole job**: from the launch to
  the end of the job. ``checkpoints/`` is the trainer's own I/O (one save, after the last
  step), not faultlab's, and is shown apart.

What it does not show: a shared filesystem's own caches (on NFS an ``fstat`` right after its
open costs no request, so the counts are an upper bound), and strace 6.1's own cost (with
``--seccomp-bpf`` a new thread stops at every system call until it makes a traced one: the
ranks' gloo threads run slower, so the steps per second are below an untraced run's).

    python benchmarks/bench_metadata.py [--runs 2x1:150,4x2:40] [--channels socket,file]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks._strace import calls_on  # noqa: E402
from benchmarks._table import print_table  # noqa: E402

TRACED = "_traced-run"
META_TRACE = "trace=%file,%%stat,getdents64"
GOAL_PER_NODE_S = 1.0
AREAS = ("events", "runtime", "logs", "checkpoints")


def experiment(nodes: int, procs: int, steps: int, channel: str) -> dict[str, Any]:
    """A fault-free run of the reference trainer: no golden run, one checkpoint at the end."""
    return {"name": f"metadata_{nodes}x{procs}_{channel}", "seed": 0,
            "description": "fault-free, for counting metadata calls on the run directory",
            "target": {"trainer": "reference", "preset": "tiny",
                       "overrides": {"global_batch": 2 * nodes * procs}},
            "topology": {"nodes": nodes, "procs_per_node": procs},
            "run": {"steps": steps, "checkpoint_every": steps, "timeout_s": 900,
                    "control_channel": channel},
            "faults": [], "expect": {"completes": True}}


def _traced_run(cfg_json: str) -> int:
    """In the process strace started: the engine runs the experiment; its threads (sampled
    every 50 ms) and the journal's facts on stdout."""
    from faultlab.engine import run_experiment
    from faultlab.spec import experiment_from_dict

    cfg = json.loads(cfg_json)
    tids: set[int] = set()
    stop = threading.Event()

    def sample() -> None:
        while True:
            tids.update(int(t) for t in os.listdir("/proc/self/task"))
            if stop.wait(0.05):
                return

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    result = run_experiment(experiment_from_dict(cfg["experiment"]),
                            report_dir=Path(cfg["reports"]))
    stop.set()
    sampler.join()
    run = json.loads(result.journal_path.read_text())["run"]
    print(json.dumps({"verdict": result.verdict, "engine": sorted(tids),
                      "job_dir": run["job_dir"], "launched_t": run["launched_t"],
                      "job_s": run["job_s"], "channel": run["control_plane"].get("channel"),
                      "failures": [f"{s.name}: {s.measured}" for s in result.failures()]}))
    return 0


def _calls(trace: Path, root: str) -> list[tuple[int, float, str, str]]:
    """Every traced call on ``root``: (tid, time, call, the part of ``root`` it is in)."""
    out = []
    for tid, t, call, text in calls_on(trace, root):
        under = re.match(r"/([^/\"'>,)\s]+)(/?)", text.split(root, 1)[1])
        area = under.group(1) if under else "."  # "." : the run directory itself
        area = area if area in AREAS or area == "." else "other"
        if under and not under.group(2) and area != "other":
            area += "/"  # the directory itself (events/: the engine's look for new files)
        out.append((tid, t, call, area))
    return out


def _window(calls: list[tuple[int, float, str, str]], engine: set[int], t0: float, t1: float
            ) -> dict[str, Counter[str]]:
    """The calls within [t0, t1], by who (nodes, engine) and by "call area", checkpoints
    apart (the trainer's own)."""
    out: dict[str, Counter[str]] = {"nodes": Counter(), "engine": Counter(),
                                    "checkpoints": Counter()}
    for tid, t, name, area in calls:
        if t0 <= t <= t1:
            who = "checkpoints" if area.startswith("checkpoints") else \
                "engine" if tid in engine else "nodes"
            out[who][f"{name} {area}"] += 1
    return out


def measure(nodes: int, procs: int, steps: int, channel: str, tmp: Path) -> dict[str, Any]:
    from faultlab.runtime.events import read_events

    reports = (tmp / f"{nodes}x{procs}-{channel}").resolve()
    trace = tmp / f"strace-{nodes}x{procs}-{channel}.txt"
    cfg = {"experiment": experiment(nodes, procs, steps, channel), "reports": str(reports)}
    t0 = time.monotonic()
    proc = subprocess.run(
        ["strace", "-f", "--seccomp-bpf", "-y", "-ttt", "-qq", "-e", META_TRACE, "-o",
         str(trace), sys.executable, os.path.abspath(__file__), TRACED, json.dumps(cfg)],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False, timeout=1200)
    wall = time.monotonic() - t0
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        raise RuntimeError(f"the traced {nodes}x{procs} {channel} run failed (code "
                           f"{proc.returncode}): {proc.stderr[-2000:]}")
    got = json.loads(lines[-1])
    if got["verdict"] != "pass" or got["channel"] != channel:
        raise RuntimeError(f"the traced {nodes}x{procs} {channel} run: verdict "
                           f"{got['verdict']}, channel {got['channel']}: {got['failures']}")
    job_dir = str(Path(got["job_dir"]).resolve())
    stepped = [e["t"] for e in read_events(Path(job_dir) / "events") if e["kind"] == "step"]
    calls = _calls(trace, job_dir)
    trace.unlink()
    first, last = min(stepped), max(stepped)
    end = got["launched_t"] + got["job_s"]
    return {"nodes": nodes, "procs": procs, "channel": channel, "wall_s": wall,
            "steady_s": last - first, "steps_per_s": len(stepped) / (nodes * procs)
            / (last - first), "job_s": got["job_s"],
            "steady": _window(calls, set(got["engine"]), first, last),
            "whole": _window(calls, set(got["engine"]), got["launched_t"], end)}


def _per(r: dict[str, Any], window: str, who: str) -> float:
    seconds = r["steady_s"] if window == "steady" else r["job_s"]
    return sum(r[window][who].values()) / r["nodes"] / seconds


def _row(r: dict[str, Any]) -> list[str]:
    steady = _per(r, "steady", "nodes") + _per(r, "steady", "engine")
    whole = _per(r, "whole", "nodes") + _per(r, "whole", "engine")
    looks = r["steady"]["engine"]["openat events/"] / r["steady_s"]
    return [f"{r['nodes']}x{r['procs']}", r["channel"], f"{r['steps_per_s']:.1f}",
            f"{r['steady_s']:.1f}", f"{looks:.1f}", f"{steady:.2f}",
            f"{_per(r, 'steady', 'nodes'):.2f}", f"{_per(r, 'steady', 'engine'):.2f}",
            f"{r['job_s']:.1f}", f"{whole:.2f}", f"{_per(r, 'whole', 'checkpoints'):.2f}"]


def _notes(results: list[dict[str, Any]]) -> list[str]:
    notes = []
    for r in results:
        steady = _per(r, "steady", "nodes") + _per(r, "steady", "engine")
        verdict = "met" if steady <= GOAL_PER_NODE_S else \
            f"missed ({steady / GOAL_PER_NODE_S:.1f}x the goal)"
        parts = []
        for window, seconds in (("steady", r["steady_s"]), ("whole", r["job_s"])):
            for who in ("nodes", "engine"):
                calls = ", ".join(f"{k} {v / r['nodes'] / seconds:.2f}"
                                  for k, v in r[window][who].most_common(6)) or "none"
                parts.append(f"{window}, {who}: {calls}")
        notes.append(f"{r['nodes']}x{r['procs']} {r['channel']}: steady {steady:.2f} per node "
                     f"per second, goal <= {GOAL_PER_NODE_S:g}: {verdict}; per node per "
                     f"second, {'; '.join(parts)}")
    return notes


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [TRACED]:
        return _traced_run(argv[1])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", default="2x1:150,4x2:40",
                   help="NODESxRANKS:STEPS, comma-separated (ranks a node)")
    p.add_argument("--channels", default="socket,file", help="socket, file or both")
    args = p.parse_args(argv)
    channels = args.channels.split(",")
    if not set(channels) <= {"socket", "file"}:
        p.error(f"--channels {args.channels!r}: each one of socket, file")
    try:
        runs = [(int(n), int(r), int(s)) for n, r, s in
                (spec.replace("x", ":").split(":") for spec in args.runs.split(","))]
    except ValueError:
        p.error(f"--runs {args.runs!r}: expected NODESxRANKS:STEPS, e.g. 2x1:150,4x2:40")
    results = []
    t0 = time.monotonic()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="faultlab-bench-metadata-") as tmp:
        for nodes, procs, steps in runs:
            for channel in channels:
                print(f"{nodes}x{procs}, {steps} steps, {channel} channel, under strace",
                      file=sys.stderr, flush=True)
                results.append(measure(nodes, procs, steps, channel, Path(tmp)))
    print_table(
        "metadata operations of real jobs on their run directory",
        [f"reference trainer (tiny), fault-free, local target (a torchrun agent a node, "
         f"local processes), {', '.join(f'{n}x{r} ({s} steps)' for n, r, s in runs)}, "
         f"checkpoint after the last step; {os.cpu_count()} cores, load average {load:.1f} at "
         f"the start; {time.monotonic() - t0:.0f} s in all",
         "counted: calls on the job's run directory (openat, stat family, getdents64, access, "
         "mkdir, rename, unlink...; not close, write, fdatasync) by faultlab's engine and every "
         "process of the job (agents, ranks, node relays), all under strace -f --seccomp-bpf "
         "-y; per node per second",
         "steady: from the job's first step record to its last; whole job: launch to end; "
         "engine's looks: its opens of events/ (every 2 s with the hub, every poll without: "
         "20 a second untraced, fewer when strace slows it, and then the engine's count is a "
         "lower bound); "
         "checkpoints/ (the trainer's own save) is not counted in faultlab's figures and is "
         "shown apart"],
        ["nodes x ranks", "channel", "steps/s", "steady s", "engine's looks at events/ a s",
         "steady: faultlab's",
         "of it: nodes", "of it: engine", "job s", "whole job: faultlab's",
         "whole job: the trainer's checkpoints"],
        [_row(r) for r in results], notes=_notes(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
