"""A guard process that cleans up a job if faultlab itself dies (SIGKILL, OOM, a crash).

The engine starts it in a session of its own and keeps ``--pidfile`` current with every pid of
the job. When the engine's process disappears without having stopped the guard, the guard
continues every listed process (a SIGSTOPped rank or node must not be left frozen) and kills it
and its descendants (a storage passthrough's mount, ``--storage-guard``, is removed first: its
hung operations are released, so no process of the job is left in the kernel); it then hands
what the target made outside the job (``--target-guard``, the record ``Target.guard_record``
keeps current, with the launcher's name) to the class registered as that launcher
(``Target.undo_from_guard``: the docker target removes the run's containers, network and image,
the slurm target cancels the job and returns to service every node a fault set down or killed;
a team's target undoes what it recorded). For a job with gpu faults (``--gpu-dir``, the job's
``gpu/`` directory) it removes every node's GPU state file, so a sticky GPU failure never
outlives faultlab (the Xid logs stay, as evidence). On a normal exit the engine terminates the
guard first.

    python -m faultlab.reaper --parent PID --pidfile FILE [--target-guard FILE]
                              [--gpu-dir DIR] [--storage-guard FILE]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

import psutil


def continue_and_kill(pids: list[int]) -> int:
    """SIGCONT then SIGKILL each process and its descendants (a stopped process must be
    continued to die promptly); returns how many were signalled."""
    procs: list[psutil.Process] = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            procs += [p, *p.children(recursive=True)]
        except psutil.Error:
            pass
    for p in procs:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass
    psutil.wait_procs(procs, timeout=5)
    return len(procs)


def _reap(pidfile: Path) -> int:
    try:
        pids = json.loads(pidfile.read_text())
    except (OSError, ValueError):
        return 0
    return continue_and_kill(pids)


def undo_target(guard: Path) -> list[str]:
    """What the target recorded for the guard (``--target-guard``: ``{"launcher": name,
    "record": ...}``, ``Target.guard_record``), undone by the class registered as that
    launcher (``Target.undo_from_guard``): one line per thing done."""
    doc = json.loads(guard.read_text())
    if doc.get("record") is None:
        return []
    from faultlab.targets import target_type

    return list(target_type(doc["launcher"]).undo_from_guard(doc["record"]))


def _undo_target(guard: Path) -> None:
    try:
        done = undo_target(guard)
        print(f"faultlab reaper: target: {'; '.join(done) or 'nothing to undo'}",
              file=sys.stderr)
    except Exception as e:  # noqa: BLE001 - report, never crash the guard
        print(f"faultlab reaper: could not undo what the target left ({guard}): "
              f"{type(e).__name__}: {e}", file=sys.stderr)


def clear_gpu_state(gpu_dir: Path) -> list[str]:
    """Remove every node's GPU state file under ``gpu_dir`` (``RUN_DIR/gpu``): the sticky and
    every other gpu fault end with faultlab; the kernel-log stand-ins stay."""
    cleared = []
    for state in sorted(gpu_dir.glob("*/state.json")):
        try:
            state.unlink()
            cleared.append(str(state))
        except OSError:
            pass
    return cleared


def _unmount_storage(guard: Path) -> None:
    try:
        from faultlab.storage.mount import restore_from_guard

        done = restore_from_guard(guard)
        print(f"faultlab reaper: storage: {'; '.join(done)}", file=sys.stderr)
    except Exception as e:  # noqa: BLE001 - report, never crash the guard
        print(f"faultlab reaper: could not unmount the storage passthrough ({guard}): {e}; "
              f"run `umount -l` on the job's checkpoint directory", file=sys.stderr)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="faultlab.reaper")
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--pidfile", type=Path, required=True)
    parser.add_argument("--interval-s", type=float, default=0.5)
    parser.add_argument("--target-guard", type=Path, default=None,
                        help="the target's guard record (launcher and what it made)")
    parser.add_argument("--gpu-dir", type=Path, default=None,
                        help="the job's gpu/ directory (GPU state files to clear)")
    parser.add_argument("--storage-guard", type=Path, default=None,
                        help="the storage passthrough's guard file (faultlab.storage.mount)")
    args = parser.parse_args(argv)
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for faultlab is not for us
    while not stop:
        if not _alive(args.parent):
            if args.storage_guard is not None and args.storage_guard.exists():
                _unmount_storage(args.storage_guard)
            n = _reap(args.pidfile)
            print(f"faultlab reaper: engine {args.parent} died; killed {n} process(es) of "
                  f"the job", file=sys.stderr)
            if args.target_guard is not None and args.target_guard.exists():
                _undo_target(args.target_guard)
            if args.gpu_dir is not None:
                cleared = clear_gpu_state(args.gpu_dir)
                print(f"faultlab reaper: cleared {len(cleared)} GPU state file(s) under "
                      f"{args.gpu_dir}", file=sys.stderr)
            return 0
        time.sleep(args.interval_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
