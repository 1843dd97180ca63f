"""Helpers of the unit tests that need a process group: tiny FSDP2 models and an event recorder.

(A module of its own rather than conftest.py, which tests/integration also has: a test module
importing "conftest" could get the other one.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from reference_trainer.config import ModelConfig
from reference_trainer.train import build_sharded_model

#: A model small enough that saving and loading it takes milliseconds.
TINY_MODEL = ModelConfig(vocab_size=32, seq_len=8, d_model=16, num_layers=2, num_heads=2)


def build_fsdp(mesh: DeviceMesh, *, seed: int = 0,
               cfg: ModelConfig = TINY_MODEL) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The trainer's model recipe on one rank, with an AdamW optimizer."""
    model = build_sharded_model(cfg, seed=seed, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95),
                                  weight_decay=0.1)
    return model, optimizer


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, seed: int) -> None:
    """One optimizer step on a random batch (so that AdamW has state to save)."""
    cfg: ModelConfig = model.cfg  # type: ignore[assignment]
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=g)
    y = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=g)
    model(x, y).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def full_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter, unsharded and copied."""
    return {name: p.detach().full_tensor().clone() for name, p in model.named_parameters()}


class Recorder:
    """Stands in for ``EventLog.emit`` and ``Watchdog.beat``."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.beats = 0

    def emit(self, kind: str, **fields: Any) -> None:
        self.events.append({"kind": kind, **fields})

    def beat(self) -> None:
        self.beats += 1

    def of(self, kind: str, **match: Any) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"] == kind
                and all(e.get(k) == v for k, v in match.items())]


def save_checkpoints(mesh: DeviceMesh, root: Path, steps: tuple[int, ...] = (10, 20)) -> None:
    """Commit a real checkpoint at each of ``steps`` (a train step before each) under ``root``."""
    from reference_trainer.checkpoint import CheckpointManager

    model, optimizer = build_fsdp(mesh)
    mgr = CheckpointManager(root, keep=len(steps) + 1, async_save=False, rank=0, world_size=1,
                            process_group=dist.group.WORLD, emit=Recorder().emit,
                            beat=lambda: None)
    for step in steps:
        train_step(model, optimizer, seed=step)
        mgr.save(step, model, optimizer, {"step": step, "config": {"seed": 0, "preset": "tiny"},
                                          "sampler": {"consumed": 12 * step, "global_batch": 12}})
