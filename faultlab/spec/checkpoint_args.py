"""Checkpoint-like arguments of a user's command, and the warning for a fixed one.

A trainer run by faultlab is launched at least twice with the same command: the golden run,
then the experiment (and again on every later ``faultlab run``). Given a fixed checkpoint
directory (``--ckpt-dir ckpt``), every launch reads and writes the same checkpoints: the
experiment resumes from the golden run's final checkpoint and has nothing left to train, and a
team's own checkpoints are resumed from and written to. ``{run_dir}`` in the argument
(``--ckpt-dir {run_dir}/ckpt``) gives each launch its own.

Which arguments name a checkpoint location is a guess from the name, so a fixed one is a
*warning* (``faultlab validate``, and the start of ``faultlab run``); the proof — a checkpoint
saved outside the run directory, or loaded without having been saved in the run — comes from
the events (``faultlab.observe.checkpoint_origin``). Recognised forms: ``--name VALUE``,
``--name=VALUE`` and ``name=VALUE`` (Hydra overrides, ``+``/``++`` included, and
configurator-style ``--out_dir=...``), where the name, lower-cased with ``-`` and ``.`` read as
``_``, is

- anything with ``ckpt`` or ``checkpoint(s)`` that ends in ``dir``, ``dirpath``, ``path``,
  ``folder``, ``root`` or the word itself: ``--ckpt-dir``, ``--checkpoint_dir``,
  ``--checkpoint.folder`` (torchtitan), ``ckpt_path=`` (Lightning), ``--resume-from-checkpoint``;
- or ends in ``save_dir``, ``save_path``, ``save_folder``, ``output_dir``, ``out_dir``,
  ``dirpath`` (Lightning's ``ModelCheckpoint``), ``default_root_dir`` (Lightning's Trainer,
  which checkpoints under it), or is ``save`` (Megatron's ``--save``), ``resume``,
  ``resume_from``, ``resume_path`` or ``resume_dir`` (``--resume PATH``, as in PyTorch's
  ImageNet example).

Values that are not paths are left alone: numbers, ``true``/``false``/``none``, Lightning's
``ckpt_path`` keywords (``last``, ``best``, ``hpc``, ``registry``) and a flag followed by
another flag (``--save --steps 9``: a switch).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from faultlab.errors import Problem

__all__ = ["RUN_DIR", "CheckpointArg", "checkpoint_args", "checkpoint_dir_of",
           "checkpoint_warnings", "command_line_of", "is_checkpoint_name", "steps_of_command"]

RUN_DIR = "{run_dir}"
"""The placeholder for each launch's own run directory (``faultlab.targets.local``)."""

_CKPT_NAME = re.compile(r"(?:^|_)(?:ckpt|checkpoints?)(?:_[a-z0-9_]*)?"
                        r"(?:dir|dirpath|dir_path|path|folder|root)?$")
_CKPT_WORD_END = re.compile(r"(?:ckpt|checkpoints?|dir|dirpath|dir_path|path|folder|root)$")
_OUTPUT_NAME = re.compile(r"(?:^|_)(?:save_dir|save_path|save_folder|output_dir|out_dir|"
                          r"dirpath|default_root_dir)$")
_EXACT_NAMES = {"save", "resume", "resume_from", "resume_path", "resume_dir"}
_NOT_A_PATH = {"true", "false", "none", "null", "yes", "no", "last", "best", "hpc",
               "registry", ""}


def is_checkpoint_name(name: str) -> bool:
    """Whether an argument's name (``--ckpt-dir``, ``trainer.default_root_dir``, ``dirpath``)
    names a checkpoint location (see the module docstring)."""
    norm = re.sub(r"[-.]", "_", name.lstrip("-+").lower())
    if norm in _EXACT_NAMES:
        return True
    if ("ckpt" in norm or "checkpoint" in norm) and _CKPT_WORD_END.search(norm) \
            and _CKPT_NAME.search(norm):
        return True
    return bool(_OUTPUT_NAME.search(norm))


def _is_path_value(value: str) -> bool:
    if value.lower() in _NOT_A_PATH or value.startswith("-"):
        return False
    try:
        float(value)
    except ValueError:
        return True
    return False


@dataclass(frozen=True, slots=True)
class CheckpointArg:
    """One checkpoint-like argument of a command."""

    index: int
    """Index in the command of the argument that holds the value."""
    name: str
    """The name as written: ``--ckpt-dir``, ``ckpt_path``, ``+trainer.default_root_dir``."""
    value: str
    """The value as written (``{run_dir}`` not replaced)."""
    joined: bool
    """``name=value`` in one argument (else the value is the next argument)."""

    @property
    def fixed(self) -> bool:
        """The same path for every launch (no ``{run_dir}`` in it)."""
        return RUN_DIR not in self.value

    def shown(self, value: str | None = None) -> str:
        """The argument as a user writes it, with ``value`` instead of its own."""
        value = self.value if value is None else value
        return f"{self.name}={value}" if self.joined else f"{self.name} {value}"

    def in_run_dir(self) -> str:
        """The value moved into each launch's run directory: ``ckpt`` →
        ``{run_dir}/ckpt``, ``/data/ckpts/run1`` → ``{run_dir}/run1``."""
        base = Path(self.value.rstrip("/")).name
        return f"{RUN_DIR}/{base if base not in ('', '.', '..') else 'checkpoints'}"

    def with_value(self, value: str) -> str:
        """The argument at ``index`` with ``value`` instead of its own."""
        return f"{self.name}={value}" if self.joined else value

    def resolved(self, cwd: Path | None = None) -> Path:
        """Where a fixed value points (relative to ``cwd``: where faultlab and the ranks
        run)."""
        return Path(os.path.abspath(Path(cwd or Path.cwd()) / self.value))


def checkpoint_args(command: tuple[str, ...] | list[str] | None) -> list[CheckpointArg]:
    """Every checkpoint-like argument of ``command`` (the module docstring says which)."""
    out: list[CheckpointArg] = []
    args = list(command or ())
    for i, arg in enumerate(args):
        if i == 0:
            continue  # the program
        name, eq, value = arg.partition("=")
        if eq and not name.startswith("/") and is_checkpoint_name(name) and \
                _is_path_value(value):
            out.append(CheckpointArg(i, name, value, True))
        elif not eq and arg.startswith("--") and is_checkpoint_name(arg) and \
                i + 1 < len(args) and _is_path_value(args[i + 1]):
            out.append(CheckpointArg(i + 1, arg, args[i + 1], False))
    return out


_STEPS_NAMES = {"steps", "max_steps", "num_steps", "total_steps", "train_steps",
                "training_steps", "max_iters", "iters", "num_iterations", "train_iters"}
"""Names of a step-count argument (lower-cased, ``-`` read as ``_``, after the last ``.`` of
a dotted name: ``--training.steps``, ``trainer.max_steps=``): nanoGPT's
``max_iters``, Megatron's ``train_iters``, Lightning's ``max_steps``, torchtitan's
``training.steps``."""


def steps_of_command(command: tuple[str, ...] | list[str] | None) -> int | None:
    """The step count a user's command names (``--steps 30``, ``--max-steps=30``,
    ``trainer.max_steps=30``), the last one given; None when it names none."""
    found = None
    args = list(command or ())
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if not eq:
            if not arg.startswith("--") or i + 1 >= len(args):
                continue
            name, value = arg, args[i + 1]
        dotted = name.lstrip("-+").lower().replace("-", "_")
        if dotted.rsplit(".", 1)[-1] in _STEPS_NAMES and value.isdigit() and int(value) > 0:
            found = int(value)
    return found


def command_line_of(file: Path | None, index: int | None) -> int | None:
    """The line of ``target.command[index]`` (or of ``target.command``) in ``file``."""
    if file is None:
        return None
    from faultlab.spec._yaml import read_yaml

    try:
        doc = read_yaml(file.read_text(), file)
    except (OSError, UnicodeDecodeError):
        return None
    key: tuple[str | int, ...] = ("target", "command") + (() if index is None else (index,))
    return doc.line_of(key) if doc.lines else None


def fixed_arg_message(arg: CheckpointArg) -> str:
    """What is wrong with a fixed checkpoint argument, and the fix."""
    return (f"{arg.shown()!s} is a fixed checkpoint path: the golden run and every run of this "
            f"experiment would read and write the same checkpoints there (a run resumes from "
            f"the last one's and has nothing left to train; a team's own checkpoints would be "
            f"resumed from and overwritten); give each run its own: {arg.shown(arg.in_run_dir())}")


def checkpoint_warnings(command: tuple[str, ...] | list[str] | None,
                        file: Path | None) -> list[Problem]:
    """One located warning per fixed checkpoint-like argument of ``command`` (``file`` is
    the experiment it came from, for the line)."""
    return [Problem(file, command_line_of(file, a.index), f"target.command[{a.index}]",
                    fixed_arg_message(a))
            for a in checkpoint_args(command) if a.fixed]


def checkpoint_dir_of(command: tuple[str, ...] | list[str] | None,
                      checkpoint_dir: str | None) -> tuple[str | None, str | None]:
    """Where a user's trainer checkpoints, as a ``{run_dir}`` template, or why faultlab cannot
    know: ``(template, None)`` or ``(None, reason with the fix)``.

    ``target.checkpoint_dir`` when given; else the first checkpoint-like argument of
    ``command`` (a fixed one is refused: every run shares it, and faultlab never acts on a
    team's own checkpoints); else unknown. An argument naming a file (``--save-path
    {run_dir}/model.pt``) stands for its directory: the caller resolves that once the path
    exists."""
    if checkpoint_dir is not None:
        return checkpoint_dir, None
    for arg in checkpoint_args(command):
        if arg.fixed:
            return None, (f"{arg.shown()} is a fixed checkpoint path shared by every run, and "
                          f"faultlab never acts on a team's own checkpoints; write "
                          f"{arg.shown(arg.in_run_dir())} so each run's checkpoints are its "
                          f"own")
        return arg.value, None
    args = list(command or ())
    under = [i for i in range(1, len(args)) if RUN_DIR in args[i]]
    shown = [f"{args[i - 1]} {args[i]}" if args[i - 1].startswith("-") else args[i]
             for i in under]
    seen = (f" (the command's own {RUN_DIR} argument{'s' if len(under) > 1 else ''}: "
            f"{', '.join(shown[:3])})") if under else ""
    example = next((args[i].partition("=")[2] if "=" in args[i].split(RUN_DIR)[0]
                    else args[i] for i in under), f"{RUN_DIR}/checkpoints")
    return None, (f"faultlab cannot tell which directory the trainer checkpoints to: no "
                  f"argument of target.command names one by a name it knows (--ckpt-dir, "
                  f"--checkpoint-dir, --save-dir, --output-dir, dirpath= ...){seen}; name it: "
                  f"target.checkpoint_dir: {example!r}, and pass the same path to the trainer")
