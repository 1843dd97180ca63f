"""The shipped examples under their own launch line: what a team running them with plain torchrun
would see, against the verdict CI asserts for them under faultlab's launcher (the bar).

Every example experiment under ``examples/*/experiments`` that pins ``launch: faultlab`` and
restarts the job (a rank killed, a failed save) is run again with ``launch: torchrun``: the same
trainer and faults under plain torchrun, its defaults (c10d, the store in node 0's agent, the
workers sharing it). Runs are interleaved, N rounds. Printed per run: the verdict and the SLAs
that failed, and whether the failure is the trainer's own finding (the one tests/examples
asserts under faultlab's launcher) or torchrun's: a restart that hung until the timeout
(``restart_hung``) or a restart that needed another (``stale_worker_store``), both named in the
verdict by ``faultlab.observe.launch_findings``.

    python benchmarks/bench_examples_launch.py [--runs 3] [--timeout-s 240] [EXPERIMENT ...]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from _table import print_table

from faultlab.engine import run_experiment
from faultlab.spec import load_experiment

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = [f"examples/{name}.yaml" for name in (
    "fsdp2_dcp/experiments/rank_kill", "lightning_ddp/experiments/rank_kill",
    "fsdp2_dcp/experiments/ckpt_bitflip", "lightning_ddp/experiments/ckpt_bitflip",
    "fsdp2_dcp/experiments/disk_full", "lightning_ddp/experiments/disk_full")]


def outcome(result) -> str:  # type: ignore[no-untyped-def]
    """The run's outcome in a few words: whose failure it shows."""
    notes = {s.name: s.note or "" for s in result.slas if s.result in ("fail", "inconclusive")}
    if any("never trained again until the timeout" in n for n in notes.values()):
        return "torchrun: the restart hung until the timeout (restart_hung)"
    if any("connectFullMesh failed" in n for n in notes.values()):
        return f"torchrun: one more restart (stale_worker_store), failing {', '.join(notes)}"
    return "pass" if not notes else f"the trainer's finding: {', '.join(notes)}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--timeout-s", type=float, default=240)
    p.add_argument("experiments", nargs="*", default=DEFAULT)
    args = p.parse_args(argv)
    rows, t0 = [], time.monotonic()
    torchrun_failures = 0
    with tempfile.TemporaryDirectory(prefix="bench-examples-") as tmp:
        for round_ in range(args.runs):
            for path in args.experiments:
                exp = load_experiment(ROOT / path)
                exp = exp.model_copy(update={
                    "target": exp.target.model_copy(update={"launch": "torchrun"}),
                    "run": exp.run.model_copy(update={"timeout_s": args.timeout_s})})
                r = run_experiment(exp, report_dir=Path(tmp), golden_cache=Path(tmp) / ".golden")
                seen = outcome(r)
                torchrun_failures += seen.startswith("torchrun")
                m = r.metrics
                rows.append([str(round_ + 1), path.removeprefix("examples/")
                             .replace("/experiments", ""), str(m.restarts),
                             "—" if m.resume_time_s is None else f"{m.resume_time_s:.2f} s", seen])
                print(" | ".join(rows[-1]), flush=True)
    print_table("the examples under plain torchrun (launch: torchrun)",
                [f"{args.runs} interleaved rounds, {time.monotonic() - t0:.0f} s in all; "
                 f"{torchrun_failures} of {len(rows)} runs failed in torchrun's restart, "
                 f"not in the trainer"],
                ["round", "experiment", "restarts", "resume", "outcome"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
