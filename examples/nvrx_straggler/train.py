"""The FSDP2 trainer of examples/fsdp2_dcp with NVIDIA Resiliency Extension's straggler scoring as
its monitor: a level-0 trainer (it imports nothing of faultlab) whose monitor prints a line.

NVRx 0.4.1's straggler detection has two halves. Its measurement, ``straggler.Detector``, times
CUDA kernels through CUPTI and cannot run on a CPU host (examples/nvrx_straggler/README.md says
where it stops). Its scoring, ``straggler.reporting.ReportGenerator`` and
``Report.identify_stragglers``, is plain torch.distributed and runs here unchanged on gloo. This
trainer feeds that scoring what ``Detector`` gathers for a user-defined section when it is told
not to profile CUDA (``detection_section(..., profile_cuda=False)``): the time of each
entry into the section (its wall time less the time the thread waited for a CPU, as a
device's kernel time is), summarized as ``Detector._get_section_summaries`` does (min, max,
median, mean, std and count per report). The section is the forward pass: under FSDP2 a slow
rank's peers do not wait for it in the forward's all-gathers (they wait in the backward's
reduce-scatters), so the forward is where a slow rank's own compute shows. Every
``--report-every`` steps every rank joins the report; rank 0 prints one line per rank whose
relative score (the fastest rank's median over its own) is below NVRx's default threshold 0.75:

    NVRx straggler: rank 1 (node node1) section forward relative score 0.331 at step 15

Run it like examples/fsdp2_dcp/train.py (``torchrun --nproc-per-node 2 ...``).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from nvidia_resiliency_ext.straggler import Statistic
from nvidia_resiliency_ext.straggler.reporting import ReportGenerator
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fsdp2_dcp"))
from train import SEED, Net, batch  # noqa: E402  (the same work)

SECTION = "forward"


def cpu_wait_s() -> float:
    """Seconds this thread has waited for a CPU (runnable, not running), from the kernel's
    ``/proc/thread-self/schedstat``; 0.0 where it keeps none."""
    try:
        with open("/proc/thread-self/schedstat", encoding="ascii") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def summary(seconds: list[float]) -> dict[Statistic, float]:
    """One section's timings as NVRx's Detector summarizes them (straggler.py,
    ``_get_section_summaries``)."""
    t = torch.tensor(seconds, dtype=torch.float64)
    return {Statistic.MIN: t.min().item(), Statistic.MAX: t.max().item(),
            Statistic.MED: t.median().item(), Statistic.AVG: t.mean().item(),
            Statistic.STD: t.std().item() if len(t) > 1 else float("nan"),
            Statistic.NUM: len(t)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--report-every", type=int, default=5,
                        help="steps per NVRx report (each a few small collectives)")
    parser.add_argument("--threshold", type=float, default=0.75,
                        help="relative score under which a rank is a straggler (NVRx's default)")
    parser.add_argument("--dim", type=int, default=256, help="model width")
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(SEED)
    model = Net(args.dim, args.blocks)
    mesh = init_device_mesh("cpu", (world_size,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    node = os.environ.get("FAULTLAB_NODE") or socket.gethostname()
    reporter = ReportGenerator(scores_to_compute=["relative_perf_scores"], gather_on_rank0=True,
                               node_name=node)
    forward_s: list[float] = []

    for step in range(1, args.steps + 1):
        x, y = batch(step, rank, args.batch_size, args.dim)
        t0, waited0 = time.perf_counter(), cpu_wait_s()
        out = model(x)
        # less the time this thread waited for a CPU: CUPTI times kernels on the device, which
        # a busy host does not lengthen (here, unsubtracted, a fault-free rank scored 0.72)
        forward_s.append(max(0.0, time.perf_counter() - t0 - (cpu_wait_s() - waited0)))
        loss = F.mse_loss(out, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        if step % args.report_every == 0:
            report = reporter.generate_report({SECTION: summary(forward_s)}, {})
            forward_s.clear()
            if report is not None:  # rank 0: every rank's scores
                found = report.identify_stragglers(section_rel_threshold=args.threshold)
                scores = report.section_relative_perf_scores.get(SECTION, {})
                for straggler in sorted(found["straggler_sections_relative"].get(SECTION, ()),
                                        key=lambda s: s.rank):
                    print(f"NVRx straggler: rank {straggler.rank} (node {straggler.node}) "
                          f"section {SECTION} relative score {scores[straggler.rank]:.3f} "
                          f"at step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # torch 2.13's gloo can kill this process with SIGABRT at interpreter exit after a clean
    # finish (pytorch/pytorch#190489, #117762): leave without finalizing, the output flushed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
