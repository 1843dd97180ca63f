"""Jobs this ``chaos`` process launched, and how any job is addressed by its run directory.

A job is launched from a faultlab experiment: an experiment file, or one built from the job's
shape (``start_training``'s arguments) with defaults (``build_experiment``).

A job launched here (``start_training``, or the run-context control) is the target its
experiment's ``topology.launcher`` asks for (local processes, containers, a Slurm batch job),
kept in a process-wide registry, so that every activity of the experiment acts on the same
object and the control can stop it. A Slurm job attached to by its id (``attach_slurm``) is
kept in a second registry, by its run directory. Any other run directory is a job that was
already running on this host (``AttachedTarget``). Attached jobs take faults but are never
stopped by this extension.

A launched job is started through the engine's public ``JobSession``, the one every job of
faultlab starts through, so it is guarded like the engine's own: a reaper process
(``faultlab.reaper``) holds the job's pids and, should this process die without stopping the
job (SIGKILL, OOM), continues every stopped process and kills the job; the relays push to a
hub. An ``atexit`` hook stops whatever is still running when the interpreter exits normally.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaosfaultlab._state import STATE_DIR
from faultlab.errors import InvalidExperimentError, TargetError
from faultlab.spec import Experiment, experiment_from_dict, load_experiment
from faultlab.targets.attach import AttachedTarget
from faultlab.targets.base import JobContext

if TYPE_CHECKING:  # the local target imports torch (through the launcher): only when launching
    from faultlab.targets.slurm import SlurmTarget

__all__ = ["CONFIG_KEY", "EXPERIMENT_FILE", "Launched", "attach_slurm", "build_experiment",
           "cold_start_s", "detach_slurm", "job_context",
           "job_running", "launch", "launched", "resolve_run_dir", "stop", "stop_all",
           "wait_until"]

CONFIG_KEY = "faultlab_run_dir"
"""The ``configuration`` key the run-context control sets to the job's run directory."""
EXPERIMENT_FILE = "experiment.json"
"""The faultlab experiment a launched job was built from (for its golden run)."""


@dataclass
class Launched:
    session: Any
    """The ``faultlab.engine.session.JobSession`` that started the job."""
    exp: Experiment

    @property
    def target(self) -> Any:
        return self.session.target


_LAUNCHED: dict[Path, Launched] = {}
_SLURM: dict[Path, SlurmTarget] = {}
_LOCK = threading.Lock()


def attach_slurm(job_id: int | str, run_dir: str | None = None,
                 allow_node_state_changes: bool = False) -> Path:
    """Attach to the running Slurm job ``job_id`` (its events in ``run_dir``, default its
    ``WorkDir``); returns the run directory the activities then name."""
    from faultlab.targets.slurm import SlurmTarget

    if isinstance(job_id, bool) or not str(job_id).strip().isdigit():
        raise TargetError(f"slurm_job_id: expected a Slurm job id, got {job_id!r}")
    target = SlurmTarget.attach(int(str(job_id).strip()), Path(run_dir) if run_dir else None,
                                allow_node_state_changes=allow_node_state_changes)
    with _LOCK:
        _SLURM[target.run_dir] = target
    return target.run_dir


def detach_slurm(run_dir: Path) -> dict[str, Any]:
    """Forget an attached Slurm job (it goes on); what its faults left on the cluster (a node
    set down) is restored first."""
    with _LOCK:
        target = _SLURM.pop(run_dir.resolve(), None)
    return {} if target is None else target.restore_cluster()


def resolve_run_dir(run_dir: str | os.PathLike[str] | None,
                    configuration: dict[str, Any] | None = None) -> Path:
    """The run directory an activity acts on: its ``run_dir`` argument, else the one the
    run-context control put in the configuration."""
    value = run_dir if run_dir not in (None, "") else (configuration or {}).get(CONFIG_KEY)
    if value in (None, ""):
        raise TargetError("run_dir: missing; pass the job's run directory (run_dir: "
                          "\"${faultlab_run_dir}\" once the chaosfaultlab.control run context "
                          "has started the job, or the directory of a job already running)")
    if not isinstance(value, str | os.PathLike):
        raise TargetError(f"run_dir: expected a path, got {value!r}")
    text = os.fspath(value)
    if "${" in text:
        raise TargetError(f"run_dir: {text!r} was not substituted: no run context set "
                          f"{CONFIG_KEY!r} (add the chaosfaultlab.control control, or pass "
                          f"the run directory of a running job)")
    path = Path(text).resolve()
    if not path.is_dir():
        raise TargetError(f"run_dir: {text!r} is not a directory")
    return path


def launched(run_dir: Path) -> Launched | None:
    with _LOCK:
        return _LAUNCHED.get(run_dir.resolve())


def job_context(run_dir: Path) -> JobContext:
    """The FaultContext of the job in ``run_dir`` (launched here, or attached to)."""
    own = launched(run_dir)
    if own is not None:
        own.target.stream.poll()  # nobody else polls it in a chaos process
        return own.target
    with _LOCK:
        slurm = _SLURM.get(run_dir.resolve())
    if slurm is not None:
        slurm.stream.poll()
        return slurm
    return AttachedTarget(run_dir)


def cold_start_s(run_dir: Path) -> float | None:
    """The launched job's launch to its first step (None: not launched here, or no step yet)."""
    from faultlab.judge.timing import cold_start_s as measure
    from faultlab.observe import EventStream

    own = launched(run_dir)
    if own is None:
        return None
    stream = EventStream(run_dir)
    stream.poll()
    return measure(stream.events, own.session.launched_t)


def job_running(run_dir: Path) -> bool:
    own = launched(run_dir)
    if own is not None:
        return not own.target.finished()
    with _LOCK:
        slurm = _SLURM.get(run_dir.resolve())
    if slurm is not None:
        return not slurm.finished()
    try:
        return AttachedTarget(run_dir).running()
    except TargetError:
        return False


def build_experiment(experiment_file: str | None, *, name: str = "chaos",
                     **shape: Any) -> Experiment:
    """The faultlab experiment a job is launched from (file, or shape with defaults)."""
    given = {k: v for k, v in shape.items() if v is not None}
    try:
        if experiment_file:
            if given:
                raise TargetError(f"experiment_file: {experiment_file!r} defines the job; "
                                  f"leave out {', '.join(sorted(given))} (or the file)")
            return load_experiment(experiment_file)
        data: dict[str, Any] = {
            "name": name, "seed": given.get("seed", 0),
            "target": {"trainer": "reference", "preset": given.get("preset", "tiny"),
                       "overrides": given.get("overrides") or {}},
            "topology": {"nodes": given.get("nodes", 2),
                         "procs_per_node": given.get("procs_per_node", 1),
                         "min_nodes": given.get("min_nodes")},
            "run": {"steps": given.get("steps", 30),
                    "checkpoint_every": given.get("checkpoint_every", 10)},
        }
        return experiment_from_dict(data)
    except InvalidExperimentError as e:
        raise TargetError(f"the training job is invalid: {e}") from None
    except OSError as e:
        raise TargetError(f"experiment_file: cannot read {experiment_file!r}: {e}") from None


def launch(exp: Experiment, run_dir: Path) -> Launched:
    """Start ``exp``'s job (faults and SLAs are not used) in ``run_dir``, guarded."""
    from faultlab.engine.session import JobSession

    # The same layout as an engine run's: the folder, and the job's own directory in it where
    # every node sees it (``folder/job`` here; on the cluster's shared filesystem for Slurm,
    # linked as ``folder/job``). Which is the target's business, not this extension's.
    folder = run_dir.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    # Every rank's runtime agent listens for live in-rank faults (grad_nan, collective_delay...)
    # under this run's secret; the experiment's own faults are not planned here.
    session = JobSession(exp.model_copy(update={"faults": ()}), folder,
                         pidfile=folder / STATE_DIR / "job-pids.json")
    run_dir = session.job_dir
    state = run_dir / STATE_DIR
    state.mkdir(parents=True, exist_ok=True)
    (state / EXPERIMENT_FILE).write_text(json.dumps(exp.model_dump(mode="json"), indent=1))
    try:
        session.prepare()
        session.start()
    except BaseException:
        session.stop()
        raise
    session.guard_in_background()
    own = Launched(session, exp)
    with _LOCK:
        _LAUNCHED[run_dir] = own
    return own


def stop(run_dir: Path) -> dict[str, Any]:
    """Continue and reap every process of a job launched here; idempotent."""
    with _LOCK:
        own = _LAUNCHED.pop(run_dir.resolve(), None)
    if own is None:
        return {"stopped": False}
    own.session.stop()
    return {"stopped": True, "exit_codes": own.target.result().returncodes}


def stop_all() -> None:
    with _LOCK:
        dirs = list(_LAUNCHED)
        attached = list(_SLURM)
    for run_dir in dirs:
        stop(run_dir)
    for run_dir in attached:
        detach_slurm(run_dir)


def wait_until(predicate: Any, timeout_s: float, poll_s: float = 0.2) -> bool:
    """Poll ``predicate()`` until it is true or ``timeout_s`` passed; its last answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))


atexit.register(stop_all)
