"""`make demo`: a 2-node elastic job of the reference trainer; one rank is SIGKILLed mid-run.

It shows what faultlab experiments will automate: the job notices the dead rank, torchrun
restarts the worker group, the ranks resume from the last checkpoint and training finishes.
A golden run without the fault runs first, and the two final digests are compared.

    python -m reference_trainer.demo [--run-dir DIR] [--steps N]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from reference_trainer.config import TrainConfig
from reference_trainer.events import read_events
from reference_trainer.launch import LocalJob


def _say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _digest(run_dir: Path) -> str | None:
    found = [e for e in read_events(run_dir / "events") if e["kind"] == "final_digest"]
    return found[-1]["digest"] if found else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reference_trainer.demo")
    parser.add_argument("--run-dir", type=Path,
                        default=Path("reports") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--kill-at-step", type=int, default=23)
    args = parser.parse_args(argv)

    def config(run_dir: Path) -> TrainConfig:
        return TrainConfig(run_dir=run_dir, preset="tiny", steps=args.steps,
                           checkpoint_every=10, seed=0, watchdog_s=30, pg_timeout_s=60)

    golden_dir, faulted_dir = args.run_dir / "golden", args.run_dir / "faulted"
    _say(f"golden run: 2 nodes x 1 rank, {args.steps} steps, no fault ({golden_dir})")
    with LocalJob(cfg=config(golden_dir), nodes=2) as job:
        golden = job.wait(timeout_s=600)
    if not golden.ok:
        _say(f"golden run failed: {golden.returncodes}; logs in {golden_dir / 'logs'}")
        return 1
    _say(f"golden run finished in {golden.wall_s:.1f} s, digest {_digest(golden_dir)}")

    _say(f"faulted run: the same job; rank 1 is SIGKILLed after step {args.kill_at_step}")
    with LocalJob(cfg=config(faulted_dir), nodes=2) as job:
        t_kill = None
        while t_kill is None and not job.poll():
            events = read_events(faulted_dir / "events")
            steps = [e["step"] for e in events if e["kind"] == "step"]
            if steps and max(steps) >= args.kill_at_step:
                victim = [e for e in events if e["kind"] == "start" and e["rank"] == 1][-1]
                os.kill(victim["pid"], signal.SIGKILL)
                t_kill = time.time()
                _say(f"killed rank 1 (pid {victim['pid']}, {victim['node']}) at step "
                     f"{max(steps)}")
            time.sleep(0.02)
        faulted = job.wait(timeout_s=600)

    events = read_events(faulted_dir / "events")
    if t_kill is None:
        _say("the run finished before the kill could land; nothing to show")
        return 1
    noticed = [e for e in events if e["t"] > t_kill and e["kind"] in ("exit", "anomaly")]
    loaded = [e for e in events if e["t"] > t_kill and e["kind"] == "checkpoint_loaded"]
    resumed = [e for e in events if e["t"] > t_kill and e["kind"] == "step"]
    if noticed:
        _say(f"+{noticed[0]['t'] - t_kill:.2f} s  rank {noticed[0]['rank']} noticed: "
             f"{noticed[0].get('error', noticed[0].get('what', ''))[:90]}")
    if loaded:
        _say(f"+{loaded[0]['t'] - t_kill:.2f} s  restarted ranks loaded checkpoint step "
             f"{loaded[0]['step']}")
    if resumed:
        _say(f"+{resumed[0]['t'] - t_kill:.2f} s  first step after the restart: step "
             f"{resumed[0]['step']} (resume time)")
    g, f = _digest(golden_dir), _digest(faulted_dir)
    _say(f"faulted run {'finished' if faulted.ok else 'FAILED'} in {faulted.wall_s:.1f} s, "
         f"digest {f}")
    same = g is not None and g == f
    _say("final state is bitwise identical to the golden run" if same else
         "final state DIFFERS from the golden run")
    return 0 if faulted.ok and same else 1


if __name__ == "__main__":
    sys.exit(main())
