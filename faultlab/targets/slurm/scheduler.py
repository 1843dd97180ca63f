"""Slurm's view of the job: followed through ``scontrol``, acted on through its own mechanisms.

The job is followed through Slurm itself (``scontrol -o show job``: state, reason, restarts,
node list, exit code); every change is recorded with its time (``scheduler_view``, and
``slurm/view.jsonl`` of a job faultlab submitted), next to the trainer's own events. Each
node's exit code comes from what ``srun`` said of its tasks in the batch output
(``faultlab.targets.slurm.exits``); where the nodes cannot be told apart, the result holds the
job's one code.
Scheduler-level faults on the job itself go through ``scancel`` (a preemption notice) and
``scontrol requeue``. ``SchedulerView`` is that part of ``SlurmTarget``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from faultlab.errors import FaultError, TargetError
from faultlab.targets.slurm.exits import node_exits
from faultlab.targets.slurm.settings import SlurmSettings
from faultlab.targets.slurm.slurmcli import (
    TERMINAL,
    SlurmError,
    exit_code,
    hostnames,
    run,
    show_job,
)

__all__ = ["VIEW_EVERY_S", "SchedulerView", "SlurmJobResult"]

VIEW_EVERY_S = 0.25
"""How often the controller is asked about the job (one ``scontrol`` call, about 10 ms)."""


class SlurmJobResult:
    """``Target.result`` of a Slurm job: each node's exit code, or where the nodes cannot be
    told apart the job's exit code under its id (``job J``)."""

    def __init__(self, returncodes: dict[str, int | None], killed: set[str],
                 wall_s: float) -> None:
        self.returncodes = returncodes
        self.killed = killed
        self.wall_s = wall_s

    @property
    def ok(self) -> bool:
        return all(rc == 0 for rc in self.returncodes.values())


class SchedulerView:
    """``SlurmTarget``'s following of the job through the controller, and the scheduler's own
    mechanisms that act on the job (a signal through ``scancel``, a requeue)."""

    job_id: int | None
    attached: bool
    spec: SlurmSettings | None
    run_dir: Path
    view: list[dict[str, Any]]
    _last: dict[str, str] | None
    _last_view_t: float
    _hold_until: float
    _t0: float
    _nodes: list[str]
    _lost: set[str]
    _submit_cmd: list[str]
    _gone: bool

    def _follow(self, force: bool = False) -> dict[str, str] | None:
        """Ask the controller (at most every ``VIEW_EVERY_S``); record what changed."""
        now = time.monotonic()
        if self.job_id is None or self._gone or (
                not force and now - self._last_view_t < VIEW_EVERY_S):
            return self._last
        self._last_view_t = now
        try:
            job = show_job(self.job_id)
        except SlurmError as e:
            raise TargetError(str(e)) from None
        if job is None:
            self._gone = True
            return self._last
        key = ("JobState", "Reason", "Restarts", "NodeList", "ExitCode")
        if self._last is None or any(job.get(k) != self._last.get(k) for k in key):
            record = {"t": time.time(), "state": job.get("JobState"),
                      "reason": job.get("Reason"), "restarts": int(job.get("Restarts", 0)),
                      "nodes": job.get("NodeList"), "exit_code": job.get("ExitCode"),
                      "submit_time": job.get("SubmitTime"), "start_time": job.get("StartTime")}
            self.view.append(record)
            if not self.attached:  # an attached job's folder is not faultlab's to write
                with open(self.run_dir / "slurm" / "view.jsonl", "a") as f:
                    f.write(json.dumps(record) + "\n")
            if job.get("NodeList") not in (None, "", "(null)"):
                try:
                    self._nodes = hostnames(job["NodeList"])
                except SlurmError:
                    pass
        self._last = job
        return job

    def state(self) -> str:
        job = self._follow(force=True)
        return "GONE" if job is None else job.get("JobState", "?")

    def finished(self) -> bool:
        job = self._follow()
        if time.time() < self._hold_until:
            return False
        return self._gone or (job is not None and job.get("JobState") in TERMINAL)

    def hold_finish(self, until_t: float) -> None:
        """Do not call the job finished before ``until_t`` (a requeue is due by then)."""
        self._hold_until = max(self._hold_until, until_t)

    def result(self) -> SlurmJobResult:
        job = self._last or {}
        codes = self._node_exits(job) or {f"job {self.job_id}": exit_code(
            job.get("ExitCode", ""))}
        return SlurmJobResult(codes, set(self._lost), time.monotonic() - self._t0)

    def _node_exits(self, job: dict[str, str]) -> dict[str, int | None] | None:
        """Each node's code from ``srun``'s report in the batch output (``exits``)."""
        try:
            output = (self.run_dir / "logs" / f"slurm-{self.job_id}.out").read_text(
                errors="replace")
        except OSError:
            return None
        alone = job.get("JobState") in ("COMPLETED", "FAILED") and \
            int(job.get("Restarts", 0) or 0) == 0
        try:
            return node_exits(output, nodes=list(self._nodes), ended_alone=alone,
                              own_script=self.spec is not None and self.spec.script is None
                              and not self.attached, expand=hostnames)
        except SlurmError:  # a host list the controller cannot expand now
            return None

    def scheduler_view(self) -> dict[str, Any]:
        """Slurm's view of the job for the journal: every change of state, and what follows
        from them (time in the queue, each requeue's way back to running)."""
        self._follow(force=True)
        submitted = self.view[0]["t"] if self.view else None
        running = [v["t"] for v in self.view if v["state"] == "RUNNING"]
        requeues = []
        for prev, cur in zip(self.view, self.view[1:], strict=False):
            if cur["restarts"] > prev["restarts"]:
                back = next((v["t"] for v in self.view
                             if v["t"] > cur["t"] and v["state"] == "RUNNING"), None)
                requeues.append({"restart": cur["restarts"], "requeued_t": cur["t"],
                                 "reason": cur["reason"], "running_again_t": back,
                                 "pending_s": None if back is None else back - cur["t"]})
        return {"job_id": self.job_id, "attached": self.attached,
                "submit": self._submit_cmd or None,
                "queue_s": (running[0] - submitted) if running and submitted else None,
                "restarts": self.view[-1]["restarts"] if self.view else 0,
                "final_state": self.view[-1]["state"] if self.view else None,
                "requeues": requeues, "states": self.view}

    # -- the scheduler's own mechanisms --------------------------------------------------------

    def cancel(self, signal_name: str, batch: bool = False, full: bool = False) -> None:
        """``scancel --signal=SIG [--batch|--full] J``: Slurm delivers it, as its preemption
        notice does."""
        cmd = ["scancel", f"--signal={signal_name}"]
        cmd += ["--batch"] if batch else (["--full"] if full else [])
        try:
            run([*cmd, str(self.job_id)])
        except SlurmError as e:
            raise FaultError(str(e)) from None

    def requeue(self) -> str:
        """``scontrol requeue J``: the job is killed where it runs and queued again."""
        try:
            run(["scontrol", "requeue", str(self.job_id)])
        except SlurmError as e:
            raise FaultError(str(e)) from None
        return self.state()
