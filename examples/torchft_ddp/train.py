"""A torchft DDP trainer, written the way torchft's own ``train_ddp.py`` is: no faultlab inside.

    torchft_lighthouse --min_replicas 1 --quorum_tick_ms 100 --join_timeout_ms 10000 &
    REPLICA_GROUP_ID=0 NUM_REPLICA_GROUPS=2 TORCHFT_LIGHTHOUSE=http://localhost:29510 \\
        torchrun --nnodes 1 --nproc-per-node 1 --master-port 29600 \\
        examples/torchft_ddp/train.py --steps 30
    # and the same with REPLICA_GROUP_ID=1 and --master-port 29601 in a second shell

Each replica group is a torchrun world of its own; torchft's ``Manager`` joins the groups
through the lighthouse, step by step: a group that dies is left out of the next quorum while
the others go on, and a group that (re)joins heals by fetching the live state from a peer.
The model and data are ``examples/fsdp2_dcp/train.py``'s (a small residual MLP learning a
fixed random linear map from deterministic synthetic batches), so the two stacks do the same
work. The model is wrapped in torchft's ``DistributedDataParallel`` and AdamW in its
``Optimizer``, over ``ProcessGroupGloo`` (CPU). Training ends when the manager's step (the
number of committed steps, which a healed group takes over from its peer) reaches
``--steps``. Rank 0 of each group prints ``step {n} loss {x:.4f} participants {k} group
{g}`` per committed step, and at the end saves the model, optimizer and manager state with
``torch.save`` to ``--ckpt-dir/replica_group_{g}.pt``. There is no periodic checkpoint, as in
torchft's example: a group that restarts heals from a live peer, not from a file.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.nn.functional as F
from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fsdp2_dcp"))
from train import SEED, Net, batch  # noqa: E402  (the same model and data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--dim", type=int, default=64, help="model width")
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--timeout-s", type=float, default=5.0,
                        help="torchft's timeout for collectives, commits and healing")
    parser.add_argument("--quorum-timeout-s", type=float, default=30.0,
                        help="how long a step waits for the lighthouse's quorum")
    parser.add_argument("--connect-timeout-s", type=float, default=10.0,
                        help="how long a manager tries to reach the lighthouse and its peers")
    parser.add_argument("--ckpt-dir", type=Path,
                        default=Path(os.environ.get("CKPT_DIR", "./checkpoints")))
    args = parser.parse_args()

    replica_group_id = int(os.environ.get("REPLICA_GROUP_ID", 0))
    group_rank, group_world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    data_rank = replica_group_id * group_world_size + group_rank

    torch.manual_seed(SEED)  # every group starts from the same weights (init_sync aside)
    model = Net(args.dim, args.blocks)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

    def load_state_dict(state_dict: dict) -> None:
        model.load_state_dict(state_dict["model"])
        optimizer.load_state_dict(state_dict["optim"])

    def state_dict() -> dict:
        return {"model": model.state_dict(), "optim": optimizer.state_dict()}

    timeout = timedelta(seconds=args.timeout_s)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout),
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"train_ddp_{replica_group_id}",
        timeout=timeout,
        quorum_timeout=timedelta(seconds=args.quorum_timeout_s),
        connect_timeout=timedelta(seconds=args.connect_timeout_s),
    )
    ddp = DistributedDataParallel(manager, model)
    optimizer = Optimizer(manager, inner)

    while manager.current_step() < args.steps:
        # must be called at the beginning of each step: starts the quorum
        optimizer.zero_grad()
        step = manager.current_step() + 1
        x, y = batch(step, data_rank, args.batch_size, args.dim)
        loss = F.mse_loss(ddp(x), y)
        loss.backward()  # the gradient allreduce across replica groups
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        # steps AdamW only if every group in the quorum succeeded (should_commit)
        optimizer.step()
        if group_rank == 0 and manager.current_step() == step:
            print(f"step {step} loss {loss.item():.4f} participants "
                  f"{manager.num_participants()} group {replica_group_id}", flush=True)
    if group_rank == 0:
        args.ckpt_dir.mkdir(parents=True, exist_ok=True)
        torch.save({"model": model.state_dict(), "optim": optimizer.state_dict(),
                    "torchft": manager.state_dict()},
                   args.ckpt_dir / f"replica_group_{replica_group_id}.pt")
    manager.shutdown(wait=False)


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
