"""Benchmark of the runtime agent (faultlab.runtime): what it costs idle, and whether an injected
collective delay costs what it says.

    python benchmarks/bench_runtime.py                   # ~1-2 min on 2 idle CPU cores
    python benchmarks/bench_runtime.py --steps 30 --out runtime.json

Launches one job of 2 ranks (gloo on 127.0.0.1, one process each, ``OMP_NUM_THREADS=1`` as
torchrun sets it) running the reference trainer's step body on the ``tiny`` preset: global batch
12, forward, backward, ``clip_grad_norm`` (a DTensor norm: one functional all-reduce), the
loss/non-finite all-reduce, AdamW. The model is sharded with ``fully_shard`` per block and at
the root, exactly as ``reference_trainer/train.py`` does. Every number is a per-step wall time on
rank 0 (``perf_counter`` around the whole step).

overhead
    Steps alternate, in the same processes, between *no agent* (interposer uninstalled, no
    agent calls) and *agent attached, idle* (interposer installed, ``rt.step`` and ``rt.loss``
    called, control listener up, nothing planned). Reported: the median of each, and the ratio.
    Target: <= 1.01. On a shared 2-core machine step-to-step noise is a few percent, so the
    section also reports the cost computed from a micro-benchmark of the wrapper (ns per
    intercepted call x calls per step, plus ``rt.step``/``rt.loss``) over the median step time,
    which noise cannot blur.
delay
    The agent is re-attached with a plan of ``collective_delay`` faults for every collective
    (``ops`` = all) on every rank (``--victims 0``: rank 0 only): ``--delays-ms`` values, each
    on its own interleaved steps, with undelayed steps between them as the baseline. Expected
    slowdown per step = delay x calls delayed per step (counted by the interposer); reported:
    measured median slowdown / expected. Target: within 10 %. With every rank delayed each
    collective completes one delay later on all ranks, so the slowdown adds up exactly; with
    rank 0 alone, each delay first absorbs whatever time rank 0 would have spent waiting for a
    late rank 1 inside that collective, so the ratio is below 1 by that waiting time.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from _table import print_table  # noqa: E402  (benchmarks/ is on sys.path as the script dir)

OVERHEAD_MAX_RATIO = 1.01
DELAY_MAX_ERROR = 0.10
WARMUP_STEPS = 3


def log(msg: str) -> None:
    """Progress goes to stderr, tables to stdout."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- the rank side ------------------------------------------------------------------------------

def _micro_ns_per_call(n: int = 200_000) -> dict[str, float]:
    """Wrapper cost per intercepted call, idle (ns), from a no-op function given one CPU
    tensor."""
    from faultlab.runtime import interposer

    def noop(*args: Any, **kwargs: Any) -> None:
        return None

    import torch

    wrapped = interposer._wrap("all_reduce", noop, torch.compiler.is_compiling)
    t = torch.ones(4)
    best = {}
    for name, fn in (("direct", noop), ("wrapped", wrapped)):
        times = []
        for _ in range(5):
            t0 = time.perf_counter_ns()
            for _ in range(n):
                fn(t, group=None)
            times.append((time.perf_counter_ns() - t0) / n)
        best[name] = min(times)
    return {"wrapper_ns": best["wrapped"] - best["direct"]}


def _worker(run_dir: Path, steps: int, delays_ms: list[float],
            victims: str) -> None:  # runs in each rank
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from faultlab import runtime
    from faultlab.runtime import interposer
    from faultlab.runtime.plan import write_plan
    from reference_trainer.config import PRESETS
    from reference_trainer.data import GlobalBatchSampler, MarkovTokens
    from reference_trainer.train import build_sharded_model, clip_grad_norm

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (world_size,))
    cfg, global_batch = PRESETS["tiny"], 12
    model = build_sharded_model(cfg, seed=0, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95),
                                  weight_decay=0.1)
    data = MarkovTokens(vocab_size=cfg.vocab_size, seq_len=cfg.seq_len, seed=0)
    sampler = GlobalBatchSampler(global_batch=global_batch, rank=rank, world_size=world_size)
    tokens = global_batch * cfg.seq_len
    model.train()

    def one_step(s: int, rt: Any) -> float:
        t0 = time.perf_counter()
        if rt is not None:
            rt.step(s)
        x, y = data.batch(sampler.local_ids(s))
        loss_sum = model(x, y)
        if rt is not None:
            loss_sum = rt.loss(loss_sum)
        (loss_sum * (world_size / tokens)).backward()
        clip_grad_norm(model, 1.0)
        stats = torch.tensor([float(loss_sum.detach()), 0.0], dtype=torch.float64)
        dist.all_reduce(stats)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    out: dict[str, Any] = {"micro": _micro_ns_per_call()}

    # overhead: alternate no agent / attached-idle, step by step, in lockstep on both ranks
    rt = runtime.attach(model, optimizer)
    for s in range(1, WARMUP_STEPS + 1):
        one_step(s, rt)
    times: dict[str, list[float]] = {"off": [], "idle": []}
    calls: dict[str, int] = {}
    for i in range(2 * steps):
        s = WARMUP_STEPS + 1 + i
        mode = "idle" if i % 2 else "off"
        if mode == "off":
            interposer.uninstall()
        else:
            interposer.install()
        # install() scans sys.modules (tens of ms under load): start both ranks' clocks together,
        # or one rank's step would include waiting for the other's install.
        dist.barrier()
        before = interposer.counts()
        times[mode].append(one_step(s, rt if mode == "idle" else None))
        for op, n in interposer.counts().items():
            calls[op] = calls.get(op, 0) + n - before.get(op, 0)
    interposer.install()
    out["overhead"] = {"times": times, "calls_per_step": {k: v / steps for k, v in calls.items()
                                                         if v}}
    t0 = time.perf_counter_ns()
    for _ in range(10_000):
        rt.step(10**6)
        rt.loss(1.0)
    out["micro"]["agent_calls_ns"] = (time.perf_counter_ns() - t0) / 10_000

    # delay: a plan of delays, each on every (len+1)-th step; the steps between: baseline
    first = WARMUP_STEPS + 2 * steps + 1
    period = len(delays_ms) + 1
    # entries as faultlab writes them: the action's path and its complete parameters
    plan = [{"id": f"delay{d:g}", "type": "collective_delay",
             "action": "faultlab.runtime.actions.collective:Delay",
             "ranks": None if victims == "all" else [0],
             "steps": [first + k * period + j + 1 for k in range(steps)],
             "params": {"delay_ms": d, "jitter_ms": 0.0, "ops": None, "seed": 0}}
            for j, d in enumerate(delays_ms)]
    if rank == 0:
        write_plan(run_dir / "plan.json", plan)
    dist.barrier()
    os.environ["FAULTLAB_RUNTIME_PLAN"] = str(run_dir / "plan.json")
    rt = runtime.attach(model, optimizer)
    delay_times: dict[str, list[float]] = {"baseline": [], **{f"{d:g}": [] for d in delays_ms}}
    delayed_calls: dict[str, list[int]] = {f"{d:g}": [] for d in delays_ms}
    for k in range(steps):
        for j in range(period):
            s = first + k * period + j
            dist.barrier()
            before = interposer.counts()
            t = one_step(s, rt)
            if j == 0:
                delay_times["baseline"].append(t)
            else:
                key = f"{delays_ms[j - 1]:g}"
                delay_times[key].append(t)
                delayed_calls[key].append(sum(interposer.counts().values())
                                          - sum(before.values()))
    rt.close()
    out["delay"] = {"times": delay_times, "calls": delayed_calls}
    (run_dir / f"result-rank{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


# --- the launcher -------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_job(run_dir: Path, steps: int, delays_ms: list[float], victims: str,
            timeout_s: float) -> dict[str, Any]:
    env = {**os.environ, "FAULTLAB_RUN_DIR": str(run_dir), "WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "FAULTLAB_RUNTIME_SECRET": "bench", "FAULTLAB_NODE": "node0",
           "OMP_NUM_THREADS": "1"}
    env.pop("FAULTLAB_RUNTIME_PLAN", None)
    cmd = [sys.executable, __file__, "--worker", str(run_dir), "--steps", str(steps),
           "--victims", victims, "--delays-ms", *map(str, delays_ms)]
    logs = [run_dir / f"rank{r}.log" for r in (0, 1)]
    procs = [subprocess.Popen(cmd, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=open(logs[r], "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
             for r in (0, 1)]
    deadline = time.monotonic() + timeout_s
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    if any(p.returncode for p in procs):
        tails = "\n".join(logs[r].read_text(errors="replace")[-4000:] for r in (0, 1))
        raise SystemExit(f"a rank failed (exit codes {[p.returncode for p in procs]}):\n"
                         f"command: {' '.join(cmd)}\n{tails}")
    return json.loads((run_dir / "result-rank0.json").read_text())


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def report(res: dict[str, Any], delays_ms: list[float], victims: str) -> dict[str, Any]:
    ov = res["overhead"]
    off_t, idle_t = ov["times"]["off"], ov["times"]["idle"]
    off, idle = statistics.median(off_t), statistics.median(idle_t)
    # Steps alternate off, idle, off, idle...: pair each idle step with the off step before it,
    # so that slow drifts of the machine's load cancel.
    paired = statistics.median(i / o for o, i in zip(off_t, idle_t, strict=True))
    calls = sum(ov["calls_per_step"].values())
    micro = res["micro"]
    computed = (micro["wrapper_ns"] * calls + micro["agent_calls_ns"]) / 1e9 / off
    print_table(
        "overhead: agent attached, idle", [
            f"tiny preset, 2 ranks gloo, {len(off_t)} steps per mode, alternating step by step",
            "intercepted calls per step: " + ", ".join(
                f"{op} {n:g}" for op, n in sorted(ov["calls_per_step"].items()))],
        ["mode", "median step", "min", "p10", "p90"],
        [[m, _ms(statistics.median(ts)), _ms(min(ts)), _ms(statistics.quantiles(ts, n=10)[0]),
          _ms(statistics.quantiles(ts, n=10)[-1])] for m, ts in ov["times"].items()],
        [f"idle/off: medians {idle / off:.4f}, paired median {paired:.4f}, minima "
         f"{min(idle_t) / min(off_t):.4f} (target <= {OVERHEAD_MAX_RATIO})",
         f"computed: {micro['wrapper_ns']:.0f} ns/call x {calls:g} calls + "
         f"{micro['agent_calls_ns']:.0f} ns for rt.step+rt.loss = {computed:.4%} of a median "
         f"step"])
    base_t = res["delay"]["times"]["baseline"]
    base = statistics.median(base_t)
    rows, out_rows = [], []
    for d in delays_ms:
        key = f"{d:g}"
        n_calls = statistics.median(res["delay"]["calls"][key])
        expected = n_calls * d / 1000
        times = res["delay"]["times"][key]
        measured = statistics.median(times) - base
        paired_d = statistics.median(t - b for t, b in zip(times, base_t, strict=True))
        rows.append([f"{d:g} ms", f"{n_calls:g}", _ms(expected), _ms(measured),
                     f"{measured / expected:.3f}", f"{paired_d / expected:.3f}"])
        out_rows.append({"delay_ms": d, "calls": n_calls, "expected_s": expected,
                         "measured_s": measured, "ratio": measured / expected,
                         "paired_ratio": paired_d / expected})
    print_table(f"delay: collective_delay on {'every rank' if victims == 'all' else 'rank 0'}"
                f", every collective",
                [f"baseline (undelayed steps interleaved with the delayed ones): median "
                 f"{_ms(base)}"],
                ["delay", "calls/step", "expected", "measured", "ratio", "paired ratio"], rows,
                [f"target: ratio within 1 +- {DELAY_MAX_ERROR:.0%}",
                 "measured = median delayed step - median baseline step; paired = median of "
                 "(delayed step - the baseline step of the same round)",
                 "with only rank 0 delayed (--victims 0) the ratio is below 1: the delay "
                 "first absorbs the time rank 0 would have waited for a late rank 1"])
    return {"overhead_ratio": idle / off, "overhead_paired_ratio": paired,
            "overhead_computed_fraction": computed, "step_off_s": off, "step_idle_s": idle,
            "delay": out_rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40,
                        help="measured steps per mode/delay (default 40)")
    parser.add_argument("--delays-ms", type=float, nargs="+", default=[5.0, 20.0, 50.0])
    parser.add_argument("--victims", choices=("all", "0"), default="all",
                        help="ranks the delay hits: every rank (default) or rank 0 only")
    parser.add_argument("--out", type=Path, help="write every raw number as JSON here")
    parser.add_argument("--timeout-s", type=float, default=900.0)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args.worker, args.steps, args.delays_ms, args.victims)
        return 0
    load = os.getloadavg()[0]
    log(f"launching 2 ranks, {args.steps} steps per mode; 1-min load average {load:.2f}")
    with tempfile.TemporaryDirectory(prefix="bench-runtime-") as tmp:
        res = run_job(Path(tmp), args.steps, args.delays_ms, args.victims, args.timeout_s)
    summary = report(res, args.delays_ms, args.victims)
    summary["load_avg_1min"] = [load, os.getloadavg()[0]]
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "raw": res}, indent=1))
        log(f"raw numbers written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
