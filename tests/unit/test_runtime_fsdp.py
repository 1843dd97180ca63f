"""The runtime agent against a real 2-process gloo FSDP2 job (one launch for every scenario).

Each rank runs ``_worker`` below (this file is also the worker's script): a tiny GPT sharded
per block and at the root, the agent attached *after* the model is built, then a fixed script
of steps, each exercising one fault, with results written to ``RUN_DIR/result-rank{r}.json``.
The test process plays faultlab: it writes the launch plan, and at step 9 injects and then undoes
a partition through the live control channel. Steps:

1. no fault: count the intercepted collectives of one FSDP2 step
2. grad_nan on rank 1 (blocks.0.*), then the step replayed as after a rollback
3. loss_spike x1e4 on rank 0 and one weight bit flipped on rank 0
4-6. baseline timing; 7: collective_delay 100 ms before each all-gather on rank 0
8. collective_error on the trainer's all_reduce (both ranks)
9. live collective_partition (hang) on both ranks, undone by the test after ~0.3 s
10. planned collective_partition (error): FSDP2's first all-gather raises
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from runtime_entries import entries, entry

HERE = Path(__file__).resolve().parent
DELAY_MS = 100.0
HANG_S = 0.3
PLAN = [
    {"id": "nan", "type": "grad_nan", "ranks": [1], "steps": [2],
     "params": {"param_glob": "blocks.0.*"}},
    {"id": "spike", "type": "loss_spike", "ranks": [0], "steps": [3], "params": {"scale": 1e4}},
    {"id": "flip", "type": "weight_bitflip", "ranks": [0], "steps": [3],
     "params": {"param_glob": "blocks.1.*weight", "bit_index": 30, "seed": 3}},
    {"id": "delay", "type": "collective_delay", "ranks": [0], "steps": [7],
     "params": {"delay_ms": DELAY_MS, "ops": ["all_gather_single"]}},
    {"id": "err", "type": "collective_error", "ranks": None, "steps": [8],
     "params": {"ops": ["all_reduce"]}},
    {"id": "part-err", "type": "collective_partition", "ranks": None, "steps": [10],
     "params": {"groups": [[0], [1]], "mode": "error"}},
]
LIVE_PARTITION = {"id": "live-part", "type": "collective_partition",
                  "params": {"groups": [[0], [1]], "mode": "hang"}}


# --- the worker (one per rank) ------------------------------------------------------------------

def _worker(run_dir: Path) -> None:  # pragma: no cover - runs in the rank processes
    t_start = time.monotonic()

    def log(what: str) -> None:  # the test prints the last lines of this on failure
        print(f"[{time.monotonic() - t_start:6.2f} s] {what}", flush=True)

    import torch
    import torch.distributed as dist
    from fsdp_helpers import TINY_MODEL, build_fsdp
    from torch.distributed.device_mesh import init_device_mesh

    from faultlab import runtime
    from faultlab.runtime import interposer
    from faultlab.runtime.actions.numeric import local_shard

    log("imported")
    torch.set_num_threads(1)  # two ranks on two cores: more threads only spin against each other
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    model, opt = build_fsdp(mesh, cfg=TINY_MODEL)
    log("model built")
    rt = runtime.attach(model, opt)  # after fully_shard: must still see every collective
    out: dict[str, Any] = {"fsdp_units": 1 + len(model.blocks)}

    def run(s: int, name: str) -> dict[str, Any]:
        before = interposer.counts()
        rt.step(s)
        g = torch.Generator().manual_seed(s)
        x = torch.randint(0, TINY_MODEL.vocab_size, (4, TINY_MODEL.seq_len), generator=g)
        y = torch.randint(0, TINY_MODEL.vocab_size, (4, TINY_MODEL.seq_len), generator=g)
        t0 = time.perf_counter()
        rec: dict[str, Any] = {}
        try:
            raw = model(x, y)
            loss = rt.loss(raw)
            rec["loss_ratio"] = float(loss.detach() / raw.detach())
            loss.backward()
            rec["nonfinite_grads"] = sorted(
                n for n, p in model.named_parameters()
                if p.grad is not None and not torch.isfinite(local_shard(p.grad)).all())
            # The reference trainer's check: a global norm over DTensor shards (a collective).
            norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
            rec["grad_norm"] = str(float(norm.full_tensor()))
            stats = torch.tensor([float(loss.detach())])
            dist.all_reduce(stats)
            if rec["grad_norm"] not in ("nan", "inf"):
                opt.step()
        except RuntimeError as e:
            rec["error"] = f"{type(e).__name__}: {e}"
        opt.zero_grad(set_to_none=True)
        rec["time_s"] = time.perf_counter() - t0
        after = interposer.counts()
        rec["calls"] = {op: n - before.get(op, 0) for op, n in after.items()
                        if n != before.get(op, 0)}
        out[name] = rec
        log(f"step {s} ({name}): {rec}")
        return rec

    run(1, "s1")
    run(2, "s2")
    run(2, "s2_replay")
    snap = {n: local_shard(p.detach()).clone() for n, p in model.named_parameters()}
    rt.step(3)
    out["bits_changed"] = {n: int((local_shard(p.detach()) != snap[n]).sum())
                           for n, p in model.named_parameters()
                           if (local_shard(p.detach()) != snap[n]).any()}
    run(3, "s3")
    for s in (4, 5, 6):
        run(s, f"s{s}")
    run(7, "s7")
    run(8, "s8")
    (run_dir / f"ready9-rank{rank}").touch()
    deadline = time.monotonic() + 30
    while not (run_dir / "go9").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    run(9, "s9")
    run(10, "s10")
    out["status"] = rt.status()
    rt.close()
    (run_dir / f"result-rank{rank}.json").write_text(json.dumps(out, default=str))
    dist.destroy_process_group()


# --- the test side ------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _events(run_dir: Path) -> list[dict[str, Any]]:
    from faultlab.observe.stream import EventStream

    stream = EventStream(run_dir)
    stream.poll()
    return list(stream.events)


def _tails(logs: list[Path]) -> str:
    return "\n".join(f"--- {log.name} (last 50 lines) ---\n" +
                     "\n".join(log.read_text(errors="replace").splitlines()[-50:])
                     for log in logs)


def _wait(cond: Any, what: str, procs: list[subprocess.Popen[bytes]], logs: list[Path],
          timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            codes = [p.poll() for p in procs]
            raise AssertionError(f"gave up waiting for {what} (exit codes {codes})\n"
                                 f"{_tails(logs)}")
        time.sleep(0.02)


def _run_job(run_dir: Path) -> dict[str, Any]:
    from faultlab.runtime.client import new_secret, send, write_plan

    secret = new_secret()
    write_plan(run_dir / "plan.json", entries(PLAN))
    env = {**os.environ, "FAULTLAB_RUN_DIR": str(run_dir), "WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "FAULTLAB_RUNTIME_PLAN": str(run_dir / "plan.json"),
           "FAULTLAB_RUNTIME_SECRET": secret, "FAULTLAB_NODE": "node0",
           "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    logs = [run_dir / f"rank{r}.log" for r in (0, 1)]
    procs = [subprocess.Popen([sys.executable, __file__, str(run_dir)],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=open(logs[r], "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
             for r in (0, 1)]
    control: dict[str, Any] = {}
    try:
        _wait(lambda: all((run_dir / f"ready9-rank{r}").exists() for r in (0, 1)),
              "both ranks at step 9", procs, logs)
        control["bad_secret"] = send(run_dir, 0, "wrong", {"op": "ping"})
        live = entry(LIVE_PARTITION)
        control["inject"] = [send(run_dir, r, secret, {"op": "inject", "fault": live})
                             for r in (0, 1)]
        (run_dir / "go9").touch()
        _wait(lambda: {e["rank"] for e in _events(run_dir) if e["kind"] == "fault_injected"
                       and e["fault_id"] == "live-part"} == {0, 1}, "both ranks to hang", procs,
              logs)
        time.sleep(HANG_S)
        control["status_hung"] = send(run_dir, 1, secret, {"op": "status"})
        control["undo"] = [send(run_dir, r, secret, {"op": "undo", "id": "live-part"})
                           for r in (0, 1)]
        for p in procs:
            p.wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], _tails(logs)
    results = [json.loads((run_dir / f"result-rank{r}.json").read_text()) for r in (0, 1)]
    return {"run_dir": run_dir, "results": results, "control": control,
            "events": _events(run_dir)}


def _injected(job: dict[str, Any], fault_id: str) -> list[dict[str, Any]]:
    return [e for e in job["events"] if e["kind"] == "fault_injected" and e["fault_id"] == fault_id]


def _check_every_fsdp2_collective_is_intercepted(job: dict[str, Any]) -> None:
    for res in job["results"]:
        n = res["fsdp_units"]
        calls = res["s1"]["calls"]
        # Forward all-gathers every unit; backward re-gathers all but the root (not resharded
        # after forward); one reduce-scatter per unit; DTensor's grad-norm all-reduce is a
        # functional collective; the trainer's loss all-reduce is plain.
        assert calls == {"all_gather_single": 2 * n - 1, "reduce_scatter_single": n,
                         "funcol.all_reduce": 1, "all_reduce": 1}, calls
        # Ten full steps, then step 10's first all-gather (counted, then failed).
        assert res["status"]["counts"]["all_gather_single"] == 10 * (2 * n - 1) + 1


def _check_grad_nan_hits_the_victims_local_grads_only(job: dict[str, Any]) -> None:
    r0, r1 = job["results"]
    assert r0["s2"]["nonfinite_grads"] == []
    assert r1["s2"]["nonfinite_grads"] and all(n.startswith("blocks.0.")
                                               for n in r1["s2"]["nonfinite_grads"])
    # The global norm (a collective) carries it to every rank, so both skip the step.
    assert r0["s2"]["grad_norm"] == r1["s2"]["grad_norm"] == "nan"
    # Replayed after a rollback: not again.
    assert r1["s2_replay"]["nonfinite_grads"] == [] and r1["s2_replay"]["grad_norm"] != "nan"
    [event] = _injected(job, "nan")
    assert event["rank"] == 1 and event["step"] == 2 and event["type"] == "grad_nan"
    assert sorted(event["params"]) == r1["s2"]["nonfinite_grads"]
    assert list((job["run_dir"] / "runtime" / "fired").glob("nan-*-rank1-step2"))


def _check_loss_spike_and_weight_bitflip_hit_rank0_only(job: dict[str, Any]) -> None:
    r0, r1 = job["results"]
    assert r0["s3"]["loss_ratio"] == pytest.approx(1e4)
    assert r1["s3"]["loss_ratio"] == 1.0
    [flip] = _injected(job, "flip")
    [change] = flip["flips"]
    assert change["bit"] == 30 and change["param"].startswith("blocks.1.")
    assert r0["bits_changed"] == {change["param"]: 1} and r1["bits_changed"] == {}


def _check_delay_slows_the_step_by_the_injected_delay(job: dict[str, Any]) -> None:
    delayed_calls = job["results"][0]["s7"]["calls"]["all_gather_single"]
    expected = delayed_calls * DELAY_MS / 1000
    for res in job["results"]:  # rank 1 waits for rank 0 inside the all-gathers
        # Noise on a shared machine only adds time: compare with the fastest undelayed step.
        baseline = min(res[f"s{s}"]["time_s"] for s in (4, 5, 6))
        extra = res["s7"]["time_s"] - baseline
        # The upper bound catches a delay applied twice (per nested call, per rank), not load.
        assert 0.8 * expected <= extra <= 2 * expected + 1.0, (extra, expected)
    [event] = _injected(job, "delay")
    assert event["rank"] == 0 and event["op"] == "all_gather_single" and event["step"] == 7
    [ended] = [e for e in job["events"] if e["kind"] == "fault_undone" and e["fault_id"] == "delay"]
    assert ended["reason"] == "window_ended" and ended["num_struck"] == delayed_calls
    assert ended["total_delay_s"] == pytest.approx(expected)


def _check_collective_error_raises_dist_backend_error(job: dict[str, Any]) -> None:
    for res in job["results"]:
        assert res["s8"]["error"].startswith("DistBackendError: faultlab collective_error: "
                                             "Connection reset by peer"), res["s8"]
    assert {e["rank"] for e in _injected(job, "err")} == {0, 1}


def _check_live_partition_hangs_until_undone(job: dict[str, Any]) -> None:
    control = job["control"]
    assert control["bad_secret"] == {"ok": False, "error": "bad secret"}
    assert all(r["ok"] and r["applies_at"] == "now" for r in control["inject"])
    [active] = [a for a in control["status_hung"]["active"] if a["id"] == "live-part"]
    assert active["num_struck"] == 1 and not active["released"]
    assert all(r == {"ok": True, "id": "live-part", "undone": True} for r in control["undo"])
    for res in job["results"]:
        assert "error" not in res["s9"] and res["s9"]["time_s"] >= HANG_S
    undone = [e for e in job["events"] if e["kind"] == "fault_undone"
              and e["fault_id"] == "live-part"]
    assert {e["rank"] for e in undone} == {0, 1} and all(e["reason"] == "undo" for e in undone)


def _check_planned_partition_fails_cross_group_calls(job: dict[str, Any]) -> None:
    for res in job["results"]:
        assert "collective_partition" in res["s10"]["error"], res["s10"]
        assert res["s10"]["calls"] == {"all_gather_single": 1}
    assert {e["op"] for e in _injected(job, "part-err")} == {"all_gather_single"}

CHECKS = (
    _check_every_fsdp2_collective_is_intercepted,
    _check_grad_nan_hits_the_victims_local_grads_only,
    _check_loss_spike_and_weight_bitflip_hit_rank0_only,
    _check_delay_slows_the_step_by_the_injected_delay,
    _check_collective_error_raises_dist_backend_error,
    _check_live_partition_hangs_until_undone,
    _check_planned_partition_fails_cross_group_calls,
)


def test_fsdp2_job_under_runtime_faults(tmp_path: Path, subtests: pytest.Subtests) -> None:
    """One launch, every scenario; each check is a subtest (one test, so that pytest-xdist
    never launches the job twice)."""
    job = _run_job(tmp_path)
    for check in CHECKS:
        with subtests.test(check.__name__.removeprefix("_check_")):
            check(job)

if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
