"""What the storage faults' FUSE passthrough costs a job that writes checkpoints (issue 23).

Direct against through the mount (``faultlab.storage``, no rule set), on the same directory:
- a large sequential write (1 MiB ``write`` calls, then ``fsync``), MB/s;
- many small files (create, 4 KiB write, fsync, close each), files/s and MB/s;
- a DCP checkpoint save of a small model by one process (``FileSystemWriter``), seconds.
Each is timed ``--rounds`` times, direct and mounted in alternating order, and the medians
printed with their ratio (mounted/direct throughput; for the save, mounted/direct time).
Needs root (or fusermount3) and /dev/fuse.

    python benchmarks/bench_storage.py [--size-mb 256] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from faultlab.storage import StorageMount, fuse_unavailable


def seq_write(d: Path, size_mb: int) -> float:
    block = os.urandom(1 << 20)
    t = time.perf_counter()
    fd = os.open(d / "big.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for _ in range(size_mb):
        os.write(fd, block)
    os.fsync(fd)
    os.close(fd)
    return time.perf_counter() - t


def small_files(d: Path, num_files: int) -> float:
    data = os.urandom(4096)
    (d / "small").mkdir(exist_ok=True)
    t = time.perf_counter()
    for i in range(num_files):
        fd = os.open(d / "small" / f"f{i:05d}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, data)
        os.fsync(fd)
        os.close(fd)
    return time.perf_counter() - t


def dcp_save(d: Path, params_m: float) -> float:
    import torch
    import torch.distributed.checkpoint as dcp

    n = int((params_m * 1e6) ** 0.5)
    state = {"w": torch.randn(n, n), "opt": {"m": torch.randn(n, n), "v": torch.randn(n, n)}}
    t = time.perf_counter()
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(d / "ckpt"), thread_count=1))
    return time.perf_counter() - t


def _clean(d: Path) -> None:
    for p in d.iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def measure(fn: Callable[[Path], float], root: Path, rounds: int) -> tuple[float, float]:
    """Median seconds of ``fn`` direct and through the mount, the order alternating per round
    (whichever runs first pays the page cache's and the allocator's first touch)."""
    direct: list[float] = []
    mounted: list[float] = []

    def through_mount() -> None:
        mount = StorageMount.start(root, root.parent / "state")
        try:
            mounted.append(fn(root))
            _clean(root)
        finally:
            mount.stop()

    for i in range(rounds):
        if i % 2:
            through_mount()
        direct.append(fn(root))
        _clean(root)
        if not i % 2:
            through_mount()
    return statistics.median(direct), statistics.median(mounted)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=256)
    ap.add_argument("--num-files", type=int, default=1000)
    ap.add_argument("--params-m", type=float, default=16.0, help="model size, millions")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    args = ap.parse_args()
    why = fuse_unavailable()
    if why:
        raise SystemExit(f"bench_storage: {why}")
    base = Path(tempfile.mkdtemp(prefix="faultlab-bench-storage-", dir=args.dir))
    root = base / "data"
    root.mkdir()
    try:
        d, m = measure(lambda p: seq_write(p, args.size_mb), root, args.rounds)
        print(f"sequential write {args.size_mb} MiB (1 MiB writes + fsync): direct "
              f"{args.size_mb * 1.048576 / d:7.0f} MB/s, through the mount "
              f"{args.size_mb * 1.048576 / m:7.0f} MB/s, ratio {d / m:.2f}")
        d, m = measure(lambda p: small_files(p, args.num_files), root, args.rounds)
        mb = args.num_files * 4096 / 1e6
        print(f"{args.num_files} small files (4 KiB, fsync each): direct "
              f"{args.num_files / d:6.0f} files/s ({mb / d:5.1f} MB/s), through the mount "
              f"{args.num_files / m:6.0f} files/s ({mb / m:5.1f} MB/s), ratio {d / m:.2f}")
        d, m = measure(lambda p: dcp_save(p, args.params_m), root, args.rounds)
        print(f"DCP save of {args.params_m * 3:g} M floats "
              f"({args.params_m * 3 * 4:.0f} MB, one process): direct {d:.2f} s, through the "
              f"mount {m:.2f} s, ratio {m / d:.2f}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
