"""Checkpoints shared between runs: when the engine stops, and what the verdict says.

A user's trainer given a fixed checkpoint path (``--ckpt-dir ckpt``, not
``--ckpt-dir {run_dir}/ckpt``) reads and writes the same checkpoints in the golden run, the
experiment and every later run: the experiment resumes from the golden run's final checkpoint
and has nothing left to do, and its verdict ("the trigger never fired", "completes: False")
says nothing of why. ``faultlab.observe.checkpoint_origin`` finds the evidence in the events;
this module decides and words it. Every message is located (the experiment file, the line of
the command's argument), names the directory and shows the ``{run_dir}`` fix.

When the engine stops (nothing injected; the verdict is ``fail`` with the message as its
error):

1. Before the golden run, when a fixed checkpoint argument names a path that already holds
   files (:func:`preexisting_checkpoints`): the golden run would resume from them and write
   into them — a team's real checkpoints included.
2. When the golden run resumed from a checkpoint it did not write (:class:`SharedCheckpoint`,
   raised by ``golden_run``, which then caches nothing: a golden run that starts at the end is
   no reference).
3. When the golden run saved checkpoints outside its run directory
   (:func:`golden_outside_message`): the experiment, given the same path, would resume from
   them.

The runner calls :func:`before_golden` and :func:`after_golden`, which raise
:class:`SharedCheckpointStop`.

After a run, a resume from a checkpoint the run did not write is a failed check of its own,
``resumed_from_own_checkpoints`` (:func:`own_checkpoints_check`), first in the verdict. An
experiment's own saves outside its run directory are only noted (the journal's
``run.checkpoints_outside``): that run itself was genuine, and the next one, given the same
path, is stopped by (1) or failed by this check. The user's files are never deleted or moved:
the messages say what is there and leave it to them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from faultlab.errors import SharedCheckpoint, SharedCheckpointStop
from faultlab.judge import SLAResult
from faultlab.observe.checkpoint_origin import (
    ForeignResume,
    checkpoint_roots,
    foreign_resumes,
)
from faultlab.spec import Experiment
from faultlab.spec.checkpoint_args import (
    CheckpointArg,
    checkpoint_args,
    checkpoint_warnings,
    command_line_of,
)

__all__ = ["OWN_CHECKPOINTS_CHECK", "SharedCheckpoint", "SharedCheckpointStop", "after_golden",
           "before_golden", "golden_outside_message", "golden_resumed_message",
           "own_checkpoints_check", "preexisting_checkpoints"]

OWN_CHECKPOINTS_CHECK = "resumed_from_own_checkpoints"
"""The name of the implicit check a run fails when it resumed from a checkpoint it did not
write (it appears only then, like a located error)."""

_KEPT = "faultlab deleted nothing"



def _culprit(exp: Experiment, paths: Iterable[str]) -> CheckpointArg | None:
    """The command's checkpoint argument whose path holds (or is) one of ``paths``."""
    wanted = [os.path.realpath(p) for p in paths]
    for arg in checkpoint_args(exp.target.command):
        if not arg.fixed:
            continue
        root = os.path.realpath(arg.resolved())
        if any(p == root or p.startswith(root.rstrip(os.sep) + os.sep) for p in wanted):
            return arg
    return None


def _where(exp: Experiment, source: Path | None, arg: CheckpointArg | None) -> str:
    """``file:line target.command[i]`` of the argument (``target.command`` without one)."""
    where = str(source) if source else exp.name
    line = command_line_of(source, arg.index if arg else None)
    where += f":{line}" if line is not None else ""
    return f"{where} target.command" + (f"[{arg.index}]" if arg else "")


def _fix(arg: CheckpointArg | None, roots: Sequence[str]) -> str:
    if arg is not None:
        return (f"{arg.shown()} is the same path for every run; give each run its own: "
                f"{arg.shown(arg.in_run_dir())}")
    return (f"no argument of target.command names {', '.join(roots)}: the trainer chose it "
            f"itself; pass the trainer's checkpoint-directory argument with {{run_dir}} in "
            f"it, e.g. --ckpt-dir {{run_dir}}/checkpoints")


def _loads(resumes: Sequence[ForeignResume]) -> str:
    shown = [f"{r.path} (step {r.step}, rank{'s' if len(r.ranks) > 1 else ''} "
             f"{', '.join(map(str, r.ranks))})" for r in resumes[:3]]
    more = f" and {len(resumes) - 3} more" if len(resumes) > 3 else ""
    return "; ".join(shown) + more


def _steps(paths: Sequence[str]) -> str:
    names = [Path(p).name for p in paths]
    return names[0] if len(names) == 1 else f"{names[0]} … {names[-1]}, {len(names)} in all"


def preexisting_checkpoints(exp: Experiment, source: Path | None) -> str | None:
    """Why the golden run must not start: a fixed checkpoint argument names a path that
    already holds files (None: nothing there)."""
    for arg in checkpoint_args(exp.target.command):
        if not arg.fixed:
            continue
        path = arg.resolved()
        try:
            held = path.is_file() or (path.is_dir() and any(path.iterdir()))
        except OSError:
            held = False
        if held:
            return (f"{_where(exp, source, arg)}: {path} already holds files, and every run "
                    f"of this experiment would resume from them and write into them (the "
                    f"golden run first). Nothing was run or injected; {_KEPT}. "
                    f"{_fix(arg, [str(path)])} (move {path} away yourself if you want this "
                    f"path).")
    return None


def golden_resumed_message(exp: Experiment, source: Path | None,
                           error: SharedCheckpoint) -> str:
    paths = [r.path for r in error.resumes]
    arg = _culprit(exp, paths)
    return (f"{_where(exp, source, arg)}: the golden run resumed from {_loads(error.resumes)}, "
            f"a checkpoint it did not write (in {', '.join(checkpoint_roots(paths))}): a "
            f"fault-free run that starts there is no reference, so it was not cached and "
            f"nothing was injected; {_KEPT}. {_fix(arg, checkpoint_roots(paths))}.")


def golden_outside_message(exp: Experiment, source: Path | None, golden_run_dir: str,
                           paths: Sequence[str]) -> str:
    arg = _culprit(exp, paths)
    roots = checkpoint_roots(paths)
    left = [p for p in paths if os.path.exists(p)]
    still = (f"they are still there ({_steps(left)}), and the faulted run would resume from "
             f"them" if left else "they are gone now, but the faulted run would save its own "
             "there, for the next run to resume from")
    return (f"{_where(exp, source, arg)}: the golden run saved its checkpoints to "
            f"{', '.join(roots)}, outside its run directory {golden_run_dir}: {still}. The "
            f"faulted run was not started and nothing was injected; {_KEPT}. "
            f"{_fix(arg, roots)}.")


def own_checkpoints_check(exp: Experiment, source: Path | None,
                          events: Sequence[Mapping[str, Any]],
                          run_dir: Path) -> SLAResult | None:
    """The failed ``resumed_from_own_checkpoints`` check when the run resumed from a checkpoint
    it did not write; None when it did not."""
    resumes = foreign_resumes(events, run_dir)
    if not resumes:
        return None
    paths = [r.path for r in resumes]
    arg = _culprit(exp, paths)
    note = (f"resumed from {_loads(resumes)}, a checkpoint this run did not write: it started "
            f"where an earlier run (the golden run or another) left off, so this verdict "
            f"proves nothing; {_where(exp, source, arg)}: {_fix(arg, checkpoint_roots(paths))}")
    return SLAResult(OWN_CHECKPOINTS_CHECK, True, False, False, note)



def before_golden(exp: Experiment, source: Path | None) -> list[str]:
    """The warnings for fixed checkpoint arguments (to show at the start of a run); raises
    ``SharedCheckpointStop`` when one names a path that already holds files."""
    if not exp.target.command:
        return []
    stop = preexisting_checkpoints(exp, source)
    if stop:
        raise SharedCheckpointStop(stop)
    return [str(w) for w in checkpoint_warnings(exp.target.command, source)]


def after_golden(exp: Experiment, source: Path | None, run_dir: str,
                 checkpoints_outside: Sequence[str]) -> None:
    """Raises ``SharedCheckpointStop`` when the golden run saved checkpoints outside its run
    directory, where the experiment would find them."""
    if checkpoints_outside:
        raise SharedCheckpointStop(golden_outside_message(exp, source, run_dir,
                                                          checkpoints_outside))
