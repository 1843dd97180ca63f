"""A plain DDP trainer with silent-failure monitors of its own, written the way its team would
write it: no faultlab inside.

    torchrun --standalone --nproc-per-node 3 examples/silent_ddp/train.py --steps 16 \
        --ckpt-every 4 --fingerprint-every 2 --straggler-threshold 0.75 --replay-every 4

An MLP of three ``nn.Linear`` learns a fixed random linear map from deterministic synthetic
batches, replicated with ``DistributedDataParallel`` on CPU (gloo) and trained with AdamW. Rank
0 saves ``torch.save`` checkpoints (model and optimizer) to ``--ckpt-dir/step_{N}.pt`` every
``--ckpt-every`` steps and at the end; on start every rank resumes from the newest one. Rank 0
prints ``step N loss L`` (the mean over the ranks) after every step. The monitors, each off
unless its flag is given (see monitors.py and README.md):

- ``--fingerprint-every P``: the replicas' parameter fingerprints compared every P steps;
- ``--spike-factor F``: a loss F times the first ``--spike-warmup`` steps' mean;
- ``--straggler-threshold T``: the per-rank compute-time score (over the median of the last
  ``--straggler-window`` steps) below T for ``--straggler-steps`` steps in a row;
- ``--replay-every P``: the step's local gradient computed twice on the same rank, compared.

``--reduce-noise E`` adds noise of relative size E to every all-reduced gradient, the same on
every replica but drawn from ``os.urandom`` per run: it stands in for a GPU all-reduce whose
reduction order changes from run to run, so two fault-free runs differ while the replicas stay
equal. World size 3 or more lets the fingerprint's majority name a rank.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from monitors import ComputeTimer, Fingerprint, SpikeRule, StragglerScore, replay_mismatch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

SEED = 0


def mlp(dim: int, hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden),
                         nn.Tanh(), nn.Linear(hidden, dim))


def batch(step: int, rank: int, batch_size: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's slice of step ``step``: the same numbers on every run."""
    target_map = torch.randn(dim, dim, generator=torch.Generator().manual_seed(SEED)) / dim**0.5
    g = torch.Generator().manual_seed(SEED + 1_000_003 * step + rank)
    x = torch.randn(batch_size, dim, generator=g)
    return x, x @ target_map + 0.01 * torch.randn(batch_size, dim, generator=g)


def newest_checkpoint(root: Path) -> tuple[int, Path] | None:
    found = [(int(m.group(1)), p) for p in root.glob("step_*.pt")
             if (m := re.fullmatch(r"step_(\d+)\.pt", p.name))]
    return max(found) if found else None


def shared_noise(size: float) -> ComputeTimer:
    """The compute timer, adding ``--reduce-noise`` to each all-reduced bucket: one seed from
    rank 0's ``os.urandom``, so every replica adds the same numbers."""
    if not size:
        return ComputeTimer()
    seed = torch.tensor([int.from_bytes(os.urandom(7), "little")])
    dist.broadcast(seed, src=0)
    g = torch.Generator().manual_seed(int(seed))

    def draw(bucket: torch.Tensor) -> Callable[[torch.Tensor], None]:
        z = torch.randn(bucket.shape, generator=g)
        return lambda reduced: reduced.add_(z * size * reduced.abs().mean())
    return ComputeTimer(draw)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--ckpt-every", type=int, default=4)
    parser.add_argument("--ckpt-dir", type=Path,
                        default=Path(os.environ.get("CKPT_DIR", "./checkpoints")))
    parser.add_argument("--dim", type=int, default=64, help="input and output width")
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--batch-size", type=int, default=128, help="per rank")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--reduce-noise", type=float, default=0.0)
    parser.add_argument("--fingerprint-every", type=int, default=0, metavar="P")
    parser.add_argument("--spike-factor", type=float, default=0.0, metavar="F")
    parser.add_argument("--spike-warmup", type=int, default=3)
    parser.add_argument("--straggler-threshold", type=float, default=0.0, metavar="T")
    parser.add_argument("--straggler-window", type=int, default=7,
                        help="steps whose median compute time is a rank's time")
    parser.add_argument("--straggler-steps", type=int, default=3,
                        help="steps in a row below the threshold before a rank is named")
    parser.add_argument("--replay-every", type=int, default=0, metavar="P")
    return parser.parse_args()


def say(*lines: str) -> None:
    for line in lines:
        print(line, flush=True)


def main() -> None:
    args = parse()
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)  # the ranks share the host's cores
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(SEED)
    net = mlp(args.dim, args.hidden)
    model = DDP(net)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    timer = shared_noise(args.reduce_noise)
    model.register_comm_hook(None, timer.hook)
    fingerprint = Fingerprint(args.fingerprint_every, net)
    spike = SpikeRule(args.spike_factor, args.spike_warmup) if args.spike_factor else None
    straggler = StragglerScore(args.straggler_threshold, args.straggler_window,
                               args.straggler_steps, world_size) \
        if args.straggler_threshold else None

    start = 0
    found = newest_checkpoint(args.ckpt_dir)
    if found is not None:
        start, path = found
        state = torch.load(path, weights_only=True)
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])
        if rank == 0:
            print(f"resumed from {path}", flush=True)

    for step in range(start + 1, args.steps + 1):
        x, y = batch(step, rank, args.batch_size, args.dim)
        if args.replay_every and step % args.replay_every == 0 and \
                replay_mismatch(net, F.mse_loss, x, y):
            say(f"replay mismatch on rank {rank} at step {step}")
        timer.start()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        compute_s = timer.compute_s()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mine = torch.tensor([loss.item(), compute_s], dtype=torch.float64)
        stats = [torch.empty_like(mine) for _ in range(world_size)]
        dist.all_gather(stats, mine)
        if rank == 0:
            mean_loss = sum(float(s[0]) for s in stats) / world_size
            say(f"step {step} loss {mean_loss!r}")
            if spike is not None:
                say(*spike.check(step, mean_loss))
            if straggler is not None:
                say(*straggler.check(step, [float(s[1]) for s in stats]))
        alarms = fingerprint.check(step)
        if rank == 0:
            say(*alarms)
        if rank == 0 and (step % args.ckpt_every == 0 or step == args.steps):
            args.ckpt_dir.mkdir(parents=True, exist_ok=True)
            torch.save({"model": net.state_dict(), "optim": optimizer.state_dict()},
                       args.ckpt_dir / f"step_{step}.pt")
    dist.destroy_process_group()


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
