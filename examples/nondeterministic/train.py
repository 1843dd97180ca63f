"""The fsdp2_dcp trainer with an LR schedule, made nondeterministic on purpose: no faultlab inside.

    torchrun --standalone --nproc-per-node 2 examples/nondeterministic/train.py --steps 16 \
        --update-noise 1e-6

It stands in for a GPU trainer that is not bitwise reproducible (atomics in backward kernels,
cuBLAS workspaces, NCCL's algorithm choice): ``--update-noise E`` adds, after every optimizer
step, a perturbation of relative size ``E`` drawn from ``os.urandom`` to each rank's shard of the
weights, so no two runs end with the same bits, and their losses drift apart slowly.
``--resume-scheduler forget`` is a real resume bug (pytorch/torchtitan#4598's kind): the
weights and the optimizer come back from the checkpoint, the learning-rate schedule starts over.

The model and data are examples/fsdp2_dcp's (imported from it): a small residual MLP learns a
fixed random linear map from deterministic synthetic batches. The model is sharded with
``fully_shard`` (each block, then the root), trained with AdamW, and
checkpointed with ``torch.distributed.checkpoint`` to ``--ckpt-dir/step_{N}`` every
``--ckpt-every`` steps and at the end. On start it resumes from the newest complete checkpoint.
The learning rate decays linearly to a tenth over ``--steps``. CPU and gloo.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

# The model, the data and the checkpoint lookup are examples/fsdp2_dcp's, unchanged.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fsdp2_dcp"))
from train import SEED, Net, batch, newest_checkpoint  # noqa: E402


def perturb(model: nn.Module, size: float) -> None:
    """Add noise of relative size ``size``, seeded from ``os.urandom``, to this rank's shards."""
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
    with torch.no_grad():
        for p in model.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            local.add_(torch.randn(local.shape, generator=g) * size * local.abs().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--ckpt-every", type=int, default=5)
    parser.add_argument("--ckpt-dir", type=Path,
                        default=Path(os.environ.get("CKPT_DIR", "./checkpoints")))
    parser.add_argument("--dim", type=int, default=64, help="model width")
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--update-noise", type=float, default=0.0,
                        help="relative size of the random perturbation of every update")
    parser.add_argument("--resume-scheduler", choices=("restore", "forget"), default="restore",
                        help="on resume, bring the LR schedule back to the step (or forget it)")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(SEED)
    model = Net(args.dim, args.blocks)
    mesh = init_device_mesh("cpu", (world_size,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: 1.0 - 0.9 * min(s, args.steps) / args.steps)

    start = 0
    found = newest_checkpoint(args.ckpt_dir)
    if found is not None:
        start, path = found
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        if args.resume_scheduler == "restore":  # the schedule is a function of the step
            for _ in range(start):
                scheduler.step()
        if rank == 0:
            print(f"resumed from {path}", flush=True)

    def save(step: int) -> None:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd},
                 checkpoint_id=args.ckpt_dir / f"step_{step}")

    for step in range(start + 1, args.steps + 1):
        x, y = batch(step, rank, args.batch_size, args.dim)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if args.update_noise:
            perturb(model, args.update_noise)
        if rank == 0:
            print(f"step {step} loss {loss.item()!r}", flush=True)
        if step % args.ckpt_every == 0 or step == args.steps:
            save(step)
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
