"""The soak: every experiment CI runs, N times, two at a time as CI runs them; pass rates and
the spread of recovery, from which SLAs can be set.

    python benchmarks/bench_soak.py                                  # all of them, 20 runs: hours
    python benchmarks/bench_soak.py --runs 4 experiments/rank_kill.yaml
    python benchmarks/bench_soak.py --runs 10 --parallel 2 --out soak/ --json soak.json
    python benchmarks/bench_soak.py --resume reports/soak-.../      # go on where one stopped

By default: the Makefile's ``SHIPPED`` list (the experiments ``make test`` runs as pytest items,
the docker ones among them), ``experiments/slurm_*.yaml`` (``tests/slurm``) and every
experiment under ``examples/*/experiments`` (``tests/examples``). Each run is a real, independent
``faultlab run EXPERIMENT`` in a process of its own, with its own run folder; the golden runs
are shared through one cache, so each is computed once. ``--parallel`` runs go at once (CI's
two xdist workers), drawn round-robin over the experiments so that, as in CI, two different
experiments usually share the machine; Slurm experiments run one at a time (one test cluster),
as ``tests/slurm`` runs them. An experiment whose launcher is not available here (no Docker
engine answering, no Slurm cluster: ``SLURM_CONF`` and ``sbatch``) is listed as not run, with
what it needs.

Printed: per experiment, the outcome CI asserts (pass, or fail on named SLAs: an example's
from ``tests/examples``' own table, ``rank_hang_default_timeouts`` failing by design), how many
runs ended exactly so (``19/20``: that verdict, failing exactly those SLAs), whether the verdict
and the failing SLAs were the same every time, and the median and p95 (nearest rank, as
``faultlab run --repeat`` computes them) of resume time, detection latency and wall time; then
any collision between concurrent runs (a rendezvous endpoint two live jobs shared, "address
already in use" in a job log). No bound is asserted here; this replaces
``python -m pytest_faultlab.soak``.

All of it is hours on a 2-core machine (about 28 experiments x 20 runs), more than one sitting:
``--resume FOLDER`` goes on in the folder of an earlier soak, running only the runs whose log
does not have the ``[bench_soak] exit`` line, and then prints the table over every finished
run in that folder. Ctrl-C or SIGTERM stops a soak: no new run starts, the running ones undo
their faults and exit, and they get no done mark; so a run cut off by a stop (or a reboot) is
run again, and the table counts only the journal each finished run's log names, never the
journal a cut-off run left behind.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks._slurm import cluster_down, cluster_up  # noqa: E402
from benchmarks._table import print_table  # noqa: E402
from faultlab.engine.runner import new_run_folder  # noqa: E402
from faultlab.judge.repeats import summarize  # noqa: E402
from faultlab.report.journal import read_journal  # noqa: E402
from faultlab.spec import load_experiment  # noqa: E402

COLLISION_SIGNS = ("address already in use", "eaddrinuse", "errno 98")
DONE_MARK = "[bench_soak] exit"
CUT_MARK = "[bench_soak] cut off by a stop, exit"
JOURNAL_LINE = re.compile(r"^journal: (.+/journal\.json)$", re.M)


def shipped_experiments() -> list[Path]:
    """What CI runs: the Makefile's SHIPPED list, the Slurm experiments, the examples'."""
    text = (REPO_ROOT / "Makefile").read_text()
    block = re.search(r"^SHIPPED\s*:=(.*?)(?<!\\)\n", text, re.S | re.M)
    if block is None:
        raise SystemExit("bench_soak: no SHIPPED := ... list in the Makefile; name the "
                         "experiments on the command line")
    shipped = [REPO_ROOT / p for p in block.group(1).replace("\\\n", " ").split()]
    # rank_hang and campaign_reference run in CI once, as tests/report/test_prelaunch_run.py's
    # suite; rank_kill twice, as tests/integration/test_faultlab_run.py's --repeat 2;
    # node_loss_elastic, ckpt_torn_write and ckpt_bitflip in
    # tests/integration/test_trainer_recovery.py;
    # rank_hang_default_timeouts in tests/integration/test_faultlab_run.py, failing by design;
    # gpu_slow_straggler as tests/integration/test_sweep_job.py's 5x point;
    # collective_delay_straggler in tests/integration/test_detection.py, signals added.
    shipped.append(REPO_ROOT / "experiments" / "rank_hang.yaml")
    shipped.append(REPO_ROOT / "experiments" / "campaign_reference.yaml")
    shipped.append(REPO_ROOT / "experiments" / "node_loss_elastic.yaml")
    shipped.append(REPO_ROOT / "experiments" / "ckpt_torn_write.yaml")
    shipped.append(REPO_ROOT / "experiments" / "ckpt_bitflip.yaml")
    shipped.append(REPO_ROOT / "experiments" / "rank_kill.yaml")
    shipped.append(REPO_ROOT / "experiments" / "rank_hang_default_timeouts.yaml")
    shipped.append(REPO_ROOT / "experiments" / "gpu_slow_straggler.yaml")
    shipped.append(REPO_ROOT / "experiments" / "collective_delay_straggler.yaml")
    return (shipped + sorted((REPO_ROOT / "experiments").glob("slurm_*.yaml"))
            + sorted((REPO_ROOT / "examples").glob("*/experiments/*.yaml")))


# The shipped experiments outside examples/ that CI expects to fail, and the SLAs they fail.
EXPECTED_FAILURES = {"experiments/rank_hang_default_timeouts.yaml":
                     ("completes", "detection_latency_s")}


def _failing(journal: dict[str, Any]) -> tuple[str, ...]:
    """The SLAs a run failed (not those inconclusive or covered), sorted: what tests/examples'
    table lists as failing."""
    from faultlab.judge.verdict import row_result

    return tuple(sorted(s["name"] for s in journal.get("slas") or []
                        if row_result(s) == "fail"))


def expectations() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Experiment key → (the verdict CI asserts, the SLAs it asserts failing): the examples'
    from tests/examples' own table (one source of truth), the rest pass unless listed in
    EXPECTED_FAILURES."""
    import importlib.util

    path = REPO_ROOT / "tests" / "examples" / "test_examples.py"
    spec = importlib.util.spec_from_file_location("_soak_expected_examples", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while defined
    spec.loader.exec_module(module)
    found = {f"examples/{name.replace('/', '/experiments/')}":
             (e.verdict, tuple(sorted(e.failing))) for name, e in module.SCENARIOS.items()}
    found.update({k: ("fail", tuple(sorted(v))) for k, v in EXPECTED_FAILURES.items()})
    return found


def unavailable(launcher: str) -> str | None:
    """Why experiments of ``launcher`` cannot run here (None: they can)."""
    if launcher == "docker":
        from faultlab.targets.docker.engine import engine_problem

        problem = engine_problem()
        return None if problem is None else f"needs a Docker engine ({problem}; " \
                                            f"scripts/docker-engine.sh starts one)"
    if launcher == "slurm" and not (os.environ.get("SLURM_CONF") and shutil.which("sbatch")):
        return ("needs a Slurm cluster (scripts/slurm-cluster.sh up 3, then "
                "eval \"$(scripts/slurm-cluster.sh env)\")")
    return None


def _key(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


class _Stop:
    """Ctrl-C or SIGTERM: no run is started any more, the running ones are stopped (each
    ``faultlab run`` undoes its faults and exits), and none of them counts as finished."""

    def __init__(self) -> None:
        self.set = False
        self.lock = threading.Lock()
        self.children: set[subprocess.Popen[bytes]] = set()

    def stop(self) -> None:
        with self.lock:
            self.set = True
            children = list(self.children)
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)  # a second one is ignored during undo


def _run_one(exp: Path, key: str, index: int, out: Path, slurm_lock: threading.Lock | None,
             stop: _Stop) -> None:
    """One real ``faultlab run`` of ``exp`` into ``out/runs/<key>/``; its output in a log."""
    folder = out / "runs" / key.replace("/", "__").removesuffix(".yaml")
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "faultlab.cli", "run", str(exp), "--report-dir", str(folder),
           "--golden-cache", str(out / "golden")]
    log = _log_path(out, key, index)
    log.parent.mkdir(parents=True, exist_ok=True)
    with (slurm_lock or _NO_LOCK):
        t0 = time.monotonic()
        with stop.lock:
            if stop.set:
                return
            f = log.open("w")
            child = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=f, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
            stop.children.add(child)
        with f:
            rc = child.wait()
            took_s = time.monotonic() - t0
            with stop.lock:
                stop.children.discard(child)
                cut_off = stop.set
            # A run cut off by a stop gets no done mark: --resume runs it again and the table
            # does not count it, though it wrote a journal.
            f.write(f"\n{CUT_MARK} {rc}\n" if cut_off
                    else f"\n{DONE_MARK} {rc} in {took_s:.1f} s\n")
    print(f"  {key} run {index}: " + ("cut off" if cut_off else f"exit {rc} in {took_s:.0f} s")
          + f" ({log})", flush=True)


def _log_path(out: Path, key: str, index: int) -> Path:
    return out / "logs" / f"{key.replace('/', '__').removesuffix('.yaml')}-{index:02d}.log"


def finished(out: Path, key: str, index: int) -> bool:
    """Whether run ``index`` of ``key`` ran to its end in an earlier sitting (``--resume``)."""
    log = _log_path(out, key, index)
    return log.exists() and DONE_MARK in log.read_text(errors="replace")


def finished_journals(out: Path, key: str, runs: int) -> tuple[list[Path], int]:
    """The journals of the finished runs of ``key`` (those whose log has the done mark), and
    how many finished runs named none. A journal written by a run cut off by a stop, or left
    in the folder by anything else, is not counted."""
    journals, none = [], 0
    for index in range(1, runs + 1):
        log = _log_path(out, key, index)
        text = log.read_text(errors="replace") if log.exists() else ""
        if DONE_MARK not in text:
            continue
        found = JOURNAL_LINE.findall(text)
        if found and Path(found[-1]).exists():
            journals.append(Path(found[-1]))
        else:
            none += 1
    return journals, none


class _NoLock:
    def __enter__(self) -> None: ...
    def __exit__(self, *_exc: object) -> None: ...


_NO_LOCK = _NoLock()


def collisions(folders: list[Path]) -> list[str]:
    """Runs that overlapped in time on one rendezvous endpoint, and job logs that say a port
    was taken (from the old ``pytest_faultlab.soak``)."""
    found: list[str] = []
    spans: dict[str, list[tuple[float, float, str]]] = {}
    for folder in folders:
        for j in sorted(folder.glob("*/journal.json")):
            launch = j.parent / "job" / "launch.json"
            if launch.exists():
                ep = json.loads(launch.read_text()).get("rdzv_endpoint")
                run = json.loads(j.read_text())["run"]
                span = (run["started_t"], run["ended_t"], j.parent.name)
                for a, b, other in spans.get(ep, []):
                    if a < span[1] and span[0] < b:
                        found.append(f"rendezvous endpoint {ep} shared by {other} and "
                                     f"{span[2]}")
                spans.setdefault(ep, []).append(span)
        for log in folder.glob("*/job/logs/*.log"):
            text = log.read_text(errors="replace").lower()
            found += [f"{log}: {sign!r}" for sign in COLLISION_SIGNS if sign in text]
    return found


def _raise_interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _p(summary: Any, metric: str) -> tuple[str, str]:
    spread = {m.name: m for m in summary.metrics}.get(metric)
    if spread is None or spread.median is None:
        return "—", "—"
    return f"{spread.median:.2f}", f"{spread.p95:.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/bench_soak.py",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("experiments", nargs="*", type=Path,
                   help="experiment files (default: every one CI runs)")
    p.add_argument("--runs", type=int, default=20, help="runs per experiment (default 20)")
    p.add_argument("--parallel", type=int, default=2,
                   help="runs at once (default 2, as CI's xdist workers)")
    p.add_argument("--out", type=Path, default=None, help="default: a new temporary folder")
    p.add_argument("--resume", type=Path, default=None, metavar="FOLDER",
                   help="go on in the folder of an earlier soak: run only its unfinished runs")
    p.add_argument("--table-only", action="store_true",
                   help="with --resume: print the table of the runs finished so far, run nothing "
                        "(while another soak still runs in that folder)")
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    p.add_argument("--slurm-cluster", action="store_true",
                   help="bring the local Slurm test cluster up for the slurm_*.yaml "
                        "experiments (scripts/slurm-cluster.sh up 3; root) and down at the end")
    args = p.parse_args(argv)
    if args.runs < 1 or args.parallel < 1:
        p.error(f"--runs {args.runs} and --parallel {args.parallel} must both be >= 1")
    if args.resume is not None and args.out is not None:
        p.error("--resume FOLDER already names the folder; leave out --out")
    if args.table_only and args.resume is None:
        p.error("--table-only needs --resume FOLDER")
    if args.resume is not None and not (args.resume / "runs").is_dir():
        p.error(f"--resume {args.resume}: not the folder of an earlier soak (it has no runs/)")
    # A fresh folder each time (the table counts every journal under it), or the earlier one.
    out = (args.resume if args.resume is not None
           else new_run_folder(args.out, "soak") if args.out
           else Path(tempfile.mkdtemp(prefix="faultlab-soak-"))).resolve()
    if args.slurm_cluster and os.geteuid() != 0:
        print("bench_soak: the Slurm test cluster needs root; its experiments are not run",
              flush=True)
    elif args.slurm_cluster and not args.table_only:
        if not cluster_up(3):  # a 2-node job and a spare, as bench_slurm.py
            return 1
        try:
            return _soak(args, out)
        finally:
            cluster_down()
    return _soak(args, out)


def _soak(args: argparse.Namespace, out: Path) -> int:
    paths = args.experiments or shipped_experiments()
    runnable: dict[str, Path] = {}
    skipped: dict[str, str] = {}
    launchers: dict[str, str] = {}
    for path in paths:
        key = _key(path)
        launcher = load_experiment(path).topology.launcher
        launchers[key] = launcher
        why = None if args.table_only else unavailable(launcher)  # the folder has its runs
        if why:
            skipped[key] = why
        else:
            runnable[key] = path
    jobs = [(key, runnable[key], i) for i, key in itertools.product(range(1, args.runs + 1),
                                                                    runnable)
            if not (args.resume and finished(out, key, i))]
    done_before = len(runnable) * args.runs - len(jobs)  # what --resume found finished
    if args.table_only:
        jobs = []
    print(f"soak: {len(runnable)} experiment(s) x {args.runs} run(s), {args.parallel} at a "
          f"time, into {out}" + (f" ({done_before} run(s) finished earlier)" if done_before
                                 else ""), flush=True)
    slurm_lock = threading.Lock()
    stop = _Stop()
    t0 = time.monotonic()
    pool = ThreadPoolExecutor(max_workers=args.parallel)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        futures = [pool.submit(_run_one, path, key, i, out,
                               slurm_lock if launchers[key] == "slurm" else None, stop)
                   for key, path, i in jobs]
        for f in futures:
            f.result()
    except KeyboardInterrupt:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("soak: stopping: no new run starts; the running ones undo their faults and are "
              "not counted (--resume runs them again)", flush=True)
        stop.stop()
        pool.shutdown(wait=True, cancel_futures=True)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        pool.shutdown(wait=True, cancel_futures=True)
    took_s = time.monotonic() - t0

    rows, data = [], []
    folders = []
    expected = expectations()
    for key in [_key(x) for x in paths]:
        if key in skipped:
            rows.append([key, "—", "not run", "—", "—", "—", "—", "—", "—", "—"])
            data.append({"experiment": key, "not_run": skipped[key]})
            continue
        folder = out / "runs" / key.replace("/", "__").removesuffix(".yaml")
        folders.append(folder)
        done, no_journal = finished_journals(out, key, args.runs)
        journals = [read_journal(j.parent) for j in done]
        summary = summarize(journals)
        verdicts = set(summary.verdicts)
        # An example expected to fail must fail the same way every time, not just fail.
        failing = {_failing(j) for j in journals}
        resume, detect, wall = (_p(summary, m) for m in
                                ("resume_time_s", "detection_latency_s", "wall_s"))
        missing = args.runs - summary.num_runs
        verdict, must_fail = expected.get(key, ("pass", ()))
        # as expected: the verdict CI asserts, failing exactly the SLAs CI asserts failing
        as_expected = sum(j.get("verdict") == verdict and _failing(j) == must_fail
                          for j in journals)
        rows.append([key, "pass" if verdict == "pass" else "fail: " + ", ".join(must_fail),
                     f"{as_expected}/{args.runs}"
                     + (f" ({no_journal} without a journal)" if no_journal else "")
                     + (f" ({missing - no_journal} not run)" if missing > no_journal else ""),
                     "—" if not journals and not no_journal
                     else "yes" if len(verdicts) == 1 and len(failing) == 1 and not no_journal
                     else "NO",
                     *resume, *detect, *wall])
        data.append({"experiment": key, "runs": args.runs, **summary.to_dict(),
                     "expected_verdict": verdict, "expected_failing_slas": list(must_fail),
                     "as_expected": as_expected, "failing_slas": sorted(map(list, failing))})
    problems = collisions(folders)
    notes = [f"{k}: not run: {why}" for k, why in skipped.items()]
    notes += [f"collision: {c}" for c in problems] or ["no collision between concurrent runs"]
    notes.append("stable: every finished run with the same verdict and the same failing SLAs, "
                 "and each with a journal")
    notes.append("p95 by nearest rank: the maximum below 20 runs; times in seconds; wall: the "
                 "job's first to last event (no golden run, no start-up of faultlab)")
    print_table(f"soak: {args.runs} runs per experiment, {args.parallel} at a time",
                [f"{len(jobs)} runs in {took_s / 60:.1f} min"
                 + (f" (and {done_before} in an earlier sitting)" if done_before else "")
                 + f"; run folders and logs in {out}"],
                ["experiment", "expected", "as expected", "stable", "resume p50", "p95",
                 "detection p50", "p95", "wall p50", "p95"], rows, notes)
    if args.json:
        args.json.write_text(json.dumps({"runs": args.runs, "parallel": args.parallel,
                                         "took_s": took_s, "experiments": data,
                                         "collisions": problems}, indent=1))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
