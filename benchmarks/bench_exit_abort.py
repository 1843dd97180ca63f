"""How often the unchanged example trainer dies of SIGABRT at exit after a level-0 grad_nan run.

    python benchmarks/bench_exit_abort.py                        # ~5 min on 2 CPU cores
    python benchmarks/bench_exit_abort.py --runs 20 --parallel 2 --delays-ms 20,30,40,50
    python benchmarks/bench_exit_abort.py --faultlab-root /path/to/other/checkout  # before/after

The symptom (CI, tests/integration/test_level0.py): rank 1 of ``examples/fsdp2_dcp`` printed
``terminate called without an active exception`` and died of SIGABRT after its last step. The
cause is a race (module docstring of ``faultlab.runtime.interposer``): a gloo worker thread
releases its last finished work after the rank's main thread has entered ``Py_FinalizeEx``. It
needs a busy machine to show, so this script widens the window on purpose: a tiny
``LD_PRELOAD`` shim (compiled here with ``cc``) makes every gloo worker thread sleep
``--delays-ms`` after running a work and before releasing it, as a preempted thread would.

Each run is launch 2 of the integration test: 2 ranks resume from a step-4 DCP checkpoint, train
steps 5-6 and save. Two conditions, alternated: ``level0`` (faultlab's bootstrap, a grad_nan
planned on rank 1 at step 5, as in the test) and ``plain`` (no faultlab at all: whether the
abort is faultlab's doing). Printed: runs, aborts (``terminate called`` in the output, or a
rank killed by SIGABRT) and other failures per condition and delay.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
TRAINER = REPO_ROOT / "examples" / "fsdp2_dcp" / "train.py"

_EXECUTE = ("_ZN4c10d16ProcessGroupGloo9AsyncWork7executeERKN3c1013intrusive_ptrIS1_NS2_6"
            "detail34intrusive_target_default_null_typeIS1_EEEE")
"""``c10d::ProcessGroupGloo::AsyncWork::execute(intrusive_ptr<AsyncWork> const&)``, mangled."""
_SHIM_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>
#define SYM "@EXECUTE@"
typedef void (*exec_t)(const void*);
/* ProcessGroupGloo::runLoop calls AsyncWork::execute through the PLT: run it, then sleep before
   runLoop drops its reference to the work. */
void @EXECUTE@(const void* work) {
  static exec_t real = 0;
  if (!real) {
    void* h = dlopen("libtorch_cpu.so", RTLD_NOW | RTLD_NOLOAD);
    real = (exec_t)dlsym(h ? h : RTLD_NEXT, SYM);
  }
  real(work);
  const char* ms = getenv("SLOWGLOO_MS");
  usleep((ms ? atoi(ms) : 30) * 1000);
}
"""


def _shim(workdir: Path) -> Path:
    src, lib = workdir / "slowgloo.c", workdir / "slowgloo.so"
    src.write_text(_SHIM_C.replace("@EXECUTE@", _EXECUTE))
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(lib), str(src), "-ldl"],
                   check=True)
    return lib


def _env(faultlab_root: Path, run_dir: Path | None, plan: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTLAB_")}
    if run_dir is not None:
        boot = faultlab_root / "faultlab" / "runtime" / "bootstrap"
        env.update(PYTHONPATH=os.pathsep.join([str(boot), str(faultlab_root)]),
                   FAULTLAB_BOOTSTRAP="1", FAULTLAB_RUN_DIR=str(run_dir))
        if plan is not None:
            env["FAULTLAB_RUNTIME_PLAN"] = str(plan)
    return env


def _launch(ckpt: Path, steps: int, env: dict[str, str], cwd: Path) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", str(TRAINER), "--steps", str(steps), "--ckpt-every", "2", "--ckpt-dir",
           str(ckpt)]
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=600,
                          check=False)
    return proc.returncode, proc.stdout + proc.stderr


def _one(i: int, mode: str, delay_ms: int, base: Path, work: Path, shim: Path | None,
         faultlab_root: Path) -> tuple[str, int, str]:
    from faultlab.runtime.plan import write_plan

    d = work / f"run{i}-{mode}"
    shutil.copytree(base / "ckpt" / "step_4", d / "ckpt" / "step_4")
    run_dir = plan = None
    if mode == "level0":
        run_dir = d / "run"
        plan = write_plan(run_dir / "runtime" / "plan.json", [
            {"id": "nan", "type": "grad_nan", "ranks": [1], "steps": [5],
             "params": {"param_glob": "blocks.0.*"}}])
    env = _env(faultlab_root, run_dir, plan)
    if shim is not None:
        env.update(LD_PRELOAD=str(shim), SLOWGLOO_MS=str(delay_ms))
    rc, out = _launch(d / "ckpt", 6, env, d)
    shutil.rmtree(d, ignore_errors=True)
    if "terminate called" in out or "(SIGABRT)" in out:
        return mode, delay_ms, "abort"
    return mode, delay_ms, "ok" if rc == 0 else f"rc {rc}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=12, help="launches per condition")
    parser.add_argument("--delays-ms", default="20,30,40,50",
                        help="gloo worker sleeps after each work, cycled over the runs")
    parser.add_argument("--parallel", type=int, default=2, help="launches at once")
    parser.add_argument("--no-shim", action="store_true",
                        help="no LD_PRELOAD shim: only the machine's own load")
    parser.add_argument("--modes", default="level0,plain")
    parser.add_argument("--faultlab-root", type=Path, default=REPO_ROOT,
                        help="the checkout whose faultlab the ranks import")
    args = parser.parse_args()
    if str(args.faultlab_root) not in sys.path:
        sys.path.insert(0, str(args.faultlab_root))
    delays = [int(x) for x in args.delays_ms.split(",")]
    modes = args.modes.split(",")
    with tempfile.TemporaryDirectory(prefix="faultlab-exit-abort-") as tmp:
        work = Path(tmp)
        shim = None if args.no_shim else _shim(work)
        base = work / "base"
        rc, out = _launch(base / "ckpt", 4, _env(args.faultlab_root, base / "run", None), work)
        if rc != 0:
            sys.exit(f"the step-4 checkpoint run failed (rc {rc}):\n{out[-3000:]}")
        jobs = [(i, mode, delays[i % len(delays)]) for i in range(args.runs) for mode in modes]
        with ThreadPoolExecutor(args.parallel) as pool:
            results = list(pool.map(lambda j: _one(*j, base, work, shim, args.faultlab_root),
                                    jobs))
    print(f"faultlab from {args.faultlab_root}; shim: "
          f"{'none' if shim is None else 'gloo worker sleeps ' + args.delays_ms + ' ms'}")
    print(f"{'condition':<10} {'delay_ms':>8} {'runs':>5} {'aborts':>7} {'other':>6}")
    for mode in modes:
        for delay in [*sorted(set(delays)), None]:
            rows = [r for m, dl, r in results if m == mode and (delay is None or dl == delay)]
            if not rows:
                continue
            label = "all" if delay is None else str(delay)
            print(f"{mode:<10} {label:>8} {len(rows):>5} {rows.count('abort'):>7} "
                  f"{sum(r not in ('ok', 'abort') for r in rows):>6}")


if __name__ == "__main__":
    main()
