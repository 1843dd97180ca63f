"""One job on the experiment's own target: prepared, started, guarded, watched and stopped.

Everything that starts a job goes through a ``JobSession``: the engine's run of an experiment,
its golden run (the same job without faults, on the same target: local processes, docker
nodes, or a Slurm batch job with faultlab's script or the team's), the runs of a campaign and
the Chaos Toolkit extension's ``start_training``. A guard, a target or a channel taught to the
session is taught to all of them.

The phases:

- ``JobSession(exp, folder)``: the run's job directory, where the target's nodes see it
  (``folder/job``, or on the cluster's shared filesystem, linked as ``folder/job``);
- ``prepare(node_env)``: the runtime plan of the experiment's in-rank faults and its secret, each
  node's environment (the caller's, e.g. a fault's metadata endpoint, plus the plan's and the
  GPU view's), the target, the hub the relays push records to, the storage passthrough;
- ``start()``: the guard process first (``faultlab.reaper``: should this process die, it
  continues every stopped process and kills the job), then the launch;
- ``tick()`` in the caller's poll loop, or ``guard_in_background()`` for a caller without one,
  keeps the guard's list of pids current (workers change on every restart), and the target's
  ``guard_record`` (what it made outside the job: containers, a Slurm job, nodes set down),
  which the guard hands to the target class's ``undo_from_guard`` should this process die;
- ``watch(timeout_s)``: poll until every node exited, or training completed and the nodes
  lingered ``LINGER_S``, or the timeout passed (a caller that injects nothing: the golden run);
- ``stop(undo)``: the gates opened, the caller's faults undone, every process continued and
  reaped, the hub closed once the relays flushed, the passthrough unmounted, the guard ended.
  Idempotent, shielded from a second Ctrl-C by the caller.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from faultlab.engine.hub import Hub
from faultlab.engine.runtime_plan import RuntimeSetup
from faultlab.engine.storage import needs_exact_mount, needs_storage_mount, storage_dir
from faultlab.engine.view import NullView, View
from faultlab.errors import FaultlabError, TargetError
from faultlab.faults.gpu import gpu_node_env
from faultlab.spec import Experiment
from faultlab.storage import StorageMount
from faultlab.targets import make_target, target_class
from faultlab.targets.base import Target

__all__ = ["LINGER_S", "JobSession", "training_done"]

LINGER_S = 10.0
"""How long nodes may keep running once every rank has finished training before the session
stops them (a node cut off by a partition may wait minutes for its store connection to fail)."""


def training_done(stream: Any) -> bool:
    """Has every rank of the newest incarnation exited with reason ``completed``?"""
    ranks = stream.current_ranks()
    completed = {e.get("rank"): e["t"] for e in stream.of_kind("exit")
                 if e.get("reason") == "completed"}
    return bool(ranks) and all(completed.get(r, 0.0) >= stream.latest_start(r)["t"]
                               for r in ranks)


class JobSession:
    """One job of ``exp`` on its own target, in ``folder`` (module docstring)."""

    def __init__(self, exp: Experiment, folder: Path, *, view: View | None = None,
                 source: Path | None = None, pidfile: Path | None = None) -> None:
        self.exp, self.folder, self.source = exp, folder, source
        self.view = view or NullView()
        try:  # folder/job, or on the filesystem the target's nodes see, linked as job/
            self.job_dir: Path = target_class(exp).prepare_run_dir(exp, folder)
        except TargetError as e:
            raise FaultlabError(f"{source or exp.name}: {e}") from None
        self.pidfile = pidfile or folder / ".job-pids.json"
        self.target_guard = self.pidfile.with_name(self.pidfile.stem + "-target-guard.json")
        """The target's ``guard_record`` and launcher, for the guard (``--target-guard``)."""
        self._guard_written: str | None = None
        self._guard_lock = threading.Lock()
        self.target: Target | None = None
        self.runtime: RuntimeSetup | None = None
        self.hub: Hub | None = None
        self.storage: StorageMount | None = None
        self.storage_undo: list[str] = []
        self.gpu_dir: Path | None = None
        self.reaper: subprocess.Popen[bytes] | None = None
        self.launch_info: dict[str, Any] | None = None
        self.t0: float | None = None
        self.launched_t: float | None = None
        """Wall clock when the target started the job: a cold start is measured from it."""
        self.lingering: list[str] = []
        self._last_pids_write = 0.0
        self._stop_guard = threading.Event()
        self._guard_thread: threading.Thread | None = None
        self._stopped = False

    # -- prepare ---------------------------------------------------------------------------

    def prepare(self, node_env: dict[str, dict[str, str]] | None = None) -> Target:
        """The runtime plan, every node's environment, the target, the hub and the storage
        passthrough, ready to start. ``node_env``: what the caller adds per node."""
        exp, view = self.exp, self.view
        nodes = [f"node{i}" for i in range(exp.topology.nodes)]
        env = {node: dict((node_env or {}).get(node, {})) for node in nodes}
        runtime = self.runtime = RuntimeSetup.create(exp, self.job_dir)
        for node in nodes:
            env[node].update(runtime.env)
        if any(spec.fault_class.family == "gpu" for spec in exp.faults):
            self.gpu_dir = self.job_dir / "gpu"  # each node's GPU state and kernel-log stand-in
            for node in nodes:
                env[node].update(gpu_node_env(self.job_dir, node, exp.topology.procs_per_node))
        target = self.target = make_target(exp, self.job_dir, node_env=env)
        if runtime.channel == "socket":
            self.hub = runtime.hub = Hub(runtime.secret)
            unreachable = target.attach_hub(self.hub)
            if unreachable:
                runtime.channel = "file"
                view.note(f"the node relays use the file channel: {unreachable}")
        if needs_storage_mount(exp):  # before the job opens a file there
            self.storage = StorageMount.start(storage_dir(exp, self.job_dir, self.source),
                                              self.folder / ".storage",
                                              kernel_cache=not needs_exact_mount(exp))
            view.note(f"serving {self.storage.path} through the storage passthrough")
        return target

    # -- start -----------------------------------------------------------------------------

    def start(self) -> None:
        """The guard first (faultlab may die while the job is still starting), then the job."""
        target = self.target
        assert target is not None, "prepare() first"
        self.pidfile.parent.mkdir(parents=True, exist_ok=True)
        self.pidfile.write_text("[]")
        target.guard_writer = self.write_target_guard
        self.write_target_guard()  # what the target may create, known before it starts
        extra = ["--target-guard", str(self.target_guard)]
        extra += ["--gpu-dir", str(self.gpu_dir)] if self.gpu_dir else []
        extra += ["--storage-guard", str(self.storage.guard_path)] if self.storage else []
        self.reaper = subprocess.Popen(
            [sys.executable, "-m", "faultlab.reaper", "--parent", str(os.getpid()),
             "--pidfile", str(self.pidfile), *extra],
            start_new_session=True, stdin=subprocess.DEVNULL)
        self.launched_t = time.time()
        target.start()
        self.launch_info = target.launch_summary()
        if self.launch_info:
            self.view.note(self.launch_info["note"])
        self.t0 = time.monotonic()

    # -- guard -----------------------------------------------------------------------------

    def tick(self, now: float | None = None) -> None:
        """Keep the guard's pids current (at most every 0.5 s): call it from a poll loop."""
        now = time.monotonic() if now is None else now
        if self.target is None or now - self._last_pids_write <= 0.5:
            return
        self._last_pids_write = now
        tmp = self.pidfile.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(sorted(self.target.pids())))
            os.replace(tmp, self.pidfile)
            self.write_target_guard()
        except OSError:
            pass  # a failed write must not end the run; the next one may succeed

    def write_target_guard(self) -> None:
        """Write the target's ``guard_record`` for the guard (``--target-guard``), with the
        launcher that undoes it, when it changed: from ``tick``, and at once when the target
        asks (``guard_now``, before it changes something outside the job)."""
        assert self.target is not None
        doc = json.dumps({"launcher": self.exp.topology.launcher,
                          "record": self.target.guard_record()})
        with self._guard_lock:
            if doc == self._guard_written:
                return
            tmp = self.target_guard.with_suffix(f".{threading.get_ident()}.tmp")
            tmp.write_text(doc)
            os.replace(tmp, self.target_guard)
            self._guard_written = doc

    def guard_in_background(self) -> None:
        """``tick`` from a thread of its own, for a caller with no poll loop (Chaos Toolkit)."""
        def loop() -> None:
            while not self._stop_guard.wait(0.5):
                self.tick()

        self._guard_thread = threading.Thread(target=loop, daemon=True,
                                              name=f"faultlab-pids-{self.job_dir.name}")
        self._guard_thread.start()

    # -- watch -----------------------------------------------------------------------------

    def watch(self, timeout_s: float, poll_s: float = 0.1) -> bool:
        """Poll until the job ends or trains to the end (``LINGER_S``); False on timeout."""
        target, t0 = self.target, self.t0
        assert target is not None and t0 is not None, "start() first"
        done_at: float | None = None
        while True:
            self.view.on_events(target.stream.poll())
            now = time.monotonic()
            self.tick(now)
            if target.finished():
                return True
            if training_done(target.stream):
                done_at = done_at or now
                if now - done_at > LINGER_S:
                    self.stop_lingering()
                    return True
            if now - t0 > timeout_s:
                return False
            time.sleep(poll_s)

    def stop_lingering(self) -> None:
        """Training completed ``LINGER_S`` ago: name the nodes still running (stopped next)."""
        assert self.target is not None
        self.lingering = [n for n, rc in self.target.result().returncodes.items() if rc is None]
        self.view.note(f"training completed {LINGER_S:g} s ago; stopping nodes still running: "
                       f"{', '.join(self.lingering)}")

    # -- stop ------------------------------------------------------------------------------

    def stop(self, undo: Callable[[], None] | None = None) -> None:
        """Open every gate, run ``undo`` (the caller's faults), stop the job, the hub, the
        passthrough and the guard. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        target = self.target
        if self.runtime is not None:
            self.runtime.open_all_gates()
        if undo is not None:
            undo()
        if self.hub is not None:
            self.hub.ending()
        if target is not None:
            target.continue_all()
            target.stop()
        if self.hub is not None:  # the relays flush, push their last batch and exit
            self.hub.close()
            if target is not None:
                target.stream.detach()
        if self.storage is not None:  # after the job: nothing holds a file open any more
            self.storage_undo = self.storage.stop()
            self.view.note(f"storage passthrough: {'; '.join(self.storage_undo)}")
        self._stop_guard.set()
        if self._guard_thread is not None:
            self._guard_thread.join(timeout=5)
        if self.reaper is not None:
            self.reaper.terminate()
            self.reaper.wait()
