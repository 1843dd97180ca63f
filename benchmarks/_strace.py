"""Reading an ``strace -f -ttt -o FILE`` trace (``bench_scale.py --tables meta`` and
``bench_metadata.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path


def calls_on(trace: Path, root: str) -> Iterator[tuple[int, float, str, str]]:
    """Every completed call in ``trace`` whose arguments name a path under ``root``:
    ``(tid, time, call name, the whole traced text)``; resumed and signal lines left out."""
    with open(trace, errors="replace") as f:
        for line in f:
            parts = line.split(None, 2)
            if len(parts) < 3 or parts[2].startswith(("<...", "+++", "---")) or \
                    root not in parts[2]:
                continue
            yield int(parts[0]), float(parts[1]), parts[2].split("(", 1)[0], parts[2]
