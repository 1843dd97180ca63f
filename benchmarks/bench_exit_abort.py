"""How often the example trainer dies of SIGABRT at exit, with and without the fix, with and
without faultlab.

    python benchmarks/bench_exit_abort.py                     # 20 runs a condition, ~8 min
    python benchmarks/bench_exit_abort.py --no-shim           # the machine's own load only
    python benchmarks/bench_exit_abort.py --faultlab-root /path/to/other/checkout  # before/after

The abort (finding ``abort_at_exit``, ``faultlab.observe.launch_findings``): a rank of
``examples/fsdp2_dcp`` prints ``terminate called without an active exception`` and dies of
SIGABRT after its last step: torch 2.13's gloo race at interpreter exit. It needs a busy
machine to show, so by default this script widens the window on purpose: a tiny ``LD_PRELOAD``
shim (compiled here with ``cc``) makes every gloo worker thread sleep ``--delays-ms`` after
running a work and before releasing it, as a preempted thread would.

Each run: 2 ranks resume from a step-4 DCP checkpoint, train steps 5-6 and save, fault-free.
Four conditions, interleaved: the trainer as shipped (``fixed``: it ends with ``os._exit(0)``)
and the same file without its marked fix block (``unfixed``), each under plain torchrun
(``plain``: no faultlab at all) and with faultlab's level-0 bootstrap (``level0``). Whether
faultlab changes the rate is the comparison of ``plain`` and ``level0``; whether the fix works,
of ``unfixed`` and ``fixed``. Printed: runs, aborts (``terminate called`` in the output, or a
rank killed by SIGABRT) and other failures per condition.
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
FIX_BEGIN, FIX_END = "# abort-at-exit fix: begin", "# abort-at-exit fix: end"

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


def _launch(trainer: Path, ckpt: Path, steps: int, env: dict[str, str], cwd: Path
            ) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", str(trainer), "--steps", str(steps), "--ckpt-every", "2", "--ckpt-dir",
           str(ckpt)]
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=600,
                          check=False)
    return proc.returncode, proc.stdout + proc.stderr


def _unfixed(work: Path) -> Path:
    """The example as it was before the fix: its marked fix block left out."""
    text = TRAINER.read_text()
    begin, end = text.index(FIX_BEGIN), text.index(FIX_END) + len(FIX_END)
    out = work / "train_unfixed.py"
    out.write_text(text[:text.rindex("\n", 0, begin) + 1] + text[end:].lstrip(" "))
    return out


def _one(i: int, condition: str, delay_ms: int, base: Path, work: Path, shim: Path | None,
         faultlab_root: Path, trainers: dict[str, Path]) -> tuple[str, int, str]:
    launcher, variant = condition.split("/")
    d = work / f"run{i}-{launcher}-{variant}"
    shutil.copytree(base / "ckpt" / "step_4", d / "ckpt" / "step_4")
    env = _env(faultlab_root, d / "run" if launcher == "level0" else None, None)
    if shim is not None:
        env.update(LD_PRELOAD=str(shim), SLOWGLOO_MS=str(delay_ms))
    rc, out = _launch(trainers[variant], d / "ckpt", 6, env, d)
    shutil.rmtree(d, ignore_errors=True)
    if "terminate called" in out or "(SIGABRT)" in out:
        return condition, delay_ms, "abort"
    return condition, delay_ms, "ok" if rc == 0 else f"rc {rc}"


def main() -> None:
    from _table import print_table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="launches per condition")
    parser.add_argument("--delays-ms", default="20,30,40,50",
                        help="gloo worker sleeps after each work, cycled over the runs")
    parser.add_argument("--parallel", type=int, default=2, help="launches at once")
    parser.add_argument("--no-shim", action="store_true",
                        help="no LD_PRELOAD shim: only the machine's own load")
    parser.add_argument("--conditions",
                        default="plain/unfixed,level0/unfixed,plain/fixed,level0/fixed")
    parser.add_argument("--faultlab-root", type=Path, default=REPO_ROOT,
                        help="the checkout whose faultlab the ranks import")
    args = parser.parse_args()
    if str(args.faultlab_root) not in sys.path:
        sys.path.insert(0, str(args.faultlab_root))
    delays = [int(x) for x in args.delays_ms.split(",")]
    conditions = args.conditions.split(",")
    with tempfile.TemporaryDirectory(prefix="faultlab-exit-abort-") as tmp:
        work = Path(tmp)
        shim = None if args.no_shim else _shim(work)
        trainers = {"fixed": TRAINER, "unfixed": _unfixed(work)}
        base = work / "base"
        rc, out = _launch(TRAINER, base / "ckpt", 4, _env(args.faultlab_root, None, None), work)
        if rc != 0:
            sys.exit(f"the step-4 checkpoint run failed (rc {rc}):\n{out[-3000:]}")
        jobs = [(i, c, delays[i % len(delays)]) for i in range(args.runs) for c in conditions]
        with ThreadPoolExecutor(args.parallel) as pool:
            results = list(pool.map(
                lambda j: _one(*j, base, work, shim, args.faultlab_root, trainers), jobs))
    rows = []
    for condition in conditions:
        got = [r for c, _dl, r in results if c == condition]
        rows.append([condition, str(len(got)), str(got.count("abort")),
                     f"{got.count('abort') / len(got):.0%}" if got else "—",
                     str(sum(r not in ("ok", "abort") for r in got))])
    load = "the machine's own load" if shim is None else "gloo workers slowed"
    print_table(f"abort at exit: examples/fsdp2_dcp, fault-free, with and without the fix "
                f"({load})",
                [f"faultlab from {args.faultlab_root}",
                 "shim: " + ("none (the machine's own load)" if shim is None
                             else f"gloo worker sleeps {args.delays_ms} ms after each work"),
                 "plain: no faultlab; level0: faultlab's bootstrap; unfixed: the example "
                 "without its os._exit(0) block"],
                ["condition", "runs", "aborts", "rate", "other failures"], rows)


if __name__ == "__main__":
    main()
