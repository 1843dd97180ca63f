"""Configuration of the reference trainer: model presets, the training config and its flags.

Every field is validated in ``__post_init__``; the command line maps each ``ValueError`` back to
the flag that set the field, so a bad value gives one line naming the flag and the value.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "PRESETS",
    "ConfigError",
    "ModelConfig",
    "TrainConfig",
    "add_train_args",
    "config_from_args",
    "train_argv",
]


class ConfigError(ValueError):
    """A configuration value is invalid; ``flag`` names the command-line flag that set it."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")
        self.flag = flag


@dataclass(kw_only=True, slots=True, frozen=True)
class ModelConfig:
    """Shape of the GPT-style decoder."""

    vocab_size: int
    """Number of token ids; the synthetic data source draws from the same range."""
    seq_len: int
    """Tokens per training sample (the context length)."""
    d_model: int
    """Width of the residual stream."""
    num_layers: int
    """Number of transformer blocks; each block is one FSDP2 unit."""
    num_heads: int
    """Attention heads; must divide ``d_model``."""
    dropout: float = 0.0
    """Dropout probability. Non-zero makes resume equivalence depend on restored RNG state."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "d_model", "num_layers", "num_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.d_model % self.num_heads:
            raise ValueError(
                f"num_heads={self.num_heads!r} must divide d_model={self.d_model!r}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")

    def num_params(self) -> int:
        d, v, s, n = self.d_model, self.vocab_size, self.seq_len, self.num_layers
        per_block = 12 * d * d + 13 * d  # qkv + proj + 4x MLP, with biases and two LayerNorms
        return v * d + s * d + n * per_block + 2 * d + d * v + v


PRESETS: dict[str, ModelConfig] = {
    # ~0.54 M parameters, 2 blocks: tests and CI (a step costs about 0.23 CPU-s for 2 ranks,
    # 0.55 with the 6 blocks it had; most of a CI run was these steps).
    "tiny": ModelConfig(vocab_size=512, seq_len=64, d_model=128, num_layers=2, num_heads=4,
                        dropout=0.1),
    # ~29 M parameters: CPU benchmarks.
    "small": ModelConfig(vocab_size=4096, seq_len=128, d_model=512, num_layers=8, num_heads=8,
                         dropout=0.1),
    # ~0.4 B and ~1.4 B parameters: GPU machines.
    "medium": ModelConfig(vocab_size=32768, seq_len=1024, d_model=1024, num_layers=24,
                          num_heads=16, dropout=0.0),
    "large": ModelConfig(vocab_size=32768, seq_len=2048, d_model=2048, num_layers=24,
                         num_heads=16, dropout=0.0),
}

NONFINITE_POLICIES = ("rollback", "skip", "abort")
NO_VALID_CHECKPOINT_POLICIES = ("fail", "scratch")
DEVICES = ("auto", "cpu", "cuda")
PREEMPTION_PROVIDERS = ("auto", "none", "aws", "gce", "azure", "slurm")


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    """Everything one training run needs; the same on every rank."""

    run_dir: Path
    """Root of the run: events go to ``run_dir/events``, checkpoints to ``run_dir/checkpoints``."""
    preset: str = "tiny"
    """Model preset, one of ``PRESETS``."""
    steps: int = 100
    """Schedule horizon: the LR schedule and the end of training are defined by it."""
    stop_after: int | None = None
    """Stop cleanly (with a checkpoint) after this step, so a later launch resumes."""
    global_batch: int = 12
    """Samples per step across all ranks; fixed whatever the world size."""
    lr: float = 3e-3
    """Peak learning rate of AdamW."""
    min_lr_ratio: float = 0.1
    """The cosine schedule decays to ``lr * min_lr_ratio``."""
    warmup_steps: int = 5
    """Linear warm-up steps before the cosine decay."""
    weight_decay: float = 0.1
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 disables clipping, not the check)."""
    seed: int = 0
    """Seed of the model init, the data source and every rank's RNG."""
    checkpoint_every: int = 10
    """Save a checkpoint after every N steps."""
    keep_checkpoints: int = 3
    """Keep the newest K committed checkpoints; older ones are deleted after a commit."""
    async_checkpoint: bool = False
    """Save with DCP ``async_save``: training goes on while a background thread writes."""
    on_no_valid_checkpoint: str = "fail"
    """When checkpoints exist but none is valid: ``fail`` (never guess) or ``scratch``."""
    nonfinite_policy: str = "rollback"
    """Reaction to a non-finite loss or gradient norm: rollback, skip or abort."""
    max_rollbacks: int = 3
    """Rollbacks allowed in one process before a non-finite step aborts instead."""
    watchdog_s: float = 120.0
    """Exit (after dumping every thread's stack) when no progress is made for this long, once
    the process group is up (before it, a rank waits for its peers: ``pg_timeout_s``)."""
    checkpoint_timeout_s: float = 0.0
    """A save (sync or async) still unfinished after this long is hung: the watchdog reports
    it and exits. 0: ``watchdog_s``. An async save hangs in a background thread while steps
    go on, so the no-progress watchdog alone would only notice at the next save."""
    pg_timeout_s: float = 300.0
    """Process-group timeout: how long a collective may block before it raises."""
    deterministic: bool = True
    """Turn on every determinism switch (bitwise reproducible runs at a fixed world size)."""
    device: str = "auto"
    """``auto`` picks CUDA + NCCL + bf16 when a GPU is present, else CPU + gloo."""
    min_step_time_s: float = 0.0
    """Pad each step to at least this long (stands in for a bigger model's step time)."""
    preemption_provider: str = "auto"
    """Watch this cloud's metadata for a spot/preemption notice: auto (whichever endpoint
    variable is set; in a Slurm job without one, Slurm's signals; none otherwise), none, aws,
    gce, azure, or slurm: SIGTERM/SIGUSR1 are the notice (reference_trainer/preemption.py)."""
    preemption_poll_s: float = 0.5
    """Seconds between two polls of the metadata endpoint (at most 1)."""
    straggler_threshold_s: float = 0.05
    """Name a straggler when every other rank waited this much longer for it in a step's
    collective..."""
    straggler_steps: int = 3
    """...this many steps in a row (health.StragglerDetector)."""
    link_probe_slowdown: float = 3.0
    """When steps run this many times slower than usual for ``straggler_steps`` steps and no
    rank is named by its waits, time point-to-point transfers between the ranks to name a
    slow link's rank (health.probe_links); 0 turns the probe off."""
    link_probe_bytes: int = 1 << 20
    """Bytes each rank sends in one probe transfer."""
    compute_straggler_ratio: float = 1.5
    """Name a rank a compute straggler (a slow GPU) when its forward pass (the median of its
    last 5 steps) takes this many times as long as every other rank's, and at least
    ``straggler_threshold_s`` longer, for ``straggler_steps`` steps in a row
    (health.ComputeStragglerDetector); 0 turns it off."""
    replicate: int = 1
    """Replicas of the model (HSDP): the ranks form a (replicate, shard) mesh, each replica fully
    sharded over ``world_size / replicate`` ranks; 1 (default) is plain FSDP2, no replicas.
    Replicas let the cross-replica fingerprint compare (monitors.ReplicaFingerprint): 3 or more
    name the odd rank out, 2 only detect."""
    spike_factor: float = 10.0
    """Report a loss (global or a rank's own) or gradient norm over this many times the median
    of the last 10 steps (monitors.SpikeCheck); 0 turns the check off."""
    inject_nonfinite: tuple[tuple[int, int | None], ...] = field(default=())
    """Test hook: make the loss NaN at (step, rank) once per process; rank None = every rank."""

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        if self.preset not in PRESETS:
            raise ConfigError("--preset", f"unknown preset {self.preset!r}; choose from "
                                          f"{', '.join(PRESETS)}")
        _at_least("--steps", self.steps, 1)
        if self.stop_after is not None and not 1 <= self.stop_after <= self.steps:
            raise ConfigError("--stop-after", f"{self.stop_after!r} must be between 1 and "
                                              f"--steps ({self.steps})")
        _at_least("--global-batch", self.global_batch, 1)
        _positive("--lr", self.lr)
        if not 0 <= self.seed < 2**63:
            raise ConfigError("--seed", f"{self.seed!r} must be between 0 and 2**63 - 1")
        if not 0.0 <= self.min_lr_ratio <= 1.0:  # false for NaN too
            raise ConfigError("--min-lr-ratio", f"{self.min_lr_ratio!r} must be in [0, 1]")
        _at_least("--warmup-steps", self.warmup_steps, 0)
        _at_least("--weight-decay", self.weight_decay, 0.0)
        _at_least("--grad-clip", self.grad_clip, 0.0)
        _at_least("--checkpoint-every", self.checkpoint_every, 1)
        _at_least("--keep-checkpoints", self.keep_checkpoints, 1)
        _choice("--on-no-valid-checkpoint", self.on_no_valid_checkpoint,
                NO_VALID_CHECKPOINT_POLICIES)
        _choice("--nonfinite-policy", self.nonfinite_policy, NONFINITE_POLICIES)
        _at_least("--max-rollbacks", self.max_rollbacks, 0)
        _positive("--watchdog-s", self.watchdog_s)
        _at_least("--checkpoint-timeout-s", self.checkpoint_timeout_s, 0.0)
        _positive("--pg-timeout-s", self.pg_timeout_s)
        _choice("--device", self.device, DEVICES)
        _at_least("--min-step-time-s", self.min_step_time_s, 0.0)
        _choice("--preemption-provider", self.preemption_provider, PREEMPTION_PROVIDERS)
        if not (math.isfinite(self.preemption_poll_s) and 0.01 <= self.preemption_poll_s <= 1.0):
            raise ConfigError("--preemption-poll-s", f"{self.preemption_poll_s!r} must be between "
                                                     f"0.01 and 1 (a notice may be 30 s long)")
        _positive("--straggler-threshold-s", self.straggler_threshold_s)
        _at_least("--straggler-steps", self.straggler_steps, 1)
        if self.link_probe_slowdown != 0 and self.link_probe_slowdown <= 1:
            raise ConfigError("--link-probe-slowdown", f"{self.link_probe_slowdown!r} must be 0 "
                                                       f"(off) or > 1 (a slowdown factor)")
        _at_least("--link-probe-bytes", self.link_probe_bytes, 4)
        if self.compute_straggler_ratio != 0 and self.compute_straggler_ratio <= 1:
            raise ConfigError("--compute-straggler-ratio", f"{self.compute_straggler_ratio!r} "
                                                           f"must be 0 (off) or > 1 (a ratio)")
        _at_least("--replicate", self.replicate, 1)
        if self.spike_factor != 0 and not self.spike_factor > 1:  # NaN fails too
            raise ConfigError("--spike-factor", f"{self.spike_factor!r} must be 0 (off) or > 1 "
                                                f"(a factor over the recent median)")
        for step, _rank in self.inject_nonfinite:
            if not 1 <= step <= self.steps:
                raise ConfigError("--inject-nonfinite", f"step {step!r} is outside 1..{self.steps}")

    @property
    def model(self) -> ModelConfig:
        return PRESETS[self.preset]

    def to_json(self) -> dict[str, object]:
        out = dataclasses.asdict(self)
        out["run_dir"] = str(self.run_dir)
        out["inject_nonfinite"] = [list(x) for x in self.inject_nonfinite]
        return out


def _at_least(flag: str, value: float, low: float) -> None:
    # `not (value >= low)` also rejects NaN, which compares false with everything.
    if not (math.isfinite(value) and value >= low):
        raise ConfigError(flag, f"{value!r} must be a finite number >= {low}")


def _positive(flag: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(flag, f"{value!r} must be a finite number > 0")


def _choice(flag: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(flag, f"{value!r} is not one of {', '.join(choices)}")


def _parse_injection(text: str) -> tuple[int, int | None]:
    """``STEP`` or ``STEP:RANK``."""
    step_s, _, rank_s = text.partition(":")
    try:
        return int(step_s), (int(rank_s) if rank_s else None)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid value {text!r}: expected STEP or STEP:RANK, e.g. 12 or 12:1"
        ) from None


def _bool(text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected true or false")


# (flag, field, type, help) — one table drives the parser, the mapping back to flags and the
# argv that the launcher forwards to every rank.
_FLAGS: list[tuple[str, str, Callable[[str], Any], str]] = [
    ("--preset", "preset", str, f"model preset: {', '.join(PRESETS)}"),
    ("--steps", "steps", int, "schedule horizon (total steps)"),
    ("--stop-after", "stop_after", int, "stop cleanly after this step (resume later)"),
    ("--global-batch", "global_batch", int, "samples per step across all ranks"),
    ("--lr", "lr", float, "peak learning rate"),
    ("--min-lr-ratio", "min_lr_ratio", float, "final LR as a fraction of --lr"),
    ("--warmup-steps", "warmup_steps", int, "linear warm-up steps"),
    ("--weight-decay", "weight_decay", float, "AdamW weight decay"),
    ("--grad-clip", "grad_clip", float, "global gradient-norm clip (0: off)"),
    ("--seed", "seed", int, "seed of init, data and RNG"),
    ("--checkpoint-every", "checkpoint_every", int, "checkpoint every N steps"),
    ("--keep-checkpoints", "keep_checkpoints", int, "keep the newest K checkpoints"),
    ("--async-checkpoint", "async_checkpoint", _bool, "save with DCP async_save (true/false)"),
    ("--on-no-valid-checkpoint", "on_no_valid_checkpoint", str,
     "when every checkpoint is invalid: fail or scratch"),
    ("--nonfinite-policy", "nonfinite_policy", str, "rollback, skip or abort"),
    ("--max-rollbacks", "max_rollbacks", int, "rollbacks allowed per process"),
    ("--watchdog-s", "watchdog_s", float, "exit if no step completes for this long"),
    ("--checkpoint-timeout-s", "checkpoint_timeout_s", float,
     "a save unfinished after this long is hung: report and exit (0: --watchdog-s)"),
    ("--pg-timeout-s", "pg_timeout_s", float, "process-group (collective) timeout"),
    ("--deterministic", "deterministic", _bool, "turn on every determinism switch (true/false)"),
    ("--device", "device", str, "auto, cpu or cuda"),
    ("--min-step-time-s", "min_step_time_s", float, "pad every step to at least this long"),
    ("--preemption-provider", "preemption_provider", str,
     "watch for spot notices: auto, none, aws, gce or azure"),
    ("--preemption-poll-s", "preemption_poll_s", float, "seconds between metadata polls (<= 1)"),
    ("--straggler-threshold-s", "straggler_threshold_s", float,
     "a rank all others wait this much longer for is a straggler candidate"),
    ("--straggler-steps", "straggler_steps", int, "consecutive steps before it is named"),
    ("--link-probe-slowdown", "link_probe_slowdown", float,
     "probe the links when steps run this many times slower (0: off)"),
    ("--link-probe-bytes", "link_probe_bytes", int, "bytes per probe transfer"),
    ("--compute-straggler-ratio", "compute_straggler_ratio", float,
     "a rank whose forward takes this many times every other's is a slow GPU (0: off)"),
    ("--replicate", "replicate", int,
     "HSDP replicas (world size / N ranks shard each); the fingerprint compares them"),
    ("--spike-factor", "spike_factor", float,
     "report a loss or grad norm this many times its recent median (0: off)"),
]


def add_train_args(parser: argparse.ArgumentParser) -> None:
    """Add every trainer flag to ``parser`` (the launcher and the trainer share them)."""
    group = parser.add_argument_group("training")
    for flag, name, typ, help_ in _FLAGS:
        group.add_argument(flag, dest=name, type=typ, default=None, help=help_)
    group.add_argument("--inject-nonfinite", dest="inject_nonfinite", action="append",
                       type=_parse_injection, default=None, metavar="STEP[:RANK]",
                       help="test hook: NaN loss at STEP on RANK (every rank if omitted), "
                            "once per process; repeatable")


def config_from_args(args: argparse.Namespace, run_dir: Path) -> TrainConfig:
    """Build a validated ``TrainConfig``; raises ``ConfigError`` naming the flag."""
    kwargs: dict[str, object] = {"run_dir": run_dir}
    for _flag, name, _typ, _help in _FLAGS:
        value = getattr(args, name, None)
        if value is not None:
            kwargs[name] = value
    if getattr(args, "inject_nonfinite", None):
        kwargs["inject_nonfinite"] = tuple(args.inject_nonfinite)
    return TrainConfig(**kwargs)  # type: ignore[arg-type]


def train_argv(cfg: TrainConfig) -> list[str]:
    """The trainer flags that reproduce ``cfg`` (what the launcher passes to every rank)."""
    out = ["--run-dir", str(cfg.run_dir)]
    defaults = TrainConfig(run_dir=cfg.run_dir)
    for flag, name, _typ, _help in _FLAGS:
        value = getattr(cfg, name)
        if value is not None and value != getattr(defaults, name):
            out += [flag, str(value).lower() if isinstance(value, bool) else str(value)]
    for step, rank in cfg.inject_nonfinite:
        out += ["--inject-nonfinite", f"{step}" if rank is None else f"{step}:{rank}"]
    return out
