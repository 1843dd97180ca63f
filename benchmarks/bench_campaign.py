"""Benchmark: a long failure campaign on the reference trainer, its table for the README.

    python benchmarks/bench_campaign.py                       # a fault every 40 of 1000 steps
    python benchmarks/bench_campaign.py --mtbf-steps 20 --steps 400 --seed 3
    python benchmarks/bench_campaign.py --mtbf-s 15 --duration-s 300   # the wall clock

It takes ``experiments/campaign_reference.yaml`` (the mix of CI's short campaign: rank_kill,
grad_nan, collective_error, io_error, gpu_oom on 2 nodes of 1 rank), stretches it to
``--steps`` at one fault every ``--mtbf-steps`` on average (the step clock; or, with
``--mtbf-s``, over a window of ``--duration-s`` seconds on the wall clock, with enough steps to
outlast it), sizes torchrun's restart budget for the arrivals, runs it through the same engine as
``faultlab run`` and prints the campaign's headline and per-fault-type table (the journal and
report.html in the run folder have every injection).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from faultlab.engine.campaign import run_campaign  # noqa: E402
from faultlab.report.campaign import TYPE_COLUMNS, summary_rows, type_rows  # noqa: E402
from faultlab.spec import load_campaign  # noqa: E402

STEP_S_GUESS = 0.2
"""Seconds per step of the tiny preset under load, to size the run (measured 0.13-0.14 s alone;
restarts add replayed steps, so the run is sized with margin)."""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration-s", type=float, default=300.0)
    p.add_argument("--mtbf-steps", type=float, default=40.0,
                   help="the step clock: one fault every N steps on average (default 40)")
    p.add_argument("--steps", type=int, default=1000, help="the run's steps (default 1000)")
    p.add_argument("--mtbf-s", type=float, default=None,
                   help="the wall clock instead: one fault every S seconds, for --duration-s")
    p.add_argument("--seed", type=int, default=36)
    p.add_argument("--report-dir", type=Path, default=None)
    args = p.parse_args()
    loaded = load_campaign(REPO / "experiments" / "campaign_reference.yaml", seed=args.seed)
    assert loaded is not None
    base, line = loaded
    mix = base.campaign.model_dump(mode="json", exclude_none=True)["mix"]
    if args.mtbf_s is None:
        steps = args.steps
        arrivals = steps / args.mtbf_steps
        campaign = {"mtbf_steps": args.mtbf_steps, "start_after_step": 5,
                    "until_step": steps - 10, "mix": mix}
        timeout_s = steps * STEP_S_GUESS * 2 + arrivals * 30
        what = f"mtbf {args.mtbf_steps:g} steps over {steps} steps"
    else:
        steps = math.ceil(args.duration_s * 1.2 / STEP_S_GUESS / 10) * 10
        arrivals = args.duration_s / args.mtbf_s
        campaign = {"mtbf_s": args.mtbf_s, "duration_s": args.duration_s,
                    "start_after_s": 10, "mix": mix}
        timeout_s = args.duration_s * 3
        what = f"mtbf {args.mtbf_s:g} s over {args.duration_s:g} s, {steps} steps"
    doc = base.model_validate({
        **base.model_dump(mode="json", exclude_none=True),
        "name": "campaign_bench",
        # Every arrival may cost a restart: torchrun's restarts must not run out first.
        "topology": {**base.topology.model_dump(mode="json", exclude_none=True),
                     "max_restarts": math.ceil(arrivals * 2) + 5},
        "run": {"steps": steps, "checkpoint_every": 10, "timeout_s": timeout_s},
        "campaign": campaign,
    })
    report_dir = args.report_dir or Path(tempfile.mkdtemp(prefix="bench-campaign-"))
    ran = run_campaign(doc, line=line, report_dir=report_dir)
    score = ran.score.to_dict()
    print(f"campaign_bench: seed {args.seed}, {what}, verdict {ran.verdict}; run folder "
          f"{ran.result.run_folder}")
    print("\n| | |\n| --- | --- |")
    for k, v in summary_rows(score):
        print(f"| {k} | {v} |")
    print("\n| " + " | ".join(TYPE_COLUMNS) + " |\n|" + " --- |" * len(TYPE_COLUMNS))
    for row in type_rows(score):
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
