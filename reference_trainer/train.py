"""The reference FSDP2 trainer: one loop, read top to bottom.

Run one rank per process under torchrun; ``faultlab launch ... -- python -m
reference_trainer.train ...`` sets up a local elastic job (see README.md beside this file).

It is the worked example of what a trainer owes faultlab, and where this file gives it:

- **Records** (integration level 2). Every milestone is one JSON line, written with faultlab's
  public emitter (``faultlab.runtime.events.EventLog``; ``RECORD_KINDS`` lists every kind and
  field): ``start`` with the step it resumed from (``announce_start``), ``step`` with the loss
  and the samples it consumed (``finish_step``), ``checkpoint_saved`` and ``checkpoint_loaded``
  (checkpoint.py), ``anomaly`` for what it noticed, ``final_digest`` of the whole state at the
  end and ``exit`` with a reason and a code (``finish``, ``main``; health.EXIT_CODES, the table
  in README.md). faultlab judges a run from these records.
- **The runtime agent** (``faultlab.runtime``): attached once (``build``), told when each step
  begins (``train_step``), handed the loss (``forward_backward``), and told when each step is
  done, after its record (``finish_step``): that is the step gate, where a fault injected from
  outside "at step N" meets the job. In-rank faults strike through it (a NaN gradient, a slow
  or stuck collective). Outside faultlab it does nothing.
- **The same bits.** The same seed gives the same final state, and a checkpoint holds all that
  decides the next step (model, optimizer, LR schedule, data position, every rank's RNG), so a
  run that resumed ends with the fault-free run's ``final_digest``.
- **Leaving the right way.** An exit code that says why, and a watchdog for a rank that makes
  no progress (exit code 3); a node whose GPU is lost or that is preempted makes its torchrun
  agent leave, so that the job shrinks instead of restarting in place.

A rank's life, in the order of the functions below:

1. ``main``: the config (a bad flag is one line on stderr and exit code 2), the event log, the
   watchdog, and one ``exit`` record for whatever ends the rank; ``train`` runs the phases.
2. The set-up, ``join_job``: a GPU check beside the process groups (gloo on CPU, NCCL on CUDA,
   and a second gloo group for checkpoints), then the device mesh. A GPU that failed for good
   makes its node leave the job (exit code 7; gpu_health.py). Then ``build``: the model, seeded
   the same everywhere and sharded with ``fully_shard`` per block and at the root (over a
   (replicate, shard) mesh with ``--replicate N``: HSDP), the optimizer, the LR schedule, the
   data, the checkpoints and the bar's monitors.
3. The resume, ``resume``: from the newest *valid* checkpoint, if any (corrupt ones are
   reported and skipped; checkpoint.py).
4. The step, ``train_step``, in ``train``'s one loop: this rank's slice of a fixed global batch
   (``forward_backward``); one all-reduce of the step's stats (``share_stats``) that tells every
   rank of a non-finite loss anywhere and of a preemption notice, so that every rank decides
   the same, and feeds the bar's monitors (``watch``: stragglers in health.py; HSDP replicas
   compared by fingerprint, loss and grad-norm spikes in monitors.py); then the optimizer step,
   the step's record and its gate (``finish_step``).
5. The checkpoint, ``checkpoint``: every N steps and at the last.
6. When a step goes wrong: a non-finite loss or gradient norm is rolled back, skipped or
   aborted before the optimizer step (``on_nonfinite``); a preemption notice makes every rank
   join an emergency checkpoint of the last completed step and leave (exit code 5,
   ``leave_for_preemption``; preemption.py); an out-of-memory step is retried once (then exit
   code 8); an accelerator error on a GPU the health check finds unhealthy makes the node
   leave (code 7).
7. The exit, ``finish``: the last step made durable, and the full unsharded state hashed into
   ``final_digest``.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from faultlab import runtime as faultlab_runtime
from faultlab.runtime.events import EventLog
from faultlab.runtime.gpu import runnable_wait_s
from reference_trainer.checkpoint import (
    CheckpointError,
    CheckpointManager,
    capture_rng,
    list_checkpoints,
    seed_rank_rng,
)
from reference_trainer.config import (
    ConfigError,
    ModelConfig,
    TrainConfig,
    add_train_args,
    config_from_args,
)
from reference_trainer.data import GlobalBatchSampler, MarkovTokens
from reference_trainer.digest import state_digest
from reference_trainer.gpu_health import GpuHealth, check_gpu, is_accelerator_error
from reference_trainer.health import (
    EXIT_CODES,
    ComputeStragglerDetector,
    SlowStepTracker,
    StragglerDetector,
    Watchdog,
    attribute_slow_links,
    enable_determinism,
    probe_links,
)
from reference_trainer.model import GPT
from reference_trainer.monitors import BarMonitors, finding_line
from reference_trainer.preemption import (
    PreemptedMidStep,
    PreemptionWatcher,
    install_block_checks,
    resolve_endpoint,
)

# --- the recipe: command line, LR schedule, model, gradient norm -------------------------------


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_CODES["usage"], f"{self.prog}: error: {message}\n")


def parse_config(argv: list[str] | None, prog: str = "reference_trainer.train") -> TrainConfig:
    parser = _OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, default=os.environ.get("FAULTLAB_RUN_DIR"),
                        help="run directory (default: $FAULTLAB_RUN_DIR)")
    add_train_args(parser)
    args = parser.parse_args(argv)
    if args.run_dir is None:
        parser.error("--run-dir is required (or set FAULTLAB_RUN_DIR)")
    try:
        return config_from_args(args, args.run_dir)
    except ConfigError as e:
        parser.error(f"argument {e}")
        raise  # unreachable: error() exits


def lr_lambda(cfg: TrainConfig):  # noqa: ANN201 - a closure for LambdaLR
    def f(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine
    return f


def build_sharded_model(mcfg: ModelConfig, *, seed: int, mesh: DeviceMesh,
                        mp_policy: MixedPrecisionPolicy | None = None) -> GPT:
    """The trainer's model recipe: seeded init (identical on every rank; ``fully_shard`` keeps
    each rank's shard of it), then ``fully_shard`` per block and at the root."""
    mp_policy = mp_policy or MixedPrecisionPolicy()
    torch.manual_seed(seed)
    model = GPT(mcfg)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy)
    return model


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> float:
    """Global gradient norm over all shards (a collective), clipping in place when asked."""
    params = [p for p in model.parameters() if p.grad is not None]
    total = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    if isinstance(total, DTensor):
        total = total.full_tensor()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)


# --- who this rank is, and what the phases share -----------------------------------------------


@dataclass(slots=True, kw_only=True)
class Joined:
    """What joining the job gives a rank (``join_job``)."""

    device: torch.device
    backend: str
    ckpt_pg: dist.ProcessGroup  # DCP (and async_save's background thread) talks on its own
    mesh: DeviceMesh
    t_pg_ready: float  # when the process group was up: the start-up breakdown's mark


@dataclass(slots=True, kw_only=True)
class Run:
    """Everything the phases after set-up share: who this rank is and what it trains."""

    cfg: TrainConfig
    rank: int
    world_size: int
    local_rank: int
    events: EventLog
    watchdog: Watchdog
    progress: dict[str, int]  # the last completed step, for the watchdog's and notices' records
    agent_pid: int  # torchrun's agent: the workers are its children
    watcher: PreemptionWatcher | None  # None when no cloud's metadata endpoint is set
    device: torch.device
    model: GPT
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    rt: faultlab_runtime.NullAgent  # faultlab's runtime agent (does nothing outside faultlab)
    data: MarkovTokens
    sampler: GlobalBatchSampler
    ckpt: CheckpointManager
    monitors: BarMonitors

    @property
    def last_step(self) -> int:
        return self.cfg.stop_after or self.cfg.steps

    @property
    def tokens_per_step(self) -> int:
        return self.cfg.global_batch * self.cfg.model.seq_len


@dataclass(slots=True, kw_only=True)
class StepState:
    """What a step leaves to the next: the detectors' memory and this rank's last waits."""

    stragglers: StragglerDetector
    # A slow link slows every rank alike (each waits in the same collectives), so waits name
    # no one; a run of slow steps then triggers a timed point-to-point probe of the links.
    slow_steps: SlowStepTracker
    # A slow GPU slows its own compute, which waits in collectives do not show (health.py).
    slow_gpus: ComputeStragglerDetector
    wait_s: float = 0.0  # this rank's wait in the previous step's stats all-reduce
    wait_mark: float = 0.0  # its wait for a CPU until the end of that all-reduce
    rng_at_start: dict[str, Any] = field(default_factory=dict)  # for a mid-step emergency save
    fired: set[tuple[int, int | None]] = field(default_factory=set)  # --inject-nonfinite done
    rollbacks: int = 0
    oom_retried_step: int = 0  # an out-of-memory step is retried once

    @classmethod
    def first(cls, cfg: TrainConfig, world_size: int) -> StepState:
        """Before this process's first step: detectors that have seen nothing yet."""
        return cls(stragglers=StragglerDetector(world_size,
                                                threshold_s=cfg.straggler_threshold_s,
                                                num_steps=cfg.straggler_steps),
                   wait_mark=runnable_wait_s(),
                   slow_steps=SlowStepTracker(factor=cfg.link_probe_slowdown,
                                              num_steps=cfg.straggler_steps),
                   slow_gpus=ComputeStragglerDetector(world_size,
                                                      ratio=cfg.compute_straggler_ratio,
                                                      threshold_s=cfg.straggler_threshold_s,
                                                      num_steps=cfg.straggler_steps))


# --- the life of a rank ------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """One rank process: its config, its event log and watchdog, and one ``exit`` record for
    whatever ends it (an exception included) with the exit code torchrun's agent sees."""
    t_main = time.time()  # imports are done: the process-start cost is paid
    cfg = parse_config(argv)
    if "RANK" not in os.environ:  # a single process outside torchrun
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(_free_port()))
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    node = os.environ.get("FAULTLAB_NODE") or socket.gethostname()
    events = EventLog(cfg.run_dir / "events", rank=rank, world_size=world_size, node=node,
                      restart=restart)
    progress = {"step": 0}
    # Started by train() once the process group is up: until then a rank waits for its peers'
    # start-up (their imports, the rendezvous), which a slow or loaded machine stretches by
    # seconds, and which --pg-timeout-s bounds. A 5 s step watchdog armed from the first line
    # fired there on a machine half as fast, and every restart met it again.
    watchdog = Watchdog(cfg.watchdog_s,
                        lambda idle_s: _report_hang(events, progress, watchdog, idle_s))
    try:
        code = train(cfg, rank=rank, world_size=world_size, local_rank=local_rank,
                     events=events, watchdog=watchdog, progress=progress, t_main=t_main)
        if code in (EXIT_CODES["preempted"], EXIT_CODES["gpu_unhealthy"]):
            # Leave now: the peers are leaving too, and tearing down a process group whose
            # peers are gone only delays the agent (see the os._exit below).
            sys.stderr.flush()
            os._exit(code)
        return code
    except ConfigError as e:  # a flag that only the job's shape shows to be wrong
        print(f"reference_trainer: rank {rank}: error: argument {e}", file=sys.stderr,
              flush=True)
        events.emit("exit", reason="usage", code=EXIT_CODES["usage"], error=str(e))
        return EXIT_CODES["usage"]
    except CheckpointError as e:
        print(f"reference_trainer: rank {rank}: {e}", file=sys.stderr, flush=True)
        events.emit("exit", reason="checkpoint_unusable", code=EXIT_CODES["checkpoint_unusable"],
                    error=str(e))
        return EXIT_CODES["checkpoint_unusable"]
    except Exception as e:
        events.emit("exit", reason="error", code=EXIT_CODES["error"],
                    error=f"{type(e).__name__}: {e}"[:2000], step=progress["step"])
        traceback.print_exc()
        sys.stderr.flush()
        # Die now: a normal interpreter exit with a broken process group lingers for ~0.5 s in
        # destructors, and the agent only restarts the group once this process is gone.
        os._exit(EXIT_CODES["error"])
    finally:
        watchdog.stop()


def train(cfg: TrainConfig, *, rank: int, world_size: int, local_rank: int, events: EventLog,
          watchdog: Watchdog, progress: dict[str, int], t_main: float) -> int:
    """The phases in order: set-up, resume, the loop of steps, the exit. Returns the exit
    code; raises what ``main`` turns into one."""
    t_created = _process_start_time()
    agent_pid = os.getppid()  # torchrun's agent: the workers are its children
    watcher = _start_preemption_watcher(cfg, events, progress)
    joined = join_job(cfg, rank=rank, world_size=world_size, local_rank=local_rank,
                      events=events, agent_pid=agent_pid)
    if isinstance(joined, int):  # a GPU is unhealthy, this rank's or a peer's: leave the job
        return joined
    watchdog.start()
    run = build(cfg, joined, rank=rank, world_size=world_size, local_rank=local_rank,
                events=events, watchdog=watchdog, progress=progress, agent_pid=agent_pid,
                watcher=watcher)
    step = progress["step"] = resume(run)
    announce_start(run, joined, step, t_created=t_created, t_main=t_main)
    loop = StepState.first(cfg, world_size)
    if watcher is not None:
        install_block_checks(run.model.blocks, watcher, run.device)
    run.model.train()
    while step < run.last_step:
        step, code = train_step(run, loop, step)
        if code is not None:
            return code
    return finish(run, step)


# --- set-up ------------------------------------------------------------------------------------


def join_job(cfg: TrainConfig, *, rank: int, world_size: int, local_rank: int,
             events: EventLog, agent_pid: int) -> Joined | int:
    """Set-up: the device, the process groups and the mesh, after a GPU check. Returns the exit
    code instead when a GPU is unhealthy, this rank's or a peer's: every rank leaves."""
    # Every (re)start checks the GPU first: an Xid 79 or an uncorrectable ECC error does not
    # heal by restarting the process, and restarting in place would burn every restart. The
    # check runs beside the process-group set-up (importing pynvml alone takes 40-80 ms here).
    checked: list[GpuHealth] = []
    checker = threading.Thread(target=_check_gpu_into, args=(local_rank, checked),
                               name="gpu-health", daemon=True)
    checker.start()
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        checker.join()  # a lost GPU must not be handed to NCCL's eager init below
        torch.cuda.set_device(device)
    if cfg.deterministic:
        enable_determinism(device)
    backend = "nccl" if use_cuda else "gloo"
    faultlab_runtime.install()  # the collective interposer (costs nothing with no fault)
    _wait_for_master_store(rank, cfg.pg_timeout_s)
    dist.init_process_group(backend, timeout=timedelta(seconds=cfg.pg_timeout_s),
                            device_id=device if use_cuda and not checked[0].unhealthy
                            else None)
    # DCP (and async_save's background thread) talks on its own gloo group.
    ckpt_pg = dist.new_group(backend="gloo", timeout=timedelta(seconds=cfg.pg_timeout_s))
    checker.join()
    gpu = checked[0]
    events.emit("gpu_health", status=gpu.status, device=local_rank, reasons=gpu.reasons,
                **gpu.detail)
    # Every rank learns whose GPU is unhealthy (on the gloo group: a lost GPU cannot reduce),
    # so that all leave together, as after a preemption notice.
    unhealthy = torch.zeros(world_size, dtype=torch.float64)
    unhealthy[rank] = 1.0 if gpu.unhealthy else 0.0
    dist.all_reduce(unhealthy, group=ckpt_pg)
    if unhealthy.any():
        bad = [r for r in range(world_size) if unhealthy[r] > 0]
        return _leave_for_unhealthy_gpu(events, gpu, bad, agent_pid, step=0, when="start")
    mesh = _device_mesh(device.type, world_size, cfg.replicate)
    return Joined(device=device, backend=backend, ckpt_pg=ckpt_pg, mesh=mesh,
                  t_pg_ready=time.time())


def build(cfg: TrainConfig, joined: Joined, *, rank: int, world_size: int, local_rank: int,
          events: EventLog, watchdog: Watchdog, progress: dict[str, int], agent_pid: int,
          watcher: PreemptionWatcher | None) -> Run:
    """The model (the same seed on every rank, then sharded), the optimizer and LR schedule,
    the runtime agent attached to them, the data, the checkpoints and the bar's monitors."""
    mcfg, device = cfg.model, joined.device
    use_cuda = device.type == "cuda"
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if use_cuda else MixedPrecisionPolicy()
    model = build_sharded_model(mcfg, seed=cfg.seed, mesh=joined.mesh, mp_policy=mp)
    if use_cuda:
        model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95),
                                  weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    rt = faultlab_runtime.attach(model, optimizer, emit=events.emit)
    data = MarkovTokens(vocab_size=mcfg.vocab_size, seq_len=mcfg.seq_len, seed=cfg.seed)
    sampler = GlobalBatchSampler(global_batch=cfg.global_batch, rank=rank, world_size=world_size)
    ckpt = CheckpointManager(cfg.run_dir / "checkpoints", keep=cfg.keep_checkpoints,
                             async_save=cfg.async_checkpoint, rank=rank, world_size=world_size,
                             process_group=joined.ckpt_pg, emit=events.emit, beat=watchdog.beat,
                             timeout_s=cfg.checkpoint_timeout_s or cfg.watchdog_s,
                             arm=watchdog.arm, disarm=watchdog.disarm)
    # The bar's silent-failure monitors (monitors.py): they read, never write, and ride the
    # step's stats all-reduce.
    monitors = BarMonitors(world_size, rank, replicate=cfg.replicate,
                           spike_factor=cfg.spike_factor)
    return Run(cfg=cfg, rank=rank, world_size=world_size, local_rank=local_rank,
               events=events, watchdog=watchdog, progress=progress, agent_pid=agent_pid,
               watcher=watcher, device=device, model=model, optimizer=optimizer,
               scheduler=scheduler, rt=rt, data=data, sampler=sampler, ckpt=ckpt,
               monitors=monitors)


# --- resume ------------------------------------------------------------------------------------


def resume(run: Run) -> int:
    """Load the newest valid checkpoint (model, optimizer, every rank's RNG, then the data
    position and LR schedule), or start from step 0 with each rank's RNG seeded; the last
    completed step. The non-finite rollback calls it again, in-process."""
    loaded = run.ckpt.load_latest(run.model, run.optimizer,
                                  on_none_valid=run.cfg.on_no_valid_checkpoint)
    if loaded is None:
        seed_rank_rng(run.cfg.seed, 0, run.rank)
        run.sampler.consumed = 0
        return 0
    result, state = loaded
    if state["config"]["preset"] != run.cfg.preset:
        raise CheckpointError(f"{result.path} holds preset {state['config']['preset']!r}, "
                              f"this run is {run.cfg.preset!r}; use a new --run-dir")
    run.sampler.load_state_dict(state["sampler"])
    run.scheduler.load_state_dict(state["scheduler"])
    return int(state["step"])


def announce_start(run: Run, joined: Joined, step: int, *, t_created: float,
                   t_main: float) -> None:
    """The ``start`` record: where this process resumed, and its start-up breakdown."""
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    cfg = run.cfg
    run.events.emit("start", resumed_from_step=step, preset=cfg.preset,
                    num_params=cfg.model.num_params(), device=str(run.device),
                    backend=joined.backend, global_batch=cfg.global_batch, steps=cfg.steps,
                    local_rank=run.local_rank, t_process_created=t_created, t_main=t_main,
                    t_pg_ready=joined.t_pg_ready, t_ready=time.time(),
                    monitors=run.monitors.describe())
    if run.rank == 0 and restart == 0 and not run.monitors.fingerprint.active:
        print(f"reference_trainer: {run.monitors.describe()['fingerprint']}", file=sys.stderr,
              flush=True)
    run.watchdog.beat()


# --- the step ----------------------------------------------------------------------------------


def train_step(run: Run, loop: StepState, step: int) -> tuple[int, int | None]:
    """Step ``step + 1``, as every rank decides it together. Returns the last completed step
    (``step`` again for a retry, the checkpoint's after a rollback) and, when the rank must
    leave, its exit code."""
    run.ckpt.poll()
    s = step + 1
    t0 = time.monotonic()
    if run.watcher is not None:
        # A notice is checked at every block boundary (install_block_checks; the first
        # block's comes right after this) and with the step's stats. The RNG state is kept
        # so that a save made mid-step stores the state of the step's start.
        loop.rng_at_start = capture_rng()
    run.rt.step(s)
    ids = run.sampler.local_ids(s)
    x, y = (v.to(run.device, non_blocking=True) for v in run.data.batch(ids))
    try:
        loss_sum, forward_s, cpu_wait_s = forward_backward(run, loop, s, x, y)
    except PreemptedMidStep:  # every rank, at the same block: abandon step s
        _drop_step(run)
        return step, leave_for_preemption(run, step, loop.rng_at_start, "block boundary")
    except torch.OutOfMemoryError as e:
        return step, on_out_of_memory(run, loop, s, e)
    except Exception as e:
        code = on_accelerator_error(run, s, step, e) if is_accelerator_error(e) else None
        if code is None:
            raise
        return step, code
    grad_norm = clip_grad_norm(run.model, run.cfg.grad_clip)
    stats = share_stats(run, loop, t0, loss_sum, forward_s=forward_s, cpu_wait_s=cpu_wait_s,
                        local_tokens=len(ids) * run.cfg.model.seq_len)
    loss = float(stats[0]) / run.tokens_per_step
    probe = watch(run, loop, s, stats, loss=loss, grad_norm=grad_norm)
    if stats[2] > 0:  # step s is abandoned before its optimizer step: save step s - 1
        run.optimizer.zero_grad(set_to_none=True)
        return step, leave_for_preemption(run, step, loop.rng_at_start, "after backward")
    bad_ranks = int(stats[1])
    if bad_ranks or not math.isfinite(grad_norm):
        return on_nonfinite(run, loop, s, ids, loss=loss, grad_norm=grad_norm, bad_ranks=bad_ranks)
    finish_step(run, s, t0, ids, loss=loss, grad_norm=grad_norm, wait_s=loop.wait_s,
                cpu_wait_s=cpu_wait_s)
    checkpoint(run, s)
    if probe:
        probe_slow_links(run, loop, s)
    return s, None


def forward_backward(run: Run, loop: StepState, s: int, x: torch.Tensor,
                     y: torch.Tensor) -> tuple[torch.Tensor, float, float]:
    """This rank's slice of the global batch: its summed loss (through the runtime agent,
    where a NaN fault strikes), the backward, its compute time and its wait for a CPU."""
    t_forward, waited = time.monotonic(), runnable_wait_s()
    out = run.model(x, y)
    # its compute, not the time it waited for a CPU (faultlab.runtime.gpu.runnable_wait_s);
    # and how long it waited for a CPU since the last stats all-reduce, which its peers may
    # have spent waiting for it in the forward's all-gathers
    waited_now = runnable_wait_s()
    forward_s = time.monotonic() - t_forward - (waited_now - waited)
    cpu_wait_s = waited_now - loop.wait_mark
    loss_sum = run.rt.loss(out)
    for key in ((s, run.rank), (s, None)):
        if key in run.cfg.inject_nonfinite and key not in loop.fired:
            loop.fired.add(key)
            loss_sum = loss_sum * float("nan")
    # FSDP2 averages gradients over the ranks; scale so the result is the gradient of the mean
    # over the *global* batch even when the slices are uneven.
    (loss_sum * (run.world_size / run.tokens_per_step)).backward()
    return loss_sum, forward_s, cpu_wait_s


def share_stats(run: Run, loop: StepState, t0: float, loss_sum: torch.Tensor, *,
                forward_s: float, cpu_wait_s: float, local_tokens: int) -> torch.Tensor:
    """One all-reduce, summed on every rank: the global loss, the count of ranks that saw a
    non-finite loss, of ranks whose node received a preemption notice, every rank's wait in
    the previous step's all-reduce, forward time and CPU wait (straggler detection), and the
    bar's monitors' slots. Every rank sees the same sums, so every rank decides the same."""
    ws, rank = run.world_size, run.rank
    # Flagged in this very step (not the next): every rank learns it from these stats.
    slow_flag = 1.0 if loop.slow_steps.update(time.monotonic() - t0) else 0.0
    stats = torch.zeros(4 + 3 * ws + run.monitors.width, dtype=torch.float64)
    stats[0] = float(loss_sum.detach())
    stats[1] = 0.0 if torch.isfinite(loss_sum) else 1.0
    stats[2] = 1.0 if run.watcher is not None and run.watcher.noticed else 0.0
    stats[3 + rank] = loop.wait_s
    stats[3 + ws] = slow_flag
    stats[4 + ws + rank] = forward_s
    stats[4 + 2 * ws + rank] = cpu_wait_s
    run.monitors.fill(stats[4 + 3 * ws:], run.model.parameters(),
                      float(loss_sum.detach()) / local_tokens if local_tokens else math.nan)
    stats = stats.to(run.device)
    work = dist.all_reduce(stats, async_op=True)
    # The wait is timed from the moment this rank has issued the collective: a rank that
    # issues late waits for nobody.
    t_issued = time.monotonic()
    work.wait()
    stats = stats.cpu()
    loop.wait_s = time.monotonic() - t_issued
    loop.wait_mark = runnable_wait_s()
    return stats


def watch(run: Run, loop: StepState, s: int, stats: torch.Tensor, *, loss: float,
          grad_norm: float) -> bool:
    """The bar's monitors read the step's summed stats and report (rank 0) what raises no
    error: a straggler, a slow GPU, replicas that diverged, a spike. Returns whether to probe
    the links after this step (slow steps that no rank's wait explains)."""
    ws = run.world_size
    probe = bool(stats[3 + ws] > 0) and ws > 1
    if s > 1:
        named = loop.stragglers.update(stats[3:3 + ws].tolist())
        if named is not None and run.rank == 0:
            run.events.emit("anomaly", what="straggler", step=s, action="report", **named)
        probe = probe and loop.stragglers.named is None
        slow_gpu = loop.slow_gpus.update(stats[4 + ws:4 + 2 * ws].tolist(),
                                         stats[4 + 2 * ws:4 + 3 * ws].tolist())
        if slow_gpu is not None and run.rank == 0:
            run.events.emit("anomaly", what="straggler", step=s, action="report", **slow_gpu)
    for finding in run.monitors.check(s, stats[4 + 3 * ws:].tolist(), loss=loss,
                                      grad_norm=grad_norm):
        if run.rank == 0:
            run.events.emit("anomaly", action="report", **finding)
            print(f"reference_trainer: {finding_line(finding)}", file=sys.stderr, flush=True)
    return probe


def finish_step(run: Run, s: int, t0: float, ids: range, *, loss: float, grad_norm: float,
                wait_s: float, cpu_wait_s: float) -> None:
    """The optimizer step, the step's record, then the step gate: a fault faultlab injects
    from outside "at step s" (a kill, a preemption, a machine lost) lands there, before step
    s's checkpoint (faultlab.runtime.gates)."""
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    run.sampler.advance(s)
    run.progress["step"] = s
    if run.cfg.min_step_time_s:
        time.sleep(max(0.0, run.cfg.min_step_time_s - (time.monotonic() - t0)))
    ids_global = run.sampler.global_ids(s)
    run.events.emit("step", step=s, loss=loss, grad_norm=grad_norm,
                    lr=run.scheduler.get_last_lr()[0], samples=[ids_global.start, ids_global.stop],
                    local_samples=[ids.start, ids.stop],
                    step_time_s=round(time.monotonic() - t0, 5), collective_wait_s=round(wait_s, 5),
                    cpu_wait_s=round(cpu_wait_s, 5))
    run.watchdog.beat()
    run.rt.step_done(s, beat=run.watchdog.beat)


def probe_slow_links(run: Run, loop: StepState, s: int) -> None:
    """Time a point-to-point transfer over every link, and name a slow one (rank 0 reports)."""
    cfg = run.cfg
    t_probe = time.monotonic()
    transfers = probe_links(run.rank, run.world_size, run.device, cfg.link_probe_bytes)
    found = attribute_slow_links(transfers, factor=cfg.link_probe_slowdown,
                                 floor_s=cfg.straggler_threshold_s)
    run.watchdog.beat()
    if run.rank == 0:
        run.events.emit("link_probe", step=s, bytes=cfg.link_probe_bytes,
                        seconds=round(time.monotonic() - t_probe, 4),
                        baseline_step_s=loop.slow_steps.baseline_s,
                        transfers=[[a, b, round(d, 4)] for a, b, d in transfers],
                        culprit=None if found is None else found["straggler_rank"])
        if found is not None:
            run.events.emit("anomaly", what="straggler", step=s, action="report",
                            cause="slow_link", **found)


# --- the checkpoint ----------------------------------------------------------------------------


def checkpoint(run: Run, s: int) -> None:
    """Every ``--checkpoint-every`` steps and at the last step (that one synchronous). A
    failed save is reported and quarantined inside; training goes on and the next interval
    (or the end) tries again."""
    if s % run.cfg.checkpoint_every == 0 or s == run.last_step:
        run.ckpt.save(s, run.model, run.optimizer, trainer_state(run, s),
                      force_sync=(s == run.last_step))
        run.watchdog.beat()


def trainer_state(run: Run, s: int) -> dict[str, Any]:
    """What a checkpoint holds besides model, optimizer and RNG: JSON, never pickled."""
    return {"step": s, "sampler": run.sampler.state_dict(), "scheduler": run.scheduler.state_dict(),
            "config": run.cfg.to_json(), "torch_version": torch.__version__,
            "world_size": run.world_size}


# --- when a step goes wrong --------------------------------------------------------------------


def on_nonfinite(run: Run, loop: StepState, s: int, ids: range, *, loss: float,
                 grad_norm: float, bad_ranks: int) -> tuple[int, int | None]:
    """A non-finite loss on some rank, or gradient norm: no optimizer step. ``rollback``
    reloads the newest checkpoint in-process and replays, ``skip`` drops the batch (its
    samples count as consumed), ``abort`` leaves (exit code 4); ``train_step``'s return."""
    cfg = run.cfg
    run.optimizer.zero_grad(set_to_none=True)
    what = "nonfinite_loss" if bad_ranks else "nonfinite_grad_norm"
    policy = cfg.nonfinite_policy
    if policy == "rollback" and loop.rollbacks >= cfg.max_rollbacks:
        policy, why = "abort", f"{loop.rollbacks} rollbacks already; replaying will not help"
    elif policy == "rollback" and not list_checkpoints(run.ckpt.root):
        policy, why = "abort", "no checkpoint to roll back to yet"
    else:
        why = None
    run.events.emit("anomaly", what=what, step=s, loss=loss, grad_norm=grad_norm,
                    action=policy, num_ranks_nonfinite=bad_ranks, **({"why": why} if why else {}))
    if policy == "rollback":
        loop.rollbacks += 1
        step = run.progress["step"] = resume(run)
        return step, None
    if policy == "skip":
        run.sampler.advance(s)
        run.scheduler.step()
        run.progress["step"] = s
        run.events.emit("step", step=s, loss=loss, grad_norm=grad_norm, skipped=True,
                        samples=[run.sampler.global_ids(s).start, run.sampler.global_ids(s).stop],
                        local_samples=[ids.start, ids.stop])
        run.watchdog.beat()
        run.rt.step_done(s, beat=run.watchdog.beat)
        return s, None
    run.events.emit("exit", reason="nonfinite_abort", code=EXIT_CODES["nonfinite_abort"], step=s)
    return s - 1, EXIT_CODES["nonfinite_abort"]


def leave_for_preemption(run: Run, at_step: int, rng: dict[str, Any], caught: str) -> int:
    """Every rank saw the notice in the same collective: commit the last completed step,
    then leave. The preempted node's agent is told to go (SIGTERM makes torchrun's agent
    stop its workers and exit *without* closing the rendezvous); the other nodes' agents
    restart their workers, which re-rendezvous without it and resume from this save."""
    assert run.watcher is not None
    run.ckpt.wait()
    if at_step == run.ckpt.committed_step:  # already committed: the emergency checkpoint
        if run.rank == 0:
            latest = list_checkpoints(run.ckpt.root)[0][1]
            run.events.emit("checkpoint_saved", step=at_step, path=str(latest), seconds=0.0,
                            stall_s=0.0, emergency=True, reused=True, **{"async": False})
    else:
        run.ckpt.save(at_step, run.model, run.optimizer, trainer_state(run, at_step),
                      force_sync=True, rng=rng, emergency=True)
    mine = run.watcher.noticed
    run.events.emit("exit", reason="preempted" if mine else "peer_preempted",
                    code=EXIT_CODES["preempted"], step=at_step, caught=caught)
    if mine:
        run.watcher.acknowledge()
        # Only while the agent is still our parent: an agent that took a second SIGTERM
        # (Slurm's requeue after the grace time) dies without waiting for its workers,
        # and the orphan's parent is then the node's init (tini in the test cluster's
        # containers, which would pass the signal on to slurmd and take the node down).
        if "TORCHELASTIC_RESTART_COUNT" in os.environ and os.getppid() == run.agent_pid:
            os.kill(run.agent_pid, signal.SIGTERM)
    return EXIT_CODES["preempted"]


def on_out_of_memory(run: Run, loop: StepState, s: int,
                     e: torch.OutOfMemoryError) -> int | None:
    """Free what can be freed (gradients, unsharded parameters, cached blocks); None: try the
    step once more. A second failure in the same step is not transient: its exit code."""
    error = str(e).splitlines()[0][:500]
    _drop_step(run)
    gc.collect()
    if run.device.type == "cuda":
        torch.cuda.empty_cache()
    if loop.oom_retried_step != s:
        loop.oom_retried_step = s
        run.events.emit("anomaly", what="gpu_oom", step=s, action="retry", error=error)
        return None
    run.events.emit("anomaly", what="gpu_oom", step=s, action="exit", error=error)
    run.events.emit("exit", reason="gpu_oom", code=EXIT_CODES["gpu_oom"], step=s,
                    error=f"torch.OutOfMemoryError: {error}")
    print(f"reference_trainer: rank {run.rank}: out of memory at step {s} twice: {error}",
          file=sys.stderr, flush=True)
    return EXIT_CODES["gpu_oom"]


def on_accelerator_error(run: Run, s: int, step: int, e: Exception) -> int | None:
    """The device failed. Restart in place (None: the caller re-raises) only if its GPU may
    still be fit; else this node leaves the job (its exit code)."""
    health = check_gpu(run.local_rank)
    run.events.emit("anomaly", what="accelerator_error", step=s, gpu_health=health.status,
                    reasons=health.reasons, error=f"{type(e).__name__}: {e}"[:500],
                    action="leave_job" if health.unhealthy else "restart")
    if not health.unhealthy:
        return None
    return _leave_for_unhealthy_gpu(run.events, health, [run.rank], run.agent_pid, step=step,
                                    when=f"step {s}")


def _drop_step(run: Run) -> None:
    """Abandon the step in flight: the blocks in flight held unsharded parameters."""
    for module in run.model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
    run.optimizer.zero_grad(set_to_none=True)


# --- the exit ----------------------------------------------------------------------------------


def finish(run: Run, step: int) -> int:
    """The loop is over: make the last step durable, then hash the full unsharded state into
    ``final_digest`` (a collective) if training is complete, and say why the rank leaves."""
    if run.watcher is not None:
        run.watcher.stop()
    run.ckpt.wait()
    durable = run.ckpt.committed_step == step or run.ckpt.save(
        step, run.model, run.optimizer, trainer_state(run, step), force_sync=True)
    if not durable:
        # The last step's save failed, and so did this retry: the steps since the last
        # committed checkpoint are not durable. Leaving with an error lets the agent restart
        # the group, which resumes from that checkpoint and saves again at the end.
        run.events.emit("exit", reason="checkpoint_save_failed",
                        code=EXIT_CODES["checkpoint_save_failed"], step=step,
                        committed_step=run.ckpt.committed_step)
        dist.destroy_process_group()
        return EXIT_CODES["checkpoint_save_failed"]
    if step < run.cfg.steps:
        run.events.emit("exit", reason="stopped", code=0, step=step)
        dist.destroy_process_group()
        return 0
    digest = state_digest(run.model, run.optimizer, run.rank)
    if digest is not None:
        run.events.emit("final_digest", step=step, **digest)
    run.events.emit("exit", reason="completed", code=0, step=step)
    dist.destroy_process_group()
    return 0


# --- helpers -----------------------------------------------------------------------------------


def _report_hang(events: EventLog, progress: dict[str, int], watchdog: Watchdog,
                 idle_s: float) -> None:
    """The watchdog fired (it then dumps every stack and exits): name the save in flight past
    its deadline, or else the step that made no progress."""
    hung = watchdog.overdue
    if hung is not None:
        events.emit("anomaly", what="checkpoint_save_hung", step=hung.get("step"),
                    path=hung.get("path"), seconds=hung.get("seconds"), action="exit")
    else:
        events.emit("anomaly", what="watchdog", step=progress["step"],
                    idle_s=round(idle_s, 3), action="exit")
    events.emit("exit", reason="watchdog", code=EXIT_CODES["watchdog"])


def _device_mesh(device_type: str, world_size: int, replicate: int) -> DeviceMesh:
    """FSDP2's 1-D mesh, or with replicas HSDP's (replicate, shard) mesh: rank
    ``r * (world_size // replicate) + j`` holds shard ``j`` of replica ``r``."""
    if replicate == 1:
        return init_device_mesh(device_type, (world_size,))
    if world_size % replicate:
        raise ConfigError("--replicate", f"{replicate!r} does not divide the world size "
                                         f"{world_size}: use a divisor of it, or 1 (no replicas)")
    return init_device_mesh(device_type, (replicate, world_size // replicate),
                            mesh_dim_names=("replicate", "shard"))


def _check_gpu_into(device: int, out: list[GpuHealth]) -> None:
    try:
        out.append(check_gpu(device))
    except Exception as e:  # noqa: BLE001 - a broken check must not stop training
        out.append(GpuHealth("not_available", device, [f"check failed: {type(e).__name__}: "
                                                       f"{e}"]))


def _leave_for_unhealthy_gpu(events: EventLog, health: GpuHealth, bad_ranks: list[int],
                             agent_pid: int, *, step: int, when: str) -> int:
    """This node's GPU is unfit to train on, or a peer's is: leave the job. The node with the
    bad GPU tells its torchrun agent to go (SIGTERM: it stops its workers and exits without
    closing the rendezvous), so the other nodes' agents restart their workers, which
    re-rendezvous without it (down to min_nodes) and resume from the last checkpoint."""
    mine = health.unhealthy
    events.emit("exit", reason="gpu_unhealthy" if mine else "peer_gpu_unhealthy",
                code=EXIT_CODES["gpu_unhealthy"], step=step, when=when, ranks=bad_ranks,
                reasons=health.reasons if mine else [])
    if mine:
        print(f"reference_trainer: GPU {health.device} is unhealthy ({'; '.join(health.reasons)})"
              f" at {when}: this node leaves the job", file=sys.stderr, flush=True)
        if "TORCHELASTIC_RESTART_COUNT" in os.environ and os.getppid() == agent_pid:
            os.kill(agent_pid, signal.SIGTERM)
    return EXIT_CODES["gpu_unhealthy"]


def _start_preemption_watcher(cfg: TrainConfig, events: EventLog,
                              progress: dict[str, int]) -> PreemptionWatcher | None:
    found = resolve_endpoint(cfg.preemption_provider, os.environ)
    if found is None:
        return None
    provider, url = found

    def on_notice(n: Any) -> None:
        events.emit("preemption_notice", provider=n.provider, deadline=n.deadline_t,
                    seen_t=n.seen_t, step=progress["step"], endpoint=url, **n.detail)

    def on_error(message: str) -> None:
        events.emit("anomaly", what="preemption_watch_error", step=progress["step"],
                    action="continue", error=message)

    return PreemptionWatcher(provider, url, poll_s=cfg.preemption_poll_s, on_notice=on_notice,
                             on_error=on_error).start()


def _process_start_time() -> float:
    """Wall-clock time this process was created, to ~10 ms.

    psutil's create_time() adds the start offset to the boot time in whole seconds, so it can be
    off by up to a second — too coarse for a start-up breakdown. The kernel's start time in
    clock ticks since boot is exact; CLOCK_BOOTTIME is the same clock."""
    with open("/proc/self/stat", encoding="ascii") as f:
        start_ticks = int(f.read().rpartition(")")[2].split()[19])
    since_start_s = time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - since_start_s


def _wait_for_master_store(rank: int, timeout_s: float) -> None:
    """Ranks > 0: wait until rank 0's TCPStore listens before ``init_process_group``.

    Restarted workers start together, and one that finishes importing before rank 0 does
    would hit a closed port; the C++ client then backs off for about a second before it tries
    again (measured here: 1.1-1.7 s instead of 0.01 s). A plain TCP probe every 20 ms avoids that.
    """
    if rank == 0:
        return
    addr = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(addr, timeout=1.0).close()
            return
        except OSError:
            time.sleep(0.02)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    code = main()
    if code == 0:
        # torch 2.13's gloo can kill a process with SIGABRT at interpreter exit after a clean
        # finish ("terminate called without an active exception": pytorch/pytorch#190489,
        # #117762; faultlab's finding abort_at_exit): leave without finalizing, output flushed.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    sys.exit(code)
