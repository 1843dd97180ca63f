"""Run the shipped suite through the plugin under pytest-xdist N times in a row; print a summary.

    python -m pytest_faultlab.soak --rounds 10 [--workers 2] [--out DIR] [EXPERIMENT ...]

Each round is ``pytest -p faultlab EXPERIMENTS -n WORKERS`` with its own report folder and a
golden cache shared by all rounds. After a round it checks for collisions: one run folder per
experiment, distinct rendezvous endpoints, and no "address already in use" in any job log.
Exit status 0 when every round passed with no collision.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

SHIPPED = ["experiments/rank_kill.yaml", "experiments/rank_hang.yaml",
           "experiments/node_loss_elastic.yaml"]
COLLISION_SIGNS = ("address already in use", "eaddrinuse", "errno 98")


def collisions(report_dir: Path, expected: int) -> list[str]:
    found = []
    journals = sorted(report_dir.glob("*/journal.json"))
    if len(journals) != expected:
        found.append(f"{len(journals)} run folders for {expected} experiments")
    spans: dict[str, list[tuple[float, float, str]]] = {}  # endpoint -> live intervals
    for j in journals:
        launch = j.parent / "job" / "launch.json"
        if not launch.exists():
            continue
        ep = json.loads(launch.read_text()).get("rdzv_endpoint")
        run = json.loads(j.read_text())["run"]
        span = (run["started_t"], run["ended_t"], j.parent.name)
        for a, b, other in spans.get(ep, []):
            if a < span[1] and span[0] < b:  # both jobs alive at once on one endpoint
                found.append(f"rendezvous endpoint {ep} shared by {other} and {span[2]}")
        spans.setdefault(ep, []).append(span)
    for log in report_dir.glob("*/job/logs/*.log"):
        text = log.read_text(errors="replace").lower()
        found += [f"{log}: {sign!r}" for sign in COLLISION_SIGNS if sign in text]
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pytest_faultlab.soak", description=__doc__)
    p.add_argument("experiments", nargs="*", default=SHIPPED)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--workers", default="2")
    p.add_argument("--out", type=Path, default=None, help="default: a new temporary folder")
    args = p.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="faultlab-soak-"))
    golden = out / "golden"
    summary = []
    for n in range(1, args.rounds + 1):
        reports = out / f"round-{n:02d}"
        junit = reports / "junit.xml"
        t0 = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "faultlab", "-p", "no:cacheprovider",
             *args.experiments, "-n", args.workers, "-q", "--faultlab-report-dir", str(reports),
             "--faultlab-golden-cache", str(golden), f"--junitxml={junit}"],
            capture_output=True, text=True)
        took = time.monotonic() - t0
        failed = []
        if junit.exists():
            for case in ET.parse(junit).getroot().iter("testcase"):
                if case.find("failure") is not None or case.find("error") is not None:
                    failed.append(case.get("name"))
        problems = collisions(reports, len(args.experiments))
        ok = proc.returncode == 0 and not problems
        summary.append((n, ok, took, failed, problems))
        print(f"round {n}/{args.rounds}: {'PASS' if ok else 'FAIL'} in {took:.0f} s "
              f"(exit {proc.returncode}; failed: {failed or 'none'}; collisions: "
              f"{problems or 'none'})", flush=True)
        if proc.returncode != 0:
            print(proc.stdout[-4000:], flush=True)
    passed = sum(ok for _n, ok, *_ in summary)
    print(f"summary: {passed}/{len(summary)} rounds passed, "
          f"{sum(len(s[4]) for s in summary)} collision(s); reports in {out}")
    return 0 if passed == len(summary) else 1


if __name__ == "__main__":
    sys.exit(main())
