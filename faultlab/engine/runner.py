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
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from faultlab.engine.checkpoints import scan_checkpoints
from faultlab.engine.detect_watch import DetectionWatcher, detection_report, wants_detection
from faultlab.engine.foreign import complete_events, log_losses
from faultlab.engine.golden import GoldenRun, GoldenRunFailed, golden_cache_for, golden_run
from faultlab.engine.golden_site import refuse_other_hardware
from faultlab.engine.hub import Hub, control_plane
from faultlab.engine.runtime_plan import RuntimeSetup
from faultlab.engine.session import LINGER_S, JobSession, training_done
from faultlab.engine.shared_checkpoints import (
    SharedCheckpoint,
    SharedCheckpointStop,
    after_golden,
    before_golden,
    golden_resumed_message,
    own_checkpoints_check,
)
from faultlab.engine.triggers import TriggerState
from faultlab.engine.view import NullView, View
from faultlab.errors import FaultError, FaultlabError, TargetError
from faultlab.faults import Fault, FaultContext, Victim
from faultlab.judge import SLAResult, judge
from faultlab.judge.timing import TimingUnits, timing_units
from faultlab.judge.verdict import FAIL, INCONCLUSIVE, verdict_of
from faultlab.observe import FaultRecord, Metrics, compute_metrics
from faultlab.observe.checkpoint_origin import outside_saves
from faultlab.observe.detection_score import DetectionReport
from faultlab.observe.launch_findings import LaunchFinding, launch_findings, trainer_findings
from faultlab.observe.logs import node_logs
from faultlab.observe.metrics import withhold_unfinished
from faultlab.report.journal import environment, write_journal
from faultlab.spec import Experiment, resolve_selector
from faultlab.storage import StorageMount
from faultlab.targets.base import Target

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
    findings: list[LaunchFinding] = field(default_factory=list)
    """What in the launch line or the trainer's process explains a failure (with the fix)."""
    detection: dict[str, Any] | None = None
    """The journal's ``detection`` section (None: nothing to detect, no signal declared)."""

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def inconclusive(self) -> bool:
        """Nothing failed, but a correctness SLA could not be measured (never a pass)."""
        return self.verdict == INCONCLUSIVE

    def failures(self) -> list[SLAResult]:
        """The checks that failed (not those inconclusive or covered: ``unmeasured``)."""
        return [s for s in self.slas if s.result == FAIL]

    def unmeasured(self) -> list[SLAResult]:
        """The inconclusive checks: each note says what to add."""
        return [s for s in self.slas if s.result == INCONCLUSIVE]


@dataclass
class _Active:
    index: int
    fault: Fault
    record: FaultRecord
    deadline: float | None
    until_reaction: bool
    known_pids: set[int] = field(default_factory=set)


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
                   view: View | None = None, poll_s: float = 0.05) -> RunResult:
    """Run ``exp`` and judge it. Raises KeyboardInterrupt after clean-up if interrupted.

    The phases, in order: prepare (the golden run, what faults set up before the launch, the
    runtime plan, the target, the hub, the storage mount, the guard), launch, supervise (poll,
    fire what is due, open gates, undo, stop when done), tear down (always, shielded from a
    second Ctrl-C), judge, journal. Each is a method of ``_Run``, which holds what they share.
    """
    run = _Run(exp, source, view or NullView(), new_run_folder(report_dir, exp.name),
               golden_cache_for(exp, golden_cache, report_dir), poll_s)
    try:
        with _interruptible():
            run.prepare()
            run.launch()
            run.supervise()
    except KeyboardInterrupt:
        run.interrupted = True
        run.error = "interrupted (Ctrl-C or SIGTERM); every process of the job was stopped"
    except SharedCheckpointStop as e:
        run.stopped, run.error = True, str(e)
    except FaultlabError as e:
        run.error = str(e)
    finally:
        run.tear_down()
    result = run.journal(run.judge())
    if run.interrupted:
        raise KeyboardInterrupt(result)
    return result


@dataclass
class _Judged:
    """What ``_Run.judge`` found, for the journal."""

    slas: list[SLAResult]
    metrics: Metrics
    landed: dict[str, tuple[int, int]]
    findings: list[Any]
    control: dict[str, Any]
    final_state: Any = None
    losses: dict[int, float] = field(default_factory=dict)
    slurm_view: dict[str, Any] | None = None
    scan: Any = None
    saved_outside: list[str] = field(default_factory=list)
    units: TimingUnits | None = None
    detection: DetectionReport | None = None

    @property
    def verdict(self) -> str:
        return verdict_of(self.slas)


class _Run:
    """One run of an experiment, phase by phase (``run_experiment``)."""

    def __init__(self, exp: Experiment, source: Path | None, view: View,
                 run_folder: Path, golden_cache: Path, poll_s: float) -> None:
        self.exp, self.source, self.view, self.poll_s = exp, source, view, poll_s
        self.run_folder, self.golden_cache = run_folder, golden_cache
        # The job itself (directory, target, guard, hub, passthrough) is the session's.
        self.session = JobSession(exp, run_folder, view=view, source=source)
        self.job_dir = self.session.job_dir
        self.started_t = time.time()
        self.records: list[FaultRecord] = []
        self.active: list[_Active] = []
        self.timed_out = self.interrupted = False
        self.stopped = False  # before the launch, for checkpoints shared between runs
        self.error: str | None = None
        self.golden: GoldenRun | None = None
        self.golden_failed = False  # the reference could not be computed: nothing launched
        self.target: Target | None = None
        # Faults that set something up before the launch (a metadata endpoint per node) are
        # built once; every firing of such a fault uses the same instance.
        self.prepared: dict[int, Fault] = {}
        self.t0: float | None = None
        self.job_s: float | None = None  # how long the job ran, on the clock triggers read
        self.watched_until: float | None = None
        self.watcher: DetectionWatcher | None = None  # the declared detection signals, live

    @property
    def runtime(self) -> RuntimeSetup | None:
        return self.session.runtime

    @property
    def hub(self) -> Hub | None:
        return self.session.hub

    @property
    def storage(self) -> StorageMount | None:
        return self.session.storage

    @property
    def launch_info(self) -> dict[str, Any] | None:
        return self.session.launch_info

    # -- prepare ---------------------------------------------------------------------------

    def prepare(self) -> None:
        exp, view = self.exp, self.view
        for warning in before_golden(exp, self.source):
            view.note(f"warning: {warning}")
        if exp.golden_runs:
            self._golden()
        node_env: dict[str, dict[str, str]] = {}
        nodes = [f"node{i}" for i in range(exp.topology.nodes)]
        for i, spec in enumerate(exp.faults):
            if spec.fault_class.needs_prepare():
                self.prepared[i] = spec.build()
                for node, env in self.prepared[i].prepare(nodes).items():
                    node_env.setdefault(node, {}).update(env)
        self.target = self.session.prepare(node_env)

    def _golden(self) -> None:
        exp, view = self.exp, self.view
        runs = exp.golden_runs
        view.note(f"golden run{'s' if runs > 1 else ''} (same experiment, no faults, on its "
                  f"own target: {exp.topology.launcher}; cached per code version)")
        try:
            golden = golden_run(exp, self.golden_cache, timeout_s=exp.run.timeout_s,
                                runs=runs, view=view)
        except SharedCheckpoint as e:
            raise SharedCheckpointStop(golden_resumed_message(exp, self.source, e)) from None
        except (GoldenRunFailed, TargetError) as e:  # failed, or could not start (the probe)
            self.golden_failed = True
            raise FaultlabError(f"{e}; the experiment was never launched: no SLA was "
                                f"measured") from None
        view.note(f"golden digest {str(golden.digest)[:16]}… "
                  f"({'cached' if golden.cached else f'{golden.wall_s:.1f} s'})")
        self.golden = golden  # kept in the journal if the next check stops the run
        after_golden(exp, self.source, golden.run_dir, golden.checkpoints_outside)

    # -- launch ----------------------------------------------------------------------------

    def launch(self) -> None:
        assert self.target is not None
        self.view.start(self.exp.name, self.exp.planned_steps)
        self.session.start()
        self.t0 = self.session.t0
        if self.exp.observe.detections and self.session.launched_t is not None:
            self.watcher = DetectionWatcher(self.exp.observe.detections, self.job_dir,
                                            self.run_folder, self.target,
                                            self.session.launched_t)

    # -- supervise -------------------------------------------------------------------------

    def supervise(self) -> None:
        """Poll, fire what is due, open the gates whose faults are in, undo what is over, until
        the job ends, trains to the end (and lingers ``LINGER_S``), or times out."""
        exp, view, target, runtime, t0 = self.exp, self.view, self.target, self.runtime, self.t0
        assert target is not None and runtime is not None and t0 is not None
        states = [TriggerState(exp, i) for i in range(len(exp.faults))]
        done_at: float | None = None
        while True:
            view.on_events(target.stream.poll())
            now = time.monotonic()
            self.session.tick(now)
            if self.watcher is not None:
                self.watcher.poll(now)
            for i, state in enumerate(states):
                if i in runtime.planned:  # in the launch plan: recorded when it strikes
                    if not state.exhausted and _struck(exp, i, target, self.records):
                        state.mark_fired()
                    continue
                if state.due(target.stream, now - t0):
                    state.mark_fired()
                    act = _fire(exp, i, state.fired, target, view, self.prepared.get(i))
                    self.records.append(act.record)
                    if act.fault.reversible and not act.record.details.get("error"):
                        self.active.append(act)
            runtime.open_due_gates([state.fired for state in states])
            for act in list(self.active):
                if (act.deadline is not None and now >= act.deadline) or (
                        act.until_reaction and target.stream.reacted_since(
                            act.record.injected_t, act.known_pids)):
                    _undo(act, target, self.records, view)
                    self.active.remove(act)
            if target.finished():
                return
            if training_done(target.stream):
                done_at = done_at or now
                if now - done_at > LINGER_S:
                    self.session.stop_lingering()
                    return
            if now - t0 > exp.run.timeout_s:
                self.timed_out = True
                view.note(f"experiment timeout ({exp.run.timeout_s:g} s): stopping the job")
                return
            time.sleep(self.poll_s)

    # -- tear down -------------------------------------------------------------------------

    def tear_down(self) -> None:
        """Undo every fault, stop the job, the hub, the storage mount and the guard, whatever
        ended the run; a second Ctrl-C cannot cut it short."""
        self.watched_until = time.time()
        target, view = self.target, self.view
        with _shielded():
            if self.t0 is not None:
                self.job_s = time.monotonic() - self.t0

            def undo() -> None:
                for act in self.active:
                    _undo(act, target, self.records, view)
                _release(self.exp, self.prepared, self.records, view)

            self.session.stop(undo)
            if self.watcher is not None:
                self.watcher.close()
            view.stop()

    # -- judge -----------------------------------------------------------------------------

    def judge(self) -> _Judged:
        exp, view, target, job_dir = self.exp, self.view, self.target, self.job_dir
        events: list[dict[str, Any]] = []
        final_state = None
        losses: dict[int, float] = {}
        if target is not None:
            target.stream.poll()
            if exp.target.command:  # a user's trainer: its final state is its last checkpoint
                final_state = complete_events(job_dir, target.stream.events)
                target.stream.poll()
                losses = log_losses(exp, job_dir)
            events = target.stream.events
        metrics = compute_metrics(events, self.records)
        landed = landed_steps(exp, metrics)
        gates = self.runtime.gates if self.runtime else {}
        gated = {exp.faults[i].fault_id for i in (x for v in gates.values() for x in v)}
        on_time = landed_checks(exp, landed, gated)
        for fid, (at_step, after) in landed.items():
            if fid in gated and after != at_step and exp.target.command:
                view.note(f"{fid} (at_step {at_step}) landed after step {after}: the trainer "
                          f"ran past its step gate (a level-2 trainer calls rt.step_done(n) "
                          f"after its record of step n)")
        slurm_view = target.scheduler_view() if target is not None else None
        if slurm_view is not None:
            _scheduler_metrics(metrics, slurm_view, self.records)
        scan = None
        if exp.expect.checkpoints_all_finite is not None and target is not None:
            view.note("reading every checkpoint back")
            scan = scan_checkpoints(job_dir / "checkpoints")
            metrics.checkpoints_all_finite = scan.all_finite
            withhold_unfinished(metrics)  # a True from a run that stopped early shows nothing
        # What in the team's launch line made this recovery fail or slow (none for faultlab's).
        last_start = max((e["t"] for e in events if e.get("kind") == "start"), default=None)
        hung = self.timed_out and metrics.restarts > 0 and last_start is not None and not any(
            e.get("kind") == "step" and e["t"] > last_start for e in events)
        logs = node_logs(job_dir)
        findings = launch_findings(self.launch_info, self.records, logs,
                                   hung_after_restart=hung, services=exp.target.services) \
            if self.launch_info else []
        findings += trainer_findings(logs, self.records, events)  # under any launcher
        # The units of a relative bound: this run's own fault-free start, else the golden run's.
        units = timing_units(events, self.session.launched_t, self.records, self.golden)
        detection = detection_report(exp, self.run_folder, events, self.records, self.golden)
        # Stopped before the launch: no SLA was measured, and a table of "not measured" would
        # only bury the reason (the error).
        slas = [] if self.stopped or self.golden_failed else judge(
            exp, metrics, self.golden, timed_out=self.timed_out or self.interrupted,
            faults=self.records, events=events, final_state=final_state, job_s=self.job_s,
            findings=findings,
            node_exits=target.result().returncodes if target is not None else None,
            lost_nodes=target.result().killed if target is not None else (),
            stopped_nodes=self.session.lingering, losses=losses or None, units=units,
            detection=detection)
        slas += on_time if slas else []
        if self.golden is not None and (note := refuse_other_hardware(
                exp, self.golden_cache, self.golden, events, f"run {self.run_folder}")):
            view.note(f"{note}: the cached reference was dropped; the next run computes it "
                      f"again, on these nodes")
        own = own_checkpoints_check(exp, self.source, events, job_dir) if events else None
        if own is not None:  # first: every other line of the verdict is vacuous beside it
            slas.insert(0, own)
        saved_outside = outside_saves(events, job_dir)
        if saved_outside:
            view.note(f"this run saved {len(saved_outside)} checkpoint(s) outside its run "
                      f"directory ({saved_outside[0]} ...): the next run given the same path "
                      f"would resume from them")
        control = control_plane(self.runtime, self.hub, target.stream.late if target else {},
                                self.watched_until)
        if control.get("lost") and slas:
            slas.append(SLAResult("control_plane_intact", True, False, False, control["lost"]))
        return _Judged(slas, metrics, landed, findings, control, final_state, losses,
                       slurm_view, scan, saved_outside, units, detection)

    # -- journal ---------------------------------------------------------------------------

    def journal(self, judged: _Judged) -> RunResult:
        exp, target, launch, storage = self.exp, self.target, self.launch_info, self.storage
        final_state = judged.final_state
        verdict = judged.verdict if self.error is None else FAIL
        detection = judged.detection.to_dict() if judged.detection is not None and \
            wants_detection(exp) else None
        journal = {
            "verdict": verdict,
            "slas": [s.to_dict() for s in judged.slas],
            "metrics": judged.metrics.to_dict(),
            "faults": [_record_dict(r, judged.landed.get(r.id)) for r in self.records],
            "experiment": {"name": exp.name, "description": exp.description,
                           "file": str(self.source) if self.source else None, "seed": exp.seed,
                           "document": exp.model_dump(mode="json")},
            "golden": dataclasses.asdict(self.golden) if self.golden else None,
            "detection": detection,
            "run": {"started_t": self.started_t, "launched_t": self.session.launched_t,
                    "ended_t": time.time(),
                    "wall_s": time.time() - self.started_t, "job_s": self.job_s,
                    "timed_out": self.timed_out, "interrupted": self.interrupted,
                    "error": self.error, "job_dir": str(self.job_dir),
                    "exit_codes": target.result().returncodes if target else {},
                    "command": target.describe() if target else None,
                    "launch": ({k: v for k, v in launch.items() if k != "note"}
                               if launch else None),
                    "launch_findings": [f.to_dict() for f in judged.findings],
                    "checkpoint_scan": judged.scan.to_dict() if judged.scan else None,
                    "final_checkpoint": ({k: v for k, v in final_state.to_dict().items()
                                          if k != "tensors"} if final_state else None),
                    "log_losses": judged.losses or None,
                    "timing_units": judged.units.to_dict() if judged.units else None,
                    "stopped_after_completion": self.session.lingering,
                    "checkpoints_outside": judged.saved_outside,
                    "slurm": judged.slurm_view,
                    "control_plane": judged.control,
                    "storage_mount": ({"path": str(storage.path),
                                       "undo": self.session.storage_undo}
                                      if storage else None)},
            "environment": environment(),
        }
        path = write_journal(self.run_folder, journal)
        return RunResult(name=exp.name, verdict=verdict, slas=judged.slas,
                         metrics=judged.metrics, faults=self.records,
                         run_folder=self.run_folder, journal_path=path,
                         timed_out=self.timed_out, interrupted=self.interrupted,
                         error=self.error, golden=self.golden,
                         findings=list(judged.findings), detection=detection)


SAVES_GRACE_S = 2.0
"""How long a fault that reads the job's checkpoints waits for the saving ranks' records."""


def _await_saves(target: Target, view: View, grace_s: float = SAVES_GRACE_S) -> None:
    """Poll until every rank that has recorded a save has reported the highest step any rank
    has (its records arrive in order, so its saves before that step are in), or ``grace_s``
    passed (a saving rank that died never reports it). A step trigger fires on the first
    rank's record: Lightning's rank 0 rewrites ``last.ckpt`` right after saving
    ``epoch=1-step=8.ckpt``, and when rank 1's step 9 came in through its own relay first,
    ``checkpoint: latest`` took the epoch file for the newest and damaged it instead of
    ``last.ckpt``, and the run's verdict flipped from fail to pass
    (examples/lightning_ddp/experiments/ckpt_bitflip.yaml, once in a suite run)."""
    deadline, high = time.monotonic() + grace_s, target.stream.max_step()
    while True:
        savers = {e.get("rank") for e in target.stream.of_kind("checkpoint_saved")}
        reached: dict[object, int] = {}
        for e in target.stream.of_kind("step"):
            step = e.get("step")
            if e.get("rank") in savers and isinstance(step, int):
                reached[e.get("rank")] = max(reached.get(e.get("rank"), 0), step)
        if all(reached.get(r, -1) >= high for r in savers) or time.monotonic() >= deadline:
            return
        time.sleep(0.02)
        view.on_events(target.stream.poll())


def _fire(exp: Experiment, index: int, nth: int, target: Target, view: View,
          prepared: Fault | None = None) -> _Active:
    spec = exp.faults[index]
    fid = spec.fault_id if nth == 1 else f"{spec.fault_id}#{nth}"
    kind, value = resolve_selector(exp, index, occurrence=nth - 1)
    victim = Victim(kind, value)
    fault = prepared or spec.build()
    fault.fault_id = fid  # what a rank-side action echoes in its fault_injected event
    if getattr(type(fault), "reads_saved_checkpoints", False):
        _await_saves(target, view)
    known = {e["pid"] for e in target.stream.of_kind("start")}
    injected_t = time.time()
    try:
        details = fault.inject(cast(FaultContext, target), victim)  # every Target is one
        injected_t = float(details.pop("at_t", injected_t))
        view.note(f"injected {fid}: {spec.type} on {victim} "
                  f"{json.dumps(details, default=str)[:80]}")
    except FaultError as e:
        details = {"error": str(e)}
        view.note(f"could not inject {fid}: {e}")
    deadline = None if spec.duration_s is None else time.monotonic() + spec.duration_s
    record = FaultRecord(id=fid, type=spec.type, injected_t=injected_t, target=str(victim),
                         details=details, capabilities=spec.fault_class.capabilities())
    return _Active(index, fault, record, deadline, spec.until == "reaction", known)


def _undo(act: _Active, target: Target | None, records: list[FaultRecord],
          view: View) -> None:
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


def _struck(exp: Experiment, index: int, target: Target,
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
    records.append(FaultRecord(id=spec.fault_id, type=spec.type, injected_t=float(first["t"]),
                               target=str(Victim(spec.target.kind, spec.target.value)),
                               details=details, capabilities=spec.fault_class.capabilities()))
    return True


def _release(exp: Experiment, prepared: dict[int, Fault], records: list[FaultRecord],
             view: View) -> None:
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
