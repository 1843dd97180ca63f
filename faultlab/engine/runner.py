"""Runs one experiment: golden → launch → watch → inject → undo → stop → judge → journal.

The loop polls the job's event stream every ``poll_s``; each fault fires when its trigger is
due, is recorded with its injection time and what it did, and a reversible fault is undone
after ``duration_s`` or as soon as the job reacts (``until: reaction``). The experiment ends
when every node's agent has exited or ``run.timeout_s`` passes.

Clean-up is unconditional: whatever ends the run — success, an SLA failure, an exception,
Ctrl-C or SIGTERM — every active fault is undone, every process of the job is continued and
reaped. If faultlab itself is killed, a guard process (``reaper.py``) does the same.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faultlab.engine.checkpoints import scan_checkpoints
from faultlab.engine.foreign import complete_events, log_losses
from faultlab.engine.golden import GoldenRun, golden_run
from faultlab.engine.hub import Hub, control_plane
from faultlab.engine.runtime_plan import RuntimeSetup
from faultlab.engine.shared_checkpoints import (
    SharedCheckpoint,
    SharedCheckpointStop,
    after_golden,
    before_golden,
    golden_resumed_message,
    own_checkpoints_check,
)
from faultlab.engine.storage import needs_storage_mount, storage_dir
from faultlab.engine.triggers import TriggerState
from faultlab.engine.view import NullView
from faultlab.errors import FaultError, FaultlabError, TargetError
from faultlab.faults import Fault, Victim
from faultlab.faults.gpu import GpuFault, gpu_node_env
from faultlab.faults.runtime_base import RuntimeFault
from faultlab.judge import SLAResult, judge
from faultlab.observe import FaultRecord, Metrics, compute_metrics
from faultlab.observe.checkpoint_origin import outside_saves
from faultlab.observe.launch_findings import abort_at_exit, launch_findings
from faultlab.observe.logs import node_logs
from faultlab.observe.metrics import withhold_unfinished
from faultlab.report.journal import environment, write_journal
from faultlab.spec import Experiment, resolve_selector
from faultlab.storage import StorageMount
from faultlab.targets import make_target, target_class
from faultlab.targets.local import LocalTarget

__all__ = ["RunResult", "landed_steps", "new_run_folder", "run_experiment"]


@dataclass
class RunResult:
    name: str
    verdict: str
    slas: list[SLAResult]
    metrics: Metrics
    faults: list[FaultRecord]
    run_folder: Path
    journal_path: Path
    timed_out: bool = False
    interrupted: bool = False
    error: str | None = None
    golden: GoldenRun | None = None

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def failures(self) -> list[SLAResult]:
        return [s for s in self.slas if not s.passed]


@dataclass
class _Active:
    index: int
    fault: Fault
    record: FaultRecord
    deadline: float | None
    until_reaction: bool
    known_pids: set[int] = field(default_factory=set)


LINGER_S = 10.0
"""How long nodes may keep running once every rank has finished training before the engine
stops them (a node cut off by a partition may wait minutes for its store connection to fail)."""


def _training_done(stream: Any) -> bool:
    """Has every rank of the newest incarnation exited with reason ``completed``?"""
    ranks = stream.current_ranks()
    completed = {e.get("rank"): e["t"] for e in stream.of_kind("exit")
                 if e.get("reason") == "completed"}
    return bool(ranks) and all(completed.get(r, 0.0) >= stream.latest_start(r)["t"]
                               for r in ranks)


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """SIGTERM behaves like Ctrl-C (so ``finally`` blocks run) while the experiment runs."""
    if sys.modules["threading"].current_thread() is not sys.modules["threading"].main_thread():
        yield
        return

    def on_term(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _shielded() -> Iterator[None]:
    """No second Ctrl-C/SIGTERM may cut the clean-up short."""
    if sys.modules["threading"].current_thread() is not sys.modules["threading"].main_thread():
        yield
        return
    saved = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in saved.items():
            signal.signal(s, h)


def new_run_folder(report_dir: Path, name: str) -> Path:
    """A fresh ``REPORT_DIR/<name>-<timestamp>[-N]`` folder (never one that exists)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        folder = report_dir / (f"{name}-{stamp}" + (f"-{n}" if n else ""))
        try:
            folder.mkdir(parents=True)
            return folder
        except FileExistsError:
            continue
    raise FaultlabError(f"cannot create a run folder under {report_dir}")


def run_experiment(exp: Experiment, *, source: Path | None = None,
                   report_dir: Path = Path("reports"), golden_cache: Path | None = None,
                   view: NullView | None = None, poll_s: float = 0.05) -> RunResult:
    """Run ``exp`` and judge it. Raises KeyboardInterrupt after clean-up if interrupted."""
    view = view or NullView()
    run_folder = new_run_folder(report_dir, exp.name)
    try:  # run_folder/job, or on the filesystem the target's nodes see, linked as job/
        job_dir = target_class(exp).prepare_run_dir(exp, run_folder)
    except TargetError as e:
        raise FaultlabError(f"{source or exp.name}: {e}") from None
    golden_cache = golden_cache or report_dir / ".golden"
    records: list[FaultRecord] = []
    active: list[_Active] = []
    timed_out = interrupted = False
    job_s: float | None = None  # how long the job ran, on the clock the triggers read
    error: str | None = None
    golden: GoldenRun | None = None
    started_t = time.time()
    target: LocalTarget | None = None
    launch: dict[str, Any] | None = None
    reaper: subprocess.Popen[bytes] | None = None
    # Faults that set something up before the launch (a metadata endpoint per node) are built
    # once; every firing of such a fault uses the same instance.
    prepared: dict[int, Fault] = {}
    lingering: list[str] = []
    runtime: RuntimeSetup | None = None
    hub: Hub | None = None
    storage: StorageMount | None = None
    storage_undo: list[str] = []
    stopped = False  # before the launch, for checkpoints shared between runs
    t0: float | None = None
    try:
        with _interruptible():
            for warning in before_golden(exp, source):
                view.note(f"warning: {warning}")
            if exp.expect.bitwise_equal_to_golden is not None:
                view.note("golden run (same experiment, no faults; cached per code version)")
                try:
                    golden = golden_run(exp, golden_cache, timeout_s=exp.run.timeout_s)
                except SharedCheckpoint as e:
                    raise SharedCheckpointStop(golden_resumed_message(exp, source, e)) from None
                view.note(f"golden digest {str(golden.digest)[:16]}… "
                          f"({'cached' if golden.cached else f'{golden.wall_s:.1f} s'})")
                after_golden(exp, source, golden.run_dir, golden.checkpoints_outside)
            node_env: dict[str, dict[str, str]] = {}
            nodes = [f"node{i}" for i in range(exp.topology.nodes)]
            for i, spec in enumerate(exp.faults):
                if spec.fault_class.needs_prepare():
                    prepared[i] = spec.build()
                    for node, env in prepared[i].prepare(nodes).items():
                        node_env.setdefault(node, {}).update(env)
            runtime = RuntimeSetup.create(exp, job_dir)
            for node in nodes:
                node_env.setdefault(node, {}).update(runtime.env)
            gpu_dir = None
            if any(spec.fault_class.family == "gpu" for spec in exp.faults):
                gpu_dir = job_dir / "gpu"  # each node's GPU state and kernel-log stand-in
                for node in nodes:
                    node_env[node].update(gpu_node_env(job_dir, node,
                                                       exp.topology.procs_per_node))
            target = make_target(exp, job_dir, node_env=node_env)
            if runtime.channel == "socket":
                hub = runtime.hub = Hub(runtime.secret)
                target.attach_hub(hub)
                if not target.stream.attached:  # the nodes cannot reach this host
                    runtime.channel = "file"
                    view.note("the node relays use the file channel: no address of this "
                              "host reaches the nodes")
            if needs_storage_mount(exp):  # before the job opens a file there
                storage = StorageMount.start(storage_dir(exp, job_dir, source),
                                             run_folder / ".storage")
                view.note(f"serving {storage.path} through the storage passthrough")
            view.start(exp.name, exp.planned_steps)
            # The guard first: faultlab may die while the job is still starting.
            pidfile = run_folder / ".job-pids.json"
            reaper = _start_reaper(pidfile, target.run_id, target.guard_path, gpu_dir,
                                   storage.guard_path if storage else None)
            target.start()
            launch = target.launch_summary()
            if launch:
                view.note(launch["note"])
            t0 = time.monotonic()
            states = [TriggerState(exp, i) for i in range(len(exp.faults))]
            last_pids_write = 0.0
            done_at: float | None = None
            while True:
                view.on_events(target.stream.poll())
                now = time.monotonic()
                if now - last_pids_write > 0.5:
                    _write_pids(pidfile, target)
                    last_pids_write = now
                for i, state in enumerate(states):
                    if i in runtime.planned:  # in the launch plan: recorded when it strikes
                        if not state.exhausted and _struck(exp, i, target, records):
                            state.mark_fired()
                        continue
                    if state.due(target.stream, now - t0):
                        state.mark_fired()
                        act = _fire(exp, i, state.fired, target, view, prepared.get(i))
                        records.append(act.record)
                        if act.fault.reversible and not act.record.details.get("error"):
                            active.append(act)
                runtime.open_due_gates([state.fired for state in states])
                for act in list(active):
                    if (act.deadline is not None and now >= act.deadline) or (
                            act.until_reaction and target.stream.reacted_since(
                                act.record.injected_t, act.known_pids)):
                        _undo(act, target, records, view)
                        active.remove(act)
                if target.finished():
                    break
                if _training_done(target.stream):
                    done_at = done_at or now
                    if now - done_at > LINGER_S:
                        lingering = [n for n, rc in target.result().returncodes.items()
                                     if rc is None]
                        view.note(f"training completed {LINGER_S:g} s ago; stopping nodes "
                                  f"still running: {', '.join(lingering)}")
                        break
                if now - t0 > exp.run.timeout_s:
                    timed_out = True
                    view.note(f"experiment timeout ({exp.run.timeout_s:g} s): stopping the job")
                    break
                time.sleep(poll_s)
    except KeyboardInterrupt:
        interrupted = True
        error = "interrupted (Ctrl-C or SIGTERM); every process of the job was stopped"
    except SharedCheckpointStop as e:
        stopped, error = True, str(e)
    except FaultlabError as e:
        error = str(e)
    finally:
        watched_until = time.time()
        with _shielded():
            if t0 is not None:
                job_s = time.monotonic() - t0
            if runtime is not None:
                runtime.open_all_gates()
            for act in active:
                _undo(act, target, records, view)
            _release(exp, prepared, records, view)
            if hub is not None:
                hub.ending()
            if target is not None:
                target.continue_all()
                target.stop()
            if hub is not None:  # the relays flush, push their last batch and exit
                hub.close()
                if target is not None:
                    target.stream.detach()
            if storage is not None:  # after the job: nothing holds a file open any more
                storage_undo = storage.stop()
                view.note(f"storage passthrough: {'; '.join(storage_undo)}")
            if reaper is not None:
                reaper.terminate()
                reaper.wait()
            view.stop()

    events = []
    final_state = None
    losses: dict[int, float] = {}
    if target is not None:
        target.stream.poll()
        if exp.target.command:  # a user's trainer: its final state is its last checkpoint
            final_state = complete_events(job_dir, target.stream.events)
            target.stream.poll()
            losses = log_losses(exp, job_dir)
        events = target.stream.events
    metrics = compute_metrics(events, records)
    landed = landed_steps(exp, metrics)
    gated = {exp.faults[i].id for i in (x for v in (runtime.gates if runtime else {}).values()
                                        for x in v)}
    on_time = landed_checks(exp, landed, gated)
    for fid, (at_step, after) in landed.items():
        if fid in gated and after != at_step and exp.target.command:
            view.note(f"{fid} (at_step {at_step}) landed after step {after}: the trainer "
                      f"ran past its step gate (a level-2 trainer calls rt.step_done(n) "
                      f"after its record of step n)")
    slurm_view = target.scheduler_view() if target is not None else None
    if slurm_view is not None:
        _scheduler_metrics(metrics, slurm_view, records)
    scan = None
    if exp.expect.checkpoints_all_finite is not None and target is not None:
        view.note("reading every checkpoint back")
        scan = scan_checkpoints(job_dir / "checkpoints")
        metrics.checkpoints_all_finite = scan.all_finite
        withhold_unfinished(metrics)  # a True from a run that stopped early shows nothing
    # What in the team's launch line made this recovery fail or slow (none for faultlab's own).
    last_start = max((e["t"] for e in events if e.get("kind") == "start"), default=None)
    hung = timed_out and metrics.restarts > 0 and last_start is not None and not any(
        e.get("kind") == "step" and e["t"] > last_start for e in events)
    logs = node_logs(job_dir)
    findings = launch_findings(launch, records, logs, hung_after_restart=hung,
                               services=exp.target.services) if launch else []
    findings += abort_at_exit(logs)  # the trainer's, under any launcher
    # Stopped before the launch: no SLA was measured, and a table of "not measured" would
    # only bury the reason (the error).
    slas = [] if stopped else judge(exp, metrics, golden, timed_out=timed_out or interrupted,
                                    faults=records, events=events, final_state=final_state,
                                    job_s=job_s, findings=findings)
    slas += on_time if slas else []
    own = own_checkpoints_check(exp, source, events, job_dir) if events else None
    if own is not None:  # first: every other line of the verdict is vacuous beside it
        slas.insert(0, own)
    saved_outside = outside_saves(events, job_dir)
    if saved_outside:
        view.note(f"this run saved {len(saved_outside)} checkpoint(s) outside its run "
                  f"directory ({saved_outside[0]} ...): the next run given the same path "
                  f"would resume from them")
    control = control_plane(runtime, hub, target.stream.late if target else {}, watched_until)
    if control.get("lost") and slas:
        slas.append(SLAResult("control_plane_intact", True, False, False, control["lost"]))
    verdict = "pass" if slas and all(s.passed for s in slas) and error is None else "fail"
    journal = {
        "verdict": verdict,
        "slas": [dataclasses.asdict(s) for s in slas],
        "metrics": metrics.to_dict(),
        "faults": [_record_dict(r, landed.get(r.id)) for r in records],
        "experiment": {"name": exp.name, "description": exp.description,
                       "file": str(source) if source else None, "seed": exp.seed,
                       "document": exp.model_dump(mode="json")},
        "golden": dataclasses.asdict(golden) if golden else None,
        "run": {"started_t": started_t, "ended_t": time.time(),
                "wall_s": time.time() - started_t, "job_s": job_s, "timed_out": timed_out,
                "interrupted": interrupted, "error": error, "job_dir": str(job_dir),
                "exit_codes": target.result().returncodes if target else {},
                "command": target.describe() if target else None,
                "launch": ({k: v for k, v in launch.items() if k != "note"}
                           if launch else None),
                "launch_findings": [f.to_dict() for f in findings],
                "checkpoint_scan": scan.to_dict() if scan else None,
                "final_checkpoint": ({k: v for k, v in final_state.to_dict().items()
                                      if k != "tensors"} if final_state else None),
                "log_losses": losses or None,
                "stopped_after_completion": lingering,
                "checkpoints_outside": saved_outside,
                "slurm": slurm_view,
                "control_plane": control,
                "storage_mount": ({"path": str(storage.path), "undo": storage_undo}
                                  if storage else None)},
        "environment": environment(),
    }
    path = write_journal(run_folder, journal)
    result = RunResult(name=exp.name, verdict=verdict, slas=slas, metrics=metrics,
                       faults=records, run_folder=run_folder, journal_path=path,
                       timed_out=timed_out, interrupted=interrupted, error=error, golden=golden)
    if interrupted:
        raise KeyboardInterrupt(result)
    return result


def _fire(exp: Experiment, index: int, nth: int, target: LocalTarget, view: NullView,
          prepared: Fault | None = None) -> _Active:
    spec = exp.faults[index]
    fid = spec.id if nth == 1 else f"{spec.id}#{nth}"
    kind, value = resolve_selector(exp, index, occurrence=nth - 1)
    victim = Victim(kind, value)
    fault = prepared or spec.build()
    if isinstance(fault, RuntimeFault | GpuFault):
        fault.fault_id = fid  # the agents echo it in their fault_injected events
    known = {e["pid"] for e in target.stream.of_kind("start")}
    injected_t = time.time()
    try:
        details = fault.inject(target, victim)
        injected_t = float(details.pop("at_t", injected_t))
        view.note(f"injected {fid}: {spec.type} on {victim} "
                  f"{json.dumps(details, default=str)[:80]}")
    except FaultError as e:
        details = {"error": str(e)}
        view.note(f"could not inject {fid}: {e}")
    deadline = None if spec.duration_s is None else time.monotonic() + spec.duration_s
    record = FaultRecord(id=fid, type=spec.type, injected_t=injected_t, target=str(victim),
                         details=details)
    return _Active(index, fault, record, deadline, spec.until == "reaction", known)


def _undo(act: _Active, target: LocalTarget | None, records: list[FaultRecord],
          view: NullView) -> None:
    # When the undo began: a continued rank can step before the undo call returns (seen: a
    # group SIGCONTed at undo stepped 10 ms before a timestamp taken after it, under load),
    # and nothing the fault held can move before this.
    undone_t = time.time()
    try:
        details = act.fault.undo(target) if target is not None else {}  # type: ignore[arg-type]
    except FaultError as e:
        details = {"undo_error": str(e)}
    undone = dataclasses.replace(act.record, undone_t=undone_t,
                                 details={**act.record.details, "undo": details})
    records[records.index(act.record)] = undone
    act.record = undone
    view.note(f"undone {act.record.id} {json.dumps(details, default=str)[:60]}")


def _struck(exp: Experiment, index: int, target: LocalTarget,
            records: list[FaultRecord]) -> bool:
    """Record a planned runtime fault once a rank reports it struck (its ``fault_injected``)."""
    spec = exp.faults[index]
    first = target.stream.first("fault_injected", fault_id=spec.id)
    if first is None:
        return False
    details = {"planned": True, "step": first.get("step"), "rank": first.get("rank"),
               **{k: v for k, v in first.items() if k not in (
                   "t", "kind", "rank", "world_size", "pid", "restart", "node", "fault_id",
                   "type", "step")}}
    if spec.target.kind == "rank":
        details["ranks"] = [spec.target.value]
    num_steps = getattr(spec.params, "num_steps", None)
    if num_steps and spec.trigger.at_step is not None:  # the plan's window (runtime_plan.py)
        details["window_steps"] = [spec.trigger.at_step, spec.trigger.at_step + num_steps - 1]
    records.append(FaultRecord(id=spec.id, type=spec.type, injected_t=float(first["t"]),
                               target=str(Victim(spec.target.kind, spec.target.value)),
                               details=details))
    return True


def _release(exp: Experiment, prepared: dict[int, Fault], records: list[FaultRecord],
             view: NullView) -> None:
    """Stop what ``prepare`` started; what it did goes into the journal of the fault's last
    firing (e.g. whether a preempted node was still there to be terminated)."""
    for index, fault in prepared.items():
        try:
            details = fault.release()
        except FaultError as e:
            details = {"release_error": str(e)}
        except Exception as e:  # noqa: BLE001 - one fault's clean-up must not stop the others
            details = {"release_error": f"{type(e).__name__}: {e}"}
        mine = [r for r in records if r.id.split("#")[0] == exp.faults[index].id]
        if details and mine:
            last = mine[-1]
            records[records.index(last)] = dataclasses.replace(
                last, details={**last.details, "release": details})
        if details:
            view.note(f"released {fault.type} {json.dumps(details, default=str)[:60]}")


def _scheduler_metrics(metrics: Metrics, view: dict[str, Any],
                       records: list[FaultRecord]) -> None:
    """What only the scheduler shows: time in the queue, and the way back from a requeue."""
    metrics.queue_time_s = view.get("queue_s")
    requeues = view.get("requeues") or []
    metrics.requeues = len(requeues)
    first_fault = min((r.injected_t for r in records if not r.details.get("error")),
                      default=None)
    back = [q["running_again_t"] for q in requeues if q.get("running_again_t") is not None]
    if first_fault is not None and back and len(back) == len(requeues):
        metrics.requeue_latency_s = max(back) - first_fault
        for q in requeues:
            q["latency_s"] = q["running_again_t"] - first_fault


def landed_steps(exp: Experiment, metrics: Metrics) -> dict[str, tuple[int, int]]:
    """Fault id → (its ``at_step``, the step it landed after) for every fault triggered by
    step that was injected. "Landed after step H": H is the highest step any rank had recorded
    when the fault was injected (``high_water_step``), so the fault came before step H + 1 was
    recorded. A fault injected from outside must land after exactly its ``at_step`` (the step
    gates); one in the launch plan strikes during its step, after ``at_step - 1``."""
    at = {spec.id: spec.trigger.at_step for spec in exp.faults
          if spec.trigger.at_step is not None}
    return {f.fault_id: (at[f.fault_id], f.high_water_step) for f in metrics.faults
            if f.fault_id in at}


def landed_checks(exp: Experiment, landed: dict[str, tuple[int, int]],
                  gated: set[str]) -> list[SLAResult]:
    """The guarantee that a fault injected from outside at ``at_step: N`` lands after step N
    and before step N + 1, as one check per such fault (``fault_landed_at_step[id]``), for the
    trainers that hold it: the bundled ones, which wait at the step gates (``rt.step_done``).
    A user's trainer at level 2 that does not call ``rt.step_done`` cannot hold it: for it a
    late fault is only a note of the run."""
    if exp.target.command:
        return []
    out = []
    for fid, (at_step, after) in landed.items():
        if fid in gated:
            note = "" if after == at_step else (
                f"landed after step {after}: the ranks ran past the step gate at {at_step}")
            out.append(SLAResult(f"fault_landed_at_step[{fid}]", at_step, after,
                                 after == at_step, note))
    return out


def _record_dict(r: FaultRecord, landed: tuple[int, int] | None = None) -> dict[str, Any]:
    d = dataclasses.asdict(r)
    d["error"] = r.details.get("error")
    if landed is not None:
        d["at_step"], d["landed_after_step"] = landed
    return d


def _start_reaper(pidfile: Path, docker_run: str | None = None,
                  slurm_guard: Path | None = None,
                  gpu_dir: Path | None = None,
                  storage_guard: Path | None = None) -> subprocess.Popen[bytes]:
    pidfile.write_text("[]")
    extra = ["--docker-run", docker_run] if docker_run else []
    extra += ["--slurm-guard", str(slurm_guard)] if slurm_guard else []
    extra += ["--gpu-dir", str(gpu_dir)] if gpu_dir else []
    extra += ["--storage-guard", str(storage_guard)] if storage_guard else []
    return subprocess.Popen(
        [sys.executable, "-m", "faultlab.reaper", "--parent", str(os.getpid()),
         "--pidfile", str(pidfile), *extra], start_new_session=True, stdin=subprocess.DEVNULL)


def _write_pids(pidfile: Path, target: LocalTarget) -> None:
    tmp = pidfile.with_suffix(".tmp")
    tmp.write_text(json.dumps(sorted(target.pids())))
    os.replace(tmp, pidfile)
