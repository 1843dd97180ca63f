"""A PyTorch Lightning trainer, written the way its author would write it: no faultlab inside.

    torchrun --standalone --nproc-per-node 2 examples/lightning_ddp/train.py --epochs 4

A small MLP regressor learns a fixed random linear map from a deterministic synthetic dataset,
with Lightning's DDP strategy on CPU (gloo). Lightning's own ``ModelCheckpoint`` saves every
epoch (``epoch={e}-step={n}.ckpt`` and ``last.ckpt``) in ``--ckpt-dir``, and ``fit(...,
ckpt_path="last")`` resumes from the last one on start, as Lightning's docs recommend. The
checkpoints are at epoch ends because a plain ``DataLoader`` cannot resume mid-epoch. Under
torchrun the world is torchrun's: the number of nodes is read from its environment, so an
elastic job that lost a node starts again with the nodes it has.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import Callback, ModelCheckpoint
from pytorch_lightning.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SEED = 0


class Regressor(pl.LightningModule):
    def __init__(self, dim: int = 64, hidden: int = 256, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, hidden),
                                 nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


class PrintLoss(Callback):
    """``step {n} loss {x}`` on global rank 0 after every optimizer step."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.is_global_zero:
            print(f"step {trainer.global_step} loss {float(outputs['loss']):.4f}", flush=True)


def dataset(samples: int, dim: int) -> TensorDataset:
    g = torch.Generator().manual_seed(SEED)
    target_map = torch.randn(dim, dim, generator=g) / dim**0.5
    x = torch.randn(samples, dim, generator=g)
    return TensorDataset(x, x @ target_map + 0.01 * torch.randn(samples, dim, generator=g))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=128, help="per epoch, all ranks")
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--ckpt-dir", type=Path,
                        default=Path(os.environ.get("CKPT_DIR", "./checkpoints")))
    args = parser.parse_args()

    pl.seed_everything(SEED, workers=True)
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    num_nodes = int(os.environ.get("WORLD_SIZE", devices)) // devices
    trainer = pl.Trainer(
        accelerator="cpu", devices=devices, num_nodes=num_nodes,
        strategy=DDPStrategy(process_group_backend="gloo"),
        max_epochs=args.epochs, deterministic=True,
        callbacks=[ModelCheckpoint(dirpath=args.ckpt_dir, every_n_epochs=1, save_top_k=-1,
                                   save_last=True),
                   PrintLoss()],
        logger=False, enable_progress_bar=False, enable_model_summary=False)
    loader = DataLoader(dataset(args.samples, args.dim), batch_size=args.batch_size,
                        shuffle=True)
    trainer.fit(Regressor(dim=args.dim), loader, ckpt_path="last")


if __name__ == "__main__":
    main()
    # abort-at-exit fix: begin
    # torch 2.13's gloo can kill this process with SIGABRT at interpreter exit after a clean
    # finish ("terminate called without an active exception": pytorch/pytorch#190489, #117762;
    # faultlab's finding abort_at_exit). Leave without finalizing, the output flushed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
    # abort-at-exit fix: end
