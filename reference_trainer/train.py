"""The reference FSDP2 trainer: one loop, read top to bottom.

Run one rank per process under torchrun; ``faultlab launch ... -- python -m
reference_trainer.train ...`` sets up a local elastic job (see README.md beside this file).
Each rank:

1. parses and validates its config (a bad flag is one line on stderr and exit code 2);
2. joins the process group (gloo on CPU, NCCL on CUDA) and a second gloo group for checkpoints;
3. builds the model with the same seed everywhere and shards it with ``fully_shard`` per block
   and at the root (over a (replicate, shard) mesh with ``--replicate N``: HSDP);
   Before that it checks its GPU (NVML; "not available" on CPU): a GPU that failed for good
   makes its node leave the job (exit code 7) instead of restarting in place (gpu_health.py);
4. resumes from the newest *valid* checkpoint, if any (corrupt ones are reported and skipped);
5. trains: every step consumes a fixed global batch, checks loss and gradient norm for
   non-finite values on every rank before the optimizer step, and checkpoints every N steps;
   when its node's cloud metadata announces a preemption, every rank joins an emergency
   checkpoint of the last completed step and leaves (exit code 5, see preemption.py); an
   out-of-memory step is retried once after freeing what can be freed (then exit code 8); an
   accelerator error on a GPU the health check finds unhealthy makes the node leave (code 7);
   the bar's monitors watch for what raises no error (stragglers in health.py; with
   ``--replicate N`` HSDP replicas compared by fingerprint, and loss and grad-norm spikes, in
   monitors.py), each reported as an ``anomaly``;
6. at the end, hashes the full unsharded state into ``final_digest``.

Every milestone is an event, written with faultlab's public emitter (faultlab.runtime.events,
integration level 2). The rest of faultlab a rank uses is its runtime agent
(``faultlab.runtime``: attach once, tell it each step and when each step is done), through which
in-rank faults strike — a NaN gradient, a slow or stuck collective — and at whose step gates a
fault injected from outside meets the job at its step; outside faultlab both do nothing.
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
    runnable_wait_s,
)
from reference_trainer.model import GPT
from reference_trainer.monitors import BarMonitors, finding_line
from reference_trainer.preemption import (
    PreemptedMidStep,
    PreemptionWatcher,
    install_block_checks,
    resolve_endpoint,
)


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


def main(argv: list[str] | None = None) -> int:
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

    def on_watchdog(idle_s: float) -> None:
        hung = watchdog.overdue  # a save in flight past its deadline: name it
        if hung is not None:
            events.emit("anomaly", what="checkpoint_save_hung", step=hung.get("step"),
                        path=hung.get("path"), seconds=hung.get("seconds"), action="exit")
        else:
            events.emit("anomaly", what="watchdog", step=progress["step"],
                        idle_s=round(idle_s, 3), action="exit")
        events.emit("exit", reason="watchdog", code=EXIT_CODES["watchdog"])

    # Started by train() once the process group is up: until then a rank waits for its peers'
    # start-up (their imports, the rendezvous), which a slow or loaded machine stretches by
    # seconds, and which --pg-timeout-s bounds. A 5 s step watchdog armed from the first line
    # fired there on a machine half as fast, and every restart met it again.
    watchdog = Watchdog(cfg.watchdog_s, on_watchdog)
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
    t_created = _process_start_time()
    agent_pid = os.getppid()  # torchrun's agent: the workers are its children
    watcher = _start_preemption_watcher(cfg, events, progress)
    # Every (re)start checks the GPU first: an Xid 79 or an uncorrectable ECC error does not
    # heal by restarting the process, and restarting in place would burn every restart. The
    # check runs beside the process-group set-up (importing pynvml alone takes 40-80 ms here).
    checked: list[GpuHealth] = []
    checker = threading.Thread(target=_check_gpu_into, args=(local_rank, checked),
                               name="gpu-health", daemon=True)
    checker.start()

    # --- device, determinism, process groups ------------------------------------------------
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
    t_pg_ready = time.time()
    watchdog.start()

    # --- model, optimizer, schedule, data ---------------------------------------------------
    mcfg = cfg.model
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if use_cuda else MixedPrecisionPolicy()
    model = build_sharded_model(mcfg, seed=cfg.seed, mesh=mesh, mp_policy=mp)
    if use_cuda:
        model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95),
                                  weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    rt = faultlab_runtime.attach(model, optimizer, emit=events.emit)
    data = MarkovTokens(vocab_size=mcfg.vocab_size, seq_len=mcfg.seq_len, seed=cfg.seed)
    sampler = GlobalBatchSampler(global_batch=cfg.global_batch, rank=rank, world_size=world_size)
    tokens_per_step = cfg.global_batch * mcfg.seq_len

    # --- resume -----------------------------------------------------------------------------
    ckpt = CheckpointManager(cfg.run_dir / "checkpoints", keep=cfg.keep_checkpoints,
                             async_save=cfg.async_checkpoint, rank=rank, world_size=world_size,
                             process_group=ckpt_pg, emit=events.emit, beat=watchdog.beat,
                             timeout_s=cfg.checkpoint_timeout_s or cfg.watchdog_s,
                             arm=watchdog.arm, disarm=watchdog.disarm)

    def resume() -> int:
        loaded = ckpt.load_latest(model, optimizer, on_none_valid=cfg.on_no_valid_checkpoint)
        if loaded is None:
            seed_rank_rng(cfg.seed, 0, rank)
            sampler.consumed = 0
            return 0
        result, state = loaded
        if state["config"]["preset"] != cfg.preset:
            raise CheckpointError(f"{result.path} holds preset {state['config']['preset']!r}, "
                                  f"this run is {cfg.preset!r}; use a new --run-dir")
        sampler.load_state_dict(state["sampler"])
        scheduler.load_state_dict(state["scheduler"])
        return int(state["step"])

    step = resume()
    progress["step"] = step
    # The bar's silent-failure monitors (monitors.py): they read, never write, and ride the
    # step's stats all-reduce.
    monitors = BarMonitors(world_size, rank, replicate=cfg.replicate,
                           spike_factor=cfg.spike_factor)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    last_step = cfg.stop_after or cfg.steps
    events.emit("start", resumed_from_step=step, preset=cfg.preset,
                num_params=mcfg.num_params(), device=str(device), backend=backend,
                global_batch=cfg.global_batch, steps=cfg.steps, local_rank=local_rank,
                t_process_created=t_created, t_main=t_main, t_pg_ready=t_pg_ready,
                t_ready=time.time(), monitors=monitors.describe())
    if rank == 0 and restart == 0 and not monitors.fingerprint.active:
        print(f"reference_trainer: {monitors.describe()['fingerprint']}", file=sys.stderr,
              flush=True)
    watchdog.beat()

    def trainer_state(s: int) -> dict[str, Any]:
        return {"step": s, "sampler": sampler.state_dict(), "scheduler": scheduler.state_dict(),
                "config": cfg.to_json(), "torch_version": torch.__version__,
                "world_size": world_size}

    def leave_for_preemption(at_step: int, rng: dict[str, Any], caught: str) -> int:
        """Every rank saw the notice in the same collective: commit the last completed step,
        then leave. The preempted node's agent is told to go (SIGTERM makes torchrun's agent
        stop its workers and exit *without* closing the rendezvous); the other nodes' agents
        restart their workers, which re-rendezvous without it and resume from this save."""
        assert watcher is not None
        ckpt.wait()
        if at_step == ckpt.committed_step:  # already committed: the emergency checkpoint
            if rank == 0:
                latest = list_checkpoints(ckpt.root)[0][1]
                events.emit("checkpoint_saved", step=at_step, path=str(latest), seconds=0.0,
                            stall_s=0.0, emergency=True, reused=True, **{"async": False})
        else:
            ckpt.save(at_step, model, optimizer, trainer_state(at_step), force_sync=True,
                      rng=rng, emergency=True)
        mine = watcher.noticed
        events.emit("exit", reason="preempted" if mine else "peer_preempted",
                    code=EXIT_CODES["preempted"], step=at_step, caught=caught)
        if mine:
            watcher.acknowledge()
            # Only while the agent is still our parent: an agent that took a second SIGTERM
            # (Slurm's requeue after the grace time) dies without waiting for its workers,
            # and the orphan's parent is then the node's init (tini in the test cluster's
            # containers, which would pass the signal on to slurmd and take the node down).
            if "TORCHELASTIC_RESTART_COUNT" in os.environ and os.getppid() == agent_pid:
                os.kill(agent_pid, signal.SIGTERM)
        return EXIT_CODES["preempted"]

    # --- the loop ---------------------------------------------------------------------------
    fired: set[tuple[int, int | None]] = set()
    rollbacks = 0
    rng_at_start: dict[str, Any] = {}
    stragglers = StragglerDetector(world_size, threshold_s=cfg.straggler_threshold_s,
                                   num_steps=cfg.straggler_steps)
    wait_s = 0.0  # this rank's wait in the previous step's stats all-reduce
    wait_mark = runnable_wait_s()  # its wait for a CPU until the end of that all-reduce
    # A slow link slows every rank alike (each waits in the same collectives), so waits name
    # no one; a run of slow steps then triggers a timed point-to-point probe of the links.
    slow_steps = SlowStepTracker(factor=cfg.link_probe_slowdown, num_steps=cfg.straggler_steps)
    # A slow GPU slows its own compute, which waits in collectives do not show (health.py).
    slow_gpus = ComputeStragglerDetector(world_size, ratio=cfg.compute_straggler_ratio,
                                         threshold_s=cfg.straggler_threshold_s,
                                         num_steps=cfg.straggler_steps)
    oom_retried_step = 0  # an out-of-memory step is retried once
    if watcher is not None:
        install_block_checks(model.blocks, watcher, device)
    model.train()
    while step < last_step:
        ckpt.poll()
        s = step + 1
        t0 = time.monotonic()
        if watcher is not None:
            # A notice is checked at every block boundary (install_block_checks; the first
            # block's comes right after this) and with the step's stats. The RNG state is kept
            # so that a save made mid-step stores the state of the step's start.
            rng_at_start = capture_rng()
        rt.step(s)
        ids = sampler.local_ids(s)
        x, y = (t.to(device, non_blocking=True) for t in data.batch(ids))
        try:
            t_forward, waited = time.monotonic(), runnable_wait_s()
            out = model(x, y)
            # its compute, not the time it waited for a CPU (health.runnable_wait_s); and how
            # long it waited for a CPU since the last stats all-reduce, which its peers may
            # have spent waiting for it in the forward's all-gathers
            waited_now = runnable_wait_s()
            forward_s = time.monotonic() - t_forward - (waited_now - waited)
            cpu_wait_s = waited_now - wait_mark
            loss_sum = rt.loss(out)
            for key in ((s, rank), (s, None)):
                if key in cfg.inject_nonfinite and key not in fired:
                    fired.add(key)
                    loss_sum = loss_sum * float("nan")
            # FSDP2 averages gradients over the ranks; scale so the result is the gradient of
            # the mean over the *global* batch even when the slices are uneven.
            (loss_sum * (world_size / tokens_per_step)).backward()
        except PreemptedMidStep:  # every rank, at the same block: abandon step s
            for module in model.modules():
                if isinstance(module, FSDPModule):
                    module.reshard()  # the blocks in flight held unsharded parameters
            optimizer.zero_grad(set_to_none=True)
            return leave_for_preemption(step, rng_at_start, "block boundary")
        except torch.OutOfMemoryError as e:
            # Free what can be freed (gradients, unsharded parameters, cached blocks) and try
            # the step once more; a second failure is not transient: leave, naming it.
            error = str(e).splitlines()[0][:500]
            for module in model.modules():
                if isinstance(module, FSDPModule):
                    module.reshard()
            optimizer.zero_grad(set_to_none=True)
            gc.collect()
            if use_cuda:
                torch.cuda.empty_cache()
            if oom_retried_step != s:
                oom_retried_step = s
                events.emit("anomaly", what="gpu_oom", step=s, action="retry", error=error)
                continue
            events.emit("anomaly", what="gpu_oom", step=s, action="exit", error=error)
            events.emit("exit", reason="gpu_oom", code=EXIT_CODES["gpu_oom"], step=s,
                        error=f"torch.OutOfMemoryError: {error}")
            print(f"reference_trainer: rank {rank}: out of memory at step {s} twice: {error}",
                  file=sys.stderr, flush=True)
            return EXIT_CODES["gpu_oom"]
        except Exception as e:
            if not is_accelerator_error(e):
                raise
            # The device failed. Restart in place only if its GPU may still be fit.
            health = check_gpu(local_rank)
            events.emit("anomaly", what="accelerator_error", step=s, gpu_health=health.status,
                        reasons=health.reasons, error=f"{type(e).__name__}: {e}"[:500],
                        action="leave_job" if health.unhealthy else "restart")
            if not health.unhealthy:
                raise
            return _leave_for_unhealthy_gpu(events, health, [rank], agent_pid, step=step,
                                            when=f"step {s}")
        grad_norm = clip_grad_norm(model, cfg.grad_clip)
        # One all-reduce: the global loss, the count of ranks that saw a non-finite loss, of
        # ranks whose node received a preemption notice, and every rank's wait in the previous
        # step's all-reduce (straggler detection). The wait is timed from the moment this rank
        # has issued the collective: a rank that issues late waits for nobody.
        # Flagged in this very step (not the next): every rank learns it from these stats.
        slow_flag = 1.0 if slow_steps.update(time.monotonic() - t0) else 0.0
        stats = torch.zeros(4 + 3 * world_size + monitors.width, dtype=torch.float64)
        stats[0] = float(loss_sum.detach())
        stats[1] = 0.0 if torch.isfinite(loss_sum) else 1.0
        stats[2] = 1.0 if watcher is not None and watcher.noticed else 0.0
        stats[3 + rank] = wait_s
        stats[3 + world_size] = slow_flag
        stats[4 + world_size + rank] = forward_s
        stats[4 + 2 * world_size + rank] = cpu_wait_s
        local_tokens = len(ids) * mcfg.seq_len
        monitors.fill(stats[4 + 3 * world_size:], model.parameters(),
                      float(loss_sum.detach()) / local_tokens if local_tokens else math.nan)
        stats = stats.to(device)
        work = dist.all_reduce(stats, async_op=True)
        t_issued = time.monotonic()
        work.wait()
        stats = stats.cpu()
        wait_s = time.monotonic() - t_issued
        wait_mark = runnable_wait_s()
        loss = float(stats[0]) / tokens_per_step
        bad_ranks = int(stats[1])
        # Every rank sees the same sums, so every rank takes the same decision.
        probe = stats[3 + world_size] > 0 and world_size > 1
        if s > 1:
            named = stragglers.update(stats[3:3 + world_size].tolist())
            if named is not None and rank == 0:
                events.emit("anomaly", what="straggler", step=s, action="report", **named)
            probe = probe and stragglers.named is None
            slow_gpu = slow_gpus.update(stats[4 + world_size:4 + 2 * world_size].tolist(),
                                        stats[4 + 2 * world_size:4 + 3 * world_size].tolist())
            if slow_gpu is not None and rank == 0:
                events.emit("anomaly", what="straggler", step=s, action="report", **slow_gpu)
        for finding in monitors.check(s, stats[4 + 3 * world_size:].tolist(), loss=loss,
                                      grad_norm=grad_norm):
            if rank == 0:
                events.emit("anomaly", action="report", **finding)
                print(f"reference_trainer: {finding_line(finding)}", file=sys.stderr,
                      flush=True)
        if stats[2] > 0:  # step s is abandoned before its optimizer step: save step s - 1
            optimizer.zero_grad(set_to_none=True)
            return leave_for_preemption(step, rng_at_start, "after backward")
        if bad_ranks or not math.isfinite(grad_norm):
            optimizer.zero_grad(set_to_none=True)
            what = "nonfinite_loss" if bad_ranks else "nonfinite_grad_norm"
            policy = cfg.nonfinite_policy
            if policy == "rollback" and rollbacks >= cfg.max_rollbacks:
                policy, why = "abort", f"{rollbacks} rollbacks already; replaying will not help"
            elif policy == "rollback" and not list_checkpoints(ckpt.root):
                policy, why = "abort", "no checkpoint to roll back to yet"
            else:
                why = None
            events.emit("anomaly", what=what, step=s, loss=loss, grad_norm=grad_norm,
                        action=policy, num_ranks_nonfinite=bad_ranks,
                        **({"why": why} if why else {}))
            if policy == "rollback":
                rollbacks += 1
                step = progress["step"] = resume()
                continue
            if policy == "skip":
                sampler.advance(s)
                scheduler.step()
                step = progress["step"] = s
                events.emit("step", step=s, loss=loss, grad_norm=grad_norm, skipped=True,
                            samples=[sampler.global_ids(s).start, sampler.global_ids(s).stop],
                            local_samples=[ids.start, ids.stop])
                watchdog.beat()
                rt.step_done(s, beat=watchdog.beat)
                continue
            events.emit("exit", reason="nonfinite_abort", code=EXIT_CODES["nonfinite_abort"],
                        step=s)
            return EXIT_CODES["nonfinite_abort"]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        sampler.advance(s)
        step = progress["step"] = s
        if cfg.min_step_time_s:
            time.sleep(max(0.0, cfg.min_step_time_s - (time.monotonic() - t0)))
        ids_global = sampler.global_ids(s)
        events.emit("step", step=s, loss=loss, grad_norm=grad_norm,
                    lr=scheduler.get_last_lr()[0], samples=[ids_global.start, ids_global.stop],
                    local_samples=[ids.start, ids.stop],
                    step_time_s=round(time.monotonic() - t0, 5), collective_wait_s=round(wait_s, 5),
                    cpu_wait_s=round(cpu_wait_s, 5))
        watchdog.beat()
        # A fault faultlab injects from outside "at step s" (a kill, a preemption, a machine
        # lost) lands here, before step s's checkpoint: the step gate (faultlab.runtime.gates).
        rt.step_done(s, beat=watchdog.beat)
        if s % cfg.checkpoint_every == 0 or s == last_step:
            # A failed save is reported and quarantined inside; training goes on and the next
            # interval (or the end) tries again.
            ckpt.save(s, model, optimizer, trainer_state(s), force_sync=(s == last_step))
            watchdog.beat()
        if probe:
            t_probe = time.monotonic()
            transfers = probe_links(rank, world_size, device, cfg.link_probe_bytes)
            found = attribute_slow_links(transfers, factor=cfg.link_probe_slowdown)
            watchdog.beat()
            if rank == 0:
                events.emit("link_probe", step=s, bytes=cfg.link_probe_bytes,
                            seconds=round(time.monotonic() - t_probe, 4),
                            baseline_step_s=slow_steps.baseline_s,
                            transfers=[[a, b, round(t, 4)] for a, b, t in transfers],
                            culprit=None if found is None else found["straggler_rank"])
                if found is not None:
                    events.emit("anomaly", what="straggler", step=s, action="report",
                                cause="slow_link", **found)

    # --- the end ----------------------------------------------------------------------------
    if watcher is not None:
        watcher.stop()
    ckpt.wait()
    if ckpt.committed_step != step and not ckpt.save(step, model, optimizer,
                                                     trainer_state(step), force_sync=True):
        # The last step's save failed, and so did this retry: the steps since the last
        # committed checkpoint are not durable. Leaving with an error lets the agent restart
        # the group, which resumes from that checkpoint and saves again at the end.
        events.emit("exit", reason="checkpoint_save_failed",
                    code=EXIT_CODES["checkpoint_save_failed"], step=step,
                    committed_step=ckpt.committed_step)
        dist.destroy_process_group()
        return EXIT_CODES["checkpoint_save_failed"]
    if step < cfg.steps:
        events.emit("exit", reason="stopped", code=0, step=step)
        dist.destroy_process_group()
        return 0
    digest = state_digest(model, optimizer, rank)
    if digest is not None:
        events.emit("final_digest", step=step, **digest)
    events.emit("exit", reason="completed", code=0, step=step)
    dist.destroy_process_group()
    return 0


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
