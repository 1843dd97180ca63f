"""The FSDP2 + DCP trainer of examples/fsdp2_dcp, with NVRx fault tolerance the way its docs show.

    ft_launcher --nnodes 1 --nproc-per-node 2 --max-restarts 2 \\
        --ft-initial-rank-heartbeat-timeout 60 --ft-rank-heartbeat-timeout 5 \\
        --ft-workload-check-interval 1 examples/nvrx_ft/train.py --steps 16 --ckpt-every 4

The model, the data and the checkpoints are examples/fsdp2_dcp/train.py's (imported from there,
so both stacks train exactly the same work). What NVIDIA Resiliency Extension 0.4.1 adds, as its
heartbeats integration guide (docs/source/fault_tolerance/integration/heartbeats.rst in
NVIDIA/nvidia-resiliency-ext) lays out:

1. ``RankMonitorClient().init_workload_monitoring()`` on every rank: it connects to the rank
   monitor that ``ft_launcher`` started beside this rank and receives the FT configuration
   (the heartbeat timeouts given on the launch line);
2. ``send_heartbeat()`` once per training step;
3. ``shutdown_workload_monitoring()`` after the last step.

Heartbeats are not sent while a checkpoint is loaded or saved (the docs say so too), so the
launch line's ``--ft-rank-heartbeat-timeout`` must cover the longest step plus a DCP save. A
rank that stops sending for longer is hung: its monitor sends it SIGCONT then SIGKILL, and
``ft_launcher`` restarts the worker group (``--max-restarts``), which resumes from the newest
complete checkpoint. The timeouts are given, not computed
(``calculate_and_set_hb_timeouts``): a computed timeout is the longest interval seen times a
safety factor of 5, and on a shared 2-core machine the intervals seen in a few steps are no
guide to the next stall.

The script ends the way examples/fsdp2_dcp/train.py does: ``destroy_process_group``, then
``os._exit(0)`` with its output flushed, the fix for torch 2.13's gloo abort at exit (faultlab's
finding ``abort_at_exit``).
CPU and gloo; the same seed and world size give bitwise the same run as the plain example.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import nvidia_resiliency_ext.fault_tolerance as fault_tolerance
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fsdp2_dcp"))
from train import SEED, Net, batch, newest_checkpoint  # noqa: E402  (the same work)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--ckpt-every", type=int, default=5)
    parser.add_argument("--ckpt-dir", type=Path,
                        default=Path(os.environ.get("CKPT_DIR", "./checkpoints")))
    parser.add_argument("--dim", type=int, default=64, help="model width")
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    # NVRx: connect to this rank's monitor; from here on a silence longer than the launch
    # line's heartbeat timeout is a hang, and the monitor ends this process
    ft_client = fault_tolerance.RankMonitorClient()
    ft_client.init_workload_monitoring()

    torch.use_deterministic_algorithms(True)
    torch.manual_seed(SEED)
    model = Net(args.dim, args.blocks)
    mesh = init_device_mesh("cpu", (world_size,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

    start = 0
    found = newest_checkpoint(args.ckpt_dir)
    if found is not None:
        start, path = found
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
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
        optimizer.zero_grad(set_to_none=True)
        ft_client.send_heartbeat()  # NVRx: this rank is alive, one step further
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        if step % args.ckpt_every == 0 or step == args.steps:
            save(step)
    ft_client.shutdown_workload_monitoring()
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
