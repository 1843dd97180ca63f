"""Synthetic but realistic runs: event streams, journals and suite folders, without a job.

The timings follow what the reference trainer emits on the 2-core machine (a SIGKILLed rank
writes nothing more; its peer exits with an error within milliseconds; the agents spawn new
workers, which import torch for about 1.8 s, initialise the process group, load the
checkpoint and replay), so the report is built from the same shapes a real run leaves.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faultlab.observe import FaultRecord, compute_metrics
from faultlab.report.journal import write_journal
from faultlab.report.prelaunch import SuiteRun
from tests.fault_records import declared

T0 = 1_795_000_000.0
DIGEST = "ab" * 32
PLAN = {"num_gpus": 1024, "gpus_per_node": 8, "mtbf_per_gpu_h": 50000, "mtbf_per_node_h": None,
        "step_time_s": 4.0, "checkpoint_size_gb": 1120, "storage_bandwidth_gb_s": 50,
        "run_days": 30, "gpu_hour_cost_usd": 2.5}
ENVIRONMENT = {"faultlab": "0.1.0", "torch": "2.13.0+cpu", "python": "3.11.7",
               "platform": "Linux-x86_64", "host": "ci", "cpu_count": 2, "git_sha": "f" * 40,
               "cuda": False, "cuda_runtime": "not available (CPU build of torch)",
               "nccl": "not available (this torch build has no NCCL)",
               "driver": "not available (NVML: NVML Shared Library Not Found)", "gpus": []}


def loss_at(step: int) -> float:
    return 6.3 * math.exp(-step / 40) + 0.05 * math.sin(step)


@dataclass
class Timing:
    """Seconds of each part of a restart (rank_kill on 2 cores, roughly)."""

    step_s: float = 0.2
    save_s: float = 0.25
    detect_s: float = 0.05
    teardown_s: float = 0.02
    spawn_s: float = 0.4
    import_s: float = 1.8
    pg_s: float = 0.02
    load_s: float = 1.2


@dataclass
class Job:
    """An event stream being written, one process at a time."""

    world_size: int = 2
    t: float = T0
    events: list[dict[str, Any]] = field(default_factory=list)
    next_pid: int = 1000

    def emit(self, t: float, kind: str, rank: int, pid: int, restart: int, **fields: Any) -> None:
        self.events.append({"t": t, "kind": kind, "rank": rank, "world_size": self.world_size,
                            "pid": pid, "restart": restart, "node": f"node{rank}", **fields})

    def start(self, restart: int, resumed_from: int, created_t: float,
              timing: Timing) -> list[int]:
        pids = list(range(self.next_pid, self.next_pid + self.world_size))
        self.next_pid += self.world_size
        main_t = created_t + timing.import_s
        pg_t = main_t + timing.pg_s
        ready_t = pg_t + timing.load_s
        for rank, pid in enumerate(pids):
            if resumed_from:
                self.emit(ready_t - 0.001, "checkpoint_loaded", rank, pid, restart,
                          step=resumed_from, path=f"ckpt/step_{resumed_from:08d}",
                          fell_back_from=[], seconds=0.4)
            self.emit(ready_t, "start", rank, pid, restart, resumed_from_step=resumed_from,
                      t_process_created=created_t, t_main=main_t, t_pg_ready=pg_t,
                      t_ready=ready_t)
        self.t = ready_t
        return pids

    def train(self, pids: list[int], restart: int, first: int, last: int, timing: Timing,
              checkpoint_every: int = 10) -> None:
        for step in range(first, last + 1):
            self.t += timing.step_s
            for rank, pid in enumerate(pids):
                first = 12 * (step - 1)
                self.emit(self.t + 0.001 * rank, "step", rank, pid, restart, step=step,
                          loss=loss_at(step), step_time_s=timing.step_s,
                          samples=[first, first + 12],
                          local_samples=[first + 6 * rank, first + 6 * rank + 6])
            if step % checkpoint_every == 0:
                self.t += timing.save_s
                self.emit(self.t, "checkpoint_saved", 0, pids[0], restart, step=step,
                          path=f"ckpt/step_{step:08d}", seconds=timing.save_s,
                          stall_s=timing.save_s, bytes=17_000_000, **{"async": False})

    def finish(self, pids: list[int], restart: int, step: int) -> None:
        self.t += 0.3
        self.emit(self.t, "final_digest", 0, pids[0], restart, step=step, digest=DIGEST)
        for rank, pid in enumerate(pids):
            self.emit(self.t + 0.001, "exit", rank, pid, restart, reason="completed", code=0,
                      step=step)


def golden_events(steps: int = 40, timing: Timing | None = None) -> list[dict[str, Any]]:
    timing = timing or Timing()
    job = Job()
    pids = job.start(0, 0, T0 - 2.5, timing)
    job.train(pids, 0, 1, steps, timing)
    job.finish(pids, 0, steps)
    return job.events


def rank_kill_events(fault_step: int = 15, steps: int = 40, timing: Timing | None = None
                     ) -> tuple[list[dict[str, Any]], float]:
    """A 2-rank job whose rank 1 is SIGKILLed after ``fault_step``: the events and ``T``."""
    timing = timing or Timing()
    job = Job()
    pids = job.start(0, 0, T0 - 2.5, timing)
    job.train(pids, 0, 1, fault_step, timing)
    injected_t = job.t + 0.01
    # rank 1 dies without a word; rank 0 notices at its next collective and exits
    job.emit(injected_t + timing.detect_s, "exit", 0, pids[0], 0, reason="error", code=1,
             error="RuntimeError: Connection reset by peer")
    created = injected_t + timing.detect_s + timing.teardown_s + timing.spawn_s
    resumed = (fault_step // 10) * 10
    pids = job.start(1, resumed, created, timing)
    job.train(pids, 1, resumed + 1, steps, timing)
    job.finish(pids, 1, steps)
    return job.events, injected_t


def write_events(job_dir: Path, events: list[dict[str, Any]]) -> None:
    by_pid: dict[Any, list[dict[str, Any]]] = {}
    for e in events:
        by_pid.setdefault(e["pid"], []).append(e)
    (job_dir / "events").mkdir(parents=True, exist_ok=True)
    for pid, records in by_pid.items():
        first = records[0]
        name = f"{first['node']}-rank{first['rank']}-restart{first['restart']}-pid{pid}.jsonl"
        (job_dir / "events" / name).write_text("".join(json.dumps(r) + "\n" for r in records))


def write_checkpoints(job_dir: Path, steps: list[int], size: int = 17_000_000) -> None:
    for step in steps:
        d = job_dir / "checkpoints" / f"step_{step:08d}"
        d.mkdir(parents=True)
        (d / "__0_0.distcp").write_bytes(b"\0" * (size - 1000))
        (d / "manifest.json").write_bytes(b"{" + b" " * 998 + b"}")


def write_run(run_folder: Path, name: str, *, fault_type: str = "rank_kill",
              golden_dir: Path | None = None, passed: bool | str = True,
              timing: Timing | None = None) -> dict[str, Any]:
    """A run folder like ``run_experiment`` leaves: journal.json, report.md, job/.
    ``passed="inconclusive"``: every SLA held, and bitwise could not be measured."""
    verdict = passed if isinstance(passed, str) else "pass" if passed else "fail"
    passed = passed is not False
    events, injected_t = rank_kill_events(timing=timing)
    job_dir = run_folder / "job"
    write_events(job_dir, events)
    write_checkpoints(job_dir, [20, 30, 40])
    fault = FaultRecord(id=f"{fault_type}-0", type=fault_type,
                        capabilities=declared(fault_type), injected_t=injected_t,
                        target="rank 1", details={"signal": "SIGKILL"})
    metrics = compute_metrics(events, [fault])
    slas = [
        {"name": f"fault_injected[{fault.id}]", "bound": True, "measured": True,
         "passed": True, "note": ""},
        {"name": "completes", "bound": True, "measured": metrics.completes, "passed": True,
         "note": ""},
        {"name": "recovery_time_s", "bound": 40.0 if passed else 1.0,
         "measured": metrics.recovery_time_s, "passed": passed, "note": ""},
        {"name": "lost_steps", "bound": 10, "measured": metrics.lost_steps, "passed": True,
         "note": ""},
    ]
    if verdict == "inconclusive":
        slas.append({"name": "bitwise_equal_to_golden", "bound": True, "measured": None,
                     "passed": False, "inconclusive": True, "covered_by": None,
                     "result": "inconclusive",
                     "note": "not measured: two fault-free runs differ from step 2"})
    golden = None
    if golden_dir is not None:
        g_events = golden_events()
        write_events(golden_dir, g_events)
        golden = {"key": "k" * 20, "digest": DIGEST, "cached": True, "wall_s": 12.0,
                  "run_dir": str(golden_dir),
                  "losses": {str(s): loss_at(s) for s in range(1, 41)}}
    journal = {
        "verdict": verdict, "slas": slas, "metrics": metrics.to_dict(),
        "faults": [{**fault.to_dict(), "error": None}],
        "experiment": {"name": name, "description": f"{name}: a synthetic run.",
                       "file": f"experiments/{name}.yaml", "seed": 0,
                       "document": {"name": name, "faults": [{"type": fault_type}]}},
        "golden": golden,
        "run": {"started_t": T0 - 5, "ended_t": events[-1]["t"] + 1, "wall_s": 30.0,
                "timed_out": False, "interrupted": False, "error": None,
                "job_dir": str(job_dir), "exit_codes": {"node0": 0, "node1": 0}},
        "environment": ENVIRONMENT,
    }
    run_folder.mkdir(parents=True, exist_ok=True)
    write_journal(run_folder, journal)
    return journal


def write_suite(folder: Path, members: list[tuple[str, str, bool | str]], *,
                not_run: tuple[str, ...] = (), plan: dict[str, Any] | None = None) -> SuiteRun:
    """A finished suite run in ``folder``: ``members`` are (name, fault type, passed: a
    bool, or ``"inconclusive"``);
    ``not_run`` names experiments listed but never run. The report is written."""
    listed = [(name, ftype) for name, ftype, _ in members] + [(n, "rank_kill") for n in not_run]
    run = SuiteRun(folder, suite_file=Path("experiments/prelaunch.yaml"),
                   suite={"name": "prelaunch", "description": "A synthetic pre-launch suite.",
                          "experiments": [f"{n}.yaml" for n, _ in listed],
                          "plan": plan or PLAN},
                   experiments=[(Path(f"experiments/{n}.yaml"), n, [t]) for n, t in listed],
                   environment=ENVIRONMENT)
    for i, (name, ftype, passed) in enumerate(members):
        run_folder = run.runs_dir / f"{name}-20261121-120000"
        journal = write_run(run_folder, name, fault_type=ftype, passed=passed,
                            golden_dir=folder / ".golden" / name if i % 2 == 0 else None)
        run.ran(i, run_folder, journal["verdict"])
    run.finish(interrupted=bool(not_run))
    return run


def write_campaign_run(run_folder: Path, name: str, *, passed: bool = True) -> dict[str, Any]:
    """A campaign's run folder like ``run_campaign`` leaves it: the experiment's folder, its
    journal with the ``campaign`` object (scored by the real scorer) and its own report.html.
    One arrival: rank 1 SIGKILLed after step 15."""
    from faultlab.engine.campaign import _plot_data
    from faultlab.observe.campaign import score_campaign
    from faultlab.report.html import render_campaign_html

    journal = write_run(run_folder, name, passed=passed)
    fault = FaultRecord(id="c000-rank_kill", type="rank_kill",
                        injected_t=journal["faults"][0]["injected_t"], target="rank 1")
    events = json_events(Path(journal["run"]["job_dir"]))
    score = score_campaign(events, [fault], procs_per_node=1, world_size=2, mtbf_s=20,
                           checkpoint_every=10, golden_events=golden_events(), scheduled=2)
    journal["faults"] = [{**fault.to_dict(), "error": None}]
    journal["slas"] = [s for s in journal["slas"] if not s["name"].startswith("fault_")] + [
        {"name": "ettr", "bound": 0.3, "measured": score.ettr, "passed": passed, "note": ""}]
    journal["campaign"] = {"score": score.to_dict(), **_plot_data(events, [fault], score)}
    write_journal(run_folder, journal)
    (run_folder / "report.html").write_text(render_campaign_html(journal))
    return journal


def json_events(job_dir: Path) -> list[dict[str, Any]]:
    from faultlab.runtime.events import read_events

    return read_events(job_dir / "events")
