"""What the rank's bootstrap costs to import, and what it pulls in.

    python benchmarks/bench_rank_import.py            # ~10 s on 2 idle CPU cores
    python benchmarks/bench_rank_import.py --runs 20 --out rank_import.json

For each module a rank imports at start-up (the level-0 bootstrap's ``faultlab.runtime.auto``,
the agent a trainer attaches, ``faultlab.runtime``), ``--runs`` fresh interpreters each import
it alone and time the import (``perf_counter`` around ``importlib.import_module``; torch is not
imported by any of them). Reported: the median and the spread in ms, and whether pydantic or any
engine-side package of faultlab was loaded (it must not be: a rank pays for what it imports).
Exit status 1 if one was.

Measured on the shared 2-core machine, before and after in-rank faults became actions named
by import path (issue 46, item 2), two interleaved rounds of 20 processes each, median ms:

    module                    before (afad582)   after
    faultlab.runtime          33.6 / 31.7        33.3 / 27.1
    faultlab.runtime.agent    34.0 / 32.3        32.9 / 27.3
    faultlab.runtime.auto     42.7 / 35.4        40.5 / 36.2

No change beyond the noise: the agent imports ``hooks`` (standard library only) instead of
the collective faults, and no action module until a plan names one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

MODULES = ("faultlab.runtime", "faultlab.runtime.agent", "faultlab.runtime.auto")
FORBIDDEN = ("pydantic", "faultlab.engine", "faultlab.spec", "faultlab.faults",
             "faultlab.fault_api", "faultlab.judge", "faultlab.targets", "torch")

_PROBE = """
import importlib, json, sys, time
t0 = time.perf_counter()
importlib.import_module(sys.argv[1])
dt = time.perf_counter() - t0
bad = sorted(m for m in sys.modules if any(m == f or m.startswith(f + ".") for f in {forbidden}))
print(json.dumps({{"s": dt, "forbidden": bad}}))
"""


def measure(module: str, runs: int) -> dict[str, object]:
    probe = _PROBE.format(forbidden=repr(FORBIDDEN))
    times, forbidden = [], set()
    root = Path(__file__).resolve().parents[1]
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", probe, module], capture_output=True,
                             text=True, check=True, cwd=root)
        doc = json.loads(out.stdout)
        times.append(doc["s"] * 1000)
        forbidden.update(doc["forbidden"])
    return {"module": module, "runs": runs, "median_ms": round(statistics.median(times), 2),
            "min_ms": round(min(times), 2), "max_ms": round(max(times), 2),
            "forbidden_loaded": sorted(forbidden)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    rows = [measure(m, args.runs) for m in MODULES]
    for r in rows:
        print(f"{r['module']:<28} median {r['median_ms']:7.2f} ms  "
              f"({r['min_ms']:.2f} .. {r['max_ms']:.2f})  forbidden: "
              f"{', '.join(r['forbidden_loaded']) or 'none'}")  # type: ignore[arg-type]
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 1 if any(r["forbidden_loaded"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
