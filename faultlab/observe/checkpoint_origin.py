"""Where a run's checkpoints came from: resumes from checkpoints the run did not write, and
saves outside its run directory.

Each launch (the golden run, the experiment) has a fresh run directory of its own, so a
checkpoint a run *resumes* from is legitimately one it saved itself earlier in the run. A
resume from anything else — the golden run's final checkpoint, an earlier run's, a team's real
checkpoints — makes the run start where it should have ended: a verdict on it is vacuous
("the trigger never fired", "completes: False"). And a checkpoint a run saves outside its run
directory is found by the next run that is given the same path.

Both are read from the event stream, the same at every integration level: level 0 reports
every DCP / ``torch.save`` save and load (``faultlab.runtime.auto_checkpoints``), the
reference trainer its own.

- A **foreign resume** is a ``checkpoint_loaded`` record with a step above 0 (the load put the
  run at a step) of a path that lies outside the run directory and that no
  ``checkpoint_saved`` record of the run named at or before the load. Paths are compared
  resolved (``realpath``: a ``latest`` symlink is its target), relative ones from the
  directory faultlab runs in, which is where its local ranks run. A load of step 0 or of an
  unknown step (pretrained weights, no optimizer state) is not a resume; a pretrained file
  whose *path* names a step (``base-step-5000.pt``) is, at level 0 — the one case this
  cannot tell apart.
- An **outside save** is a ``checkpoint_saved`` path outside the run directory.

Nothing here touches a file.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ForeignResume", "checkpoint_roots", "foreign_resumes", "outside_saves"]


@dataclass(frozen=True, slots=True)
class ForeignResume:
    """A checkpoint a run resumed from without having written it (one per path)."""

    path: str
    """As the record names it."""
    step: int
    ranks: tuple[int, ...] = field(default=())
    """Every rank that loaded it."""
    t: float = 0.0
    """When it was first loaded."""


def _real(path: str | os.PathLike[str]) -> str:
    return os.path.realpath(os.path.abspath(path))


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def foreign_resumes(events: Iterable[Mapping[str, Any]],
                    run_dir: str | os.PathLike[str]) -> list[ForeignResume]:
    """Every checkpoint the run resumed from without having written it (module docstring),
    in the order first loaded."""
    root = _real(run_dir)
    records = sorted((e for e in events if isinstance(e.get("t"), int | float)),
                     key=lambda e: float(e["t"]))
    saved: set[str] = set()
    found: dict[str, ForeignResume] = {}
    for e in records:
        path = e.get("path")
        if not isinstance(path, str) or "://" in path:
            continue
        real = _real(path)
        if e.get("kind") == "checkpoint_saved":
            saved.add(real)
        elif e.get("kind") == "checkpoint_loaded":
            step = _int(e.get("step"))
            if step is None or step <= 0 or real in saved or _inside(real, root):
                continue
            rank = _int(e.get("rank"))
            seen = found.get(real)
            ranks = (*(seen.ranks if seen else ()), *(() if rank is None else (rank,)))
            found[real] = ForeignResume(path, step, tuple(sorted(set(ranks))),
                                        seen.t if seen else float(e["t"]))
    return list(found.values())


def outside_saves(events: Iterable[Mapping[str, Any]],
                  run_dir: str | os.PathLike[str]) -> list[str]:
    """The paths of the run's ``checkpoint_saved`` records outside ``run_dir`` (each once, in
    the order saved)."""
    root = _real(run_dir)
    out: dict[str, None] = {}
    for e in sorted((e for e in events if isinstance(e.get("t"), int | float)),
                    key=lambda e: float(e["t"])):
        path = e.get("path")
        if e.get("kind") == "checkpoint_saved" and isinstance(path, str) and \
                "://" not in path and not _inside(_real(path), root):
            out[path] = None
    return list(out)


def checkpoint_roots(paths: Iterable[str]) -> list[str]:
    """The directories that hold ``paths`` (``ckpt/step_10`` and ``ckpt/step_20`` → ``ckpt``),
    each once: what a message names."""
    return list(dict.fromkeys(str(Path(p).parent) for p in paths))
