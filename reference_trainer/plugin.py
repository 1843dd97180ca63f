"""The reference trainer as faultlab sees it: ``target.trainer: reference``.

Registered in pyproject.toml under the entry-point group ``faultlab.trainers`` (the contract is
in ``faultlab/spec/trainers.py``); faultlab loads ``TRAINER`` from there and imports nothing else
of this package. A trainer of your own registers the same way, or is simply given to faultlab
as ``target.command``.

It also is the way to run this trainer under faultlab's launcher by hand::

    faultlab launch --nodes 3 --min-nodes 2 --run-dir runs/demo -- \\
        python -m reference_trainer.train --preset tiny --steps 40 --checkpoint-every 10
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faultlab.runtime.manifest import list_checkpoints, verify_checkpoint
from reference_trainer.config import PRESETS, TrainConfig, train_argv

__all__ = ["TRAINER", "PreflightError", "command", "preflight"]


class PreflightError(ValueError):
    """The run directory or the config would make every rank fail the same way at start."""


def command(cfg: TrainConfig) -> list[str]:
    """One rank's command line for ``cfg``."""
    return [sys.executable, "-m", "reference_trainer.train", *train_argv(cfg)]


def preflight(cfg: TrainConfig, world_size: int = 1) -> None:
    """Refuse to launch what could only crash-loop: a run directory the trainer cannot use, a
    global batch that leaves some rank without samples, or replicas that do not divide the
    ranks."""
    if world_size % cfg.replicate:
        raise PreflightError(
            f"--replicate: {cfg.replicate!r} does not divide the world size ({world_size}): "
            f"use a divisor of it, or 1 (no replicas)")
    if cfg.global_batch < world_size:
        raise PreflightError(
            f"--global-batch: {cfg.global_batch!r} is smaller than the world size "
            f"({world_size}): some rank would get no samples")
    ckpt = cfg.run_dir / "checkpoints"
    for path in (cfg.run_dir, ckpt, cfg.run_dir / "events"):
        if path.exists() and not path.is_dir():
            raise PreflightError(f"--run-dir: {str(path)!r} exists and is not a directory")
    try:
        for sub in ("events", "checkpoints", "logs"):
            (cfg.run_dir / sub).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PreflightError(f"--run-dir: cannot create {str(cfg.run_dir)!r}: "
                             f"{e.strerror}") from None
    if not os.access(ckpt, os.R_OK | os.W_OK | os.X_OK):
        raise PreflightError(f"--run-dir: checkpoint directory {str(ckpt)!r} is not readable "
                             f"and writable by this user")
    try:
        candidates = list_checkpoints(ckpt)
    except OSError as e:
        raise PreflightError(f"--run-dir: cannot list {str(ckpt)!r}: {e.strerror}") from None
    if candidates and cfg.on_no_valid_checkpoint == "fail":
        # The same full check the ranks make (newest first, stop at the first valid one): if
        # it fails here, every restart of every rank would fail the same way.
        reasons = []
        for _step, path in candidates:
            reason = verify_checkpoint(path)
            if reason is None:
                return
            reasons.append(reason)
        raise PreflightError(
            f"--run-dir: no usable checkpoint in {str(ckpt)!r} ({'; '.join(reasons)}); pass "
            f"--on-no-valid-checkpoint scratch to start over, or use a new --run-dir")


@dataclass(frozen=True)
class _ReferenceTrainer:
    name: str = "reference"
    presets: tuple[str, ...] = tuple(PRESETS)
    config_class: type = TrainConfig
    numerics_neutral: frozenset[str] = frozenset({
        # Settings that change how a run is operated, never one bit of what it computes (the
        # trainer's tests check async saving and the watchdog against the same golden digest).
        "async_checkpoint", "keep_checkpoints", "watchdog_s", "checkpoint_timeout_s",
        "pg_timeout_s",
        "min_step_time_s", "preemption_provider", "preemption_poll_s",
        "straggler_threshold_s", "straggler_steps", "spike_factor"})
    monitor_settings: frozenset[str] = frozenset({
        # Of those, the ones that decide what a fault-free run's monitors report: in the key
        # of a golden run whose alarms a verdict counts (faultlab.engine.golden.golden_key).
        "watchdog_s", "checkpoint_timeout_s", "straggler_threshold_s", "straggler_steps",
        "spike_factor"})

    def make_config(self, run_dir: Path, **settings: Any) -> TrainConfig:
        return TrainConfig(run_dir=run_dir, **settings)

    def command(self, config: TrainConfig) -> list[str]:
        return command(config)

    def preflight(self, config: TrainConfig, world_size: int) -> None:
        preflight(config, world_size)

    def source_files(self) -> list[Path]:
        return sorted(Path(__file__).parent.glob("*.py"))


TRAINER = _ReferenceTrainer()
"""The object faultlab's trainer registry loads (``faultlab.trainers`` entry point)."""
