"""The slurm target: the job is a Slurm batch job; faultlab runs where ``sbatch`` works.

``topology.launcher: slurm`` submits either faultlab's own batch script (one torchrun agent per
allocated node through ``srun``, the c10d rendezvous on the first node, the registered trainer
or ``target.command`` as each rank) or the user's own script (``slurm.script``), unchanged, with
faultlab's environment exported. The run directory is on the cluster's shared filesystem
(``slurm.run_dir``): the ranks write their events, logs and checkpoints there, and faultlab,
on the login node, reads them at the same path.

The job is followed through Slurm itself (``scontrol -o show job``: state, reason, restarts,
node list, exit code); every change is recorded with its time (``scheduler_view``), next to the
trainer's own events. Faults reach a node the way Slurm lets a job's owner reach it: a step
inside the job's allocation, ``srun --jobid J --overlap -w NODE -N1 -n1``, running faultlab's
node command (``faultlab.targets.slurm.node``) against the node's own process table, never the
login host's. Scheduler-level faults (a node set down, a preemption notice, a requeue) go
through ``scontrol`` and ``scancel``. What a fault changed outside the job (a node down, a test
cluster's machine killed) is written to the guard's state file before it is done, so that the
guard process undoes it if faultlab itself dies; ``stop`` cancels the job.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from faultlab.errors import FaultError, TargetError
from faultlab.observe import EventStream
from faultlab.runtime.bootstrap import bootstrap_env
from faultlab.spec import Experiment
from faultlab.targets.base import JobContext
from faultlab.targets.slurm.slurmcli import (
    TERMINAL,
    SlurmError,
    exit_code,
    hostnames,
    run,
    show_job,
)

__all__ = ["LAB_LABEL", "SlurmJobResult", "SlurmTarget", "prepare_job_dir", "restore_from_guard"]

LAB_LABEL = "faultlab.slurm-cluster"
"""The label of the local test cluster's node containers (``scripts/slurm-cluster.sh``): the
only machines a ``node_kill`` with ``method: machine`` may kill."""

VIEW_EVERY_S = 0.25
"""How often the controller is asked about the job (one ``scontrol`` call, about 10 ms)."""


def prepare_job_dir(exp: Experiment, run_folder: Path) -> Path:
    """The run's job directory on the shared filesystem (``slurm.run_dir``), named after the
    run folder, with ``run_folder/job`` a link to it; returns the shared path."""
    assert exp.topology.slurm is not None
    shared = (exp.topology.slurm.runs_root() / run_folder.name).resolve()
    shared.mkdir(parents=True, exist_ok=True)
    os.chmod(shared, 0o755)
    link = run_folder / "job"
    if not link.exists():
        link.symlink_to(shared, target_is_directory=True)
    return shared


class SlurmJobResult:
    """``Target.result`` of a Slurm job: the job's exit code under its id."""

    def __init__(self, job_id: int | None, code: int | None, killed: set[str],
                 wall_s: float) -> None:
        self.returncodes: dict[str, int | None] = {f"job {job_id}": code}
        self.killed = killed
        self.wall_s = wall_s

    @property
    def ok(self) -> bool:
        return all(rc == 0 for rc in self.returncodes.values())


class SlurmTarget(JobContext):
    """One Slurm batch job of an experiment (faultlab's batch script or the user's)."""

    def __init__(self, exp: Experiment, run_dir: Path,
                 node_env: dict[str, dict[str, str]] | None = None, *,
                 job_id: int | None = None) -> None:
        self.exp = exp
        self.seed = exp.seed
        self.spec = exp.topology.slurm
        assert self.spec is not None
        self.run_dir = run_dir.resolve()
        self.stream = EventStream(self.run_dir / "events")
        self.job_id = job_id
        """Set at submission, or given: a job that is already running (attached by id)."""
        self.attached = job_id is not None
        self.env: dict[str, str] = {}
        for env in (node_env or {}).values():
            self.env.update(env)
        self.guard_path = self.run_dir / "slurm" / "guard.json"
        self.view: list[dict[str, Any]] = []
        self._last: dict[str, str] | None = None
        self._last_view_t = 0.0
        self._hold_until = 0.0
        self._t0 = time.monotonic()
        self._nodes: list[str] = []
        self._pid_node: dict[int, str] = {}
        self._lost: set[str] = set()
        self._nodes_down: list[str] = []
        self._machines: list[str] = []
        self._submit_cmd: list[str] = []
        self._gone = False
        self.action_t: float | None = None
        """When the last signal sent on a node went out (the node's clock): a fault's
        injection time, not the moment faultlab started the step that sent it."""

    @classmethod
    def attach(cls, job_id: int, run_dir: Path | None = None, *,
               allow_node_state_changes: bool = False) -> SlurmTarget:
        """A Slurm job already running, submitted by anyone (the staging case): its events are
        read from ``run_dir`` (default: the job's working directory, ``WorkDir``), its ranks are
        reached on their nodes as for a job faultlab submitted. Stopping it does not cancel it:
        it is not faultlab's. ``allow_node_state_changes``: as ``slurm:``'s, for
        ``slurm_node_down``."""
        try:
            job = show_job(job_id)
        except SlurmError as e:
            raise TargetError(str(e)) from None
        if job is None:
            raise TargetError(f"slurm job {job_id}: unknown to the controller")
        if job.get("JobState") in TERMINAL:
            raise TargetError(f"slurm job {job_id} has ended ({job.get('JobState')})")
        folder = Path(run_dir or job.get("WorkDir") or ".").resolve()
        exp = Experiment.model_validate({
            "name": f"slurm-job-{job_id}",
            "topology": {"launcher": "slurm", "slurm": {
                "run_dir": str(folder.parent),
                "allow_node_state_changes": allow_node_state_changes}}})
        target = cls(exp, folder, job_id=job_id)
        target.start()
        return target

    def refresh(self) -> None:
        if self.attached:  # no engine polls the stream of an attached job
            self.stream.poll()

    # -- submitting ----------------------------------------------------------------------------

    def batch_script(self) -> str:
        """faultlab's batch script: one torchrun agent per node (``faultlab.targets.slurm.node
        run``), each node's output in ``logs/<node>.log``."""
        from faultlab.targets.local import job_command

        topo = self.exp.topology
        command = job_command(self.exp, self.run_dir)
        node_cmd = [sys.executable, "-m", "faultlab.targets.slurm.node", "run",
                    "--run-dir", str(self.run_dir),
                    "--nnodes", f"{topo.effective_min_nodes}:{topo.nodes}",
                    "--nproc-per-node", str(topo.procs_per_node),
                    "--max-restarts", str(topo.max_restarts), "--", *command]
        logs = self.run_dir / "logs"
        return "\n".join([
            "#!/bin/bash",
            f"# faultlab's batch script for {self.run_dir}: one torchrun agent per node, the",
            "# c10d rendezvous on the first node. A node whose agent fails does not stop the",
            "# others (--kill-on-bad-exit=0): torchrun's elastic rendezvous decides.",
            'echo "faultlab: job $SLURM_JOB_ID restart ${SLURM_RESTART_COUNT:-0} on '
            '$SLURM_JOB_NODELIST at $(date +%s.%N)"',
            f"srun --kill-on-bad-exit=0 --ntasks-per-node=1 --open-mode=append "
            f"--output={shlex.quote(str(logs))}/%N.log {shlex.join(node_cmd)}",
            "rc=$?",
            'echo "faultlab: srun exited $rc at $(date +%s.%N)"',
            "exit $rc", ""])

    def submit_command(self, script: Path) -> list[str]:
        spec = self.spec
        assert spec is not None
        topo = self.exp.topology
        cmd = ["sbatch", "--parsable", "--job-name", f"faultlab-{self.exp.name}",
               "--chdir", str(self.run_dir), "--open-mode=append",
               "--comment", f"faultlab run {self.run_dir}"]
        if spec.script is None:
            cmd += ["--nodes", str(topo.nodes), "--ntasks-per-node", "1",
                    "--output", str(self.run_dir / "logs" / "slurm-%j.out")]
        elif not _script_sets_output(spec.script):
            cmd += ["--output", str(self.run_dir / "logs" / "slurm-%j.out")]
        if spec.partition:
            cmd += ["--partition", spec.partition]
        if spec.account:
            cmd += ["--account", spec.account]
        if spec.time_limit:
            cmd += ["--time", spec.time_limit]
        return [*cmd, *spec.sbatch_args, str(script)]

    def job_environment(self) -> dict[str, str]:
        """What the job gets on top of the submitting environment (``--export=ALL``)."""
        env = {**self.env, "FAULTLAB_RUN_DIR": str(self.run_dir), "PYTHONUNBUFFERED": "1",
               "FAULTLAB_RUNTIME_HOST": "@hostname",
               # the interpreter (and virtual environment) faultlab runs on, for a script that
               # wants the same: examples/slurm/fsdp2_dcp.sbatch
               "FAULTLAB_PYTHON": sys.executable}
        if self.exp.target.command:  # a user's trainer: level 0, through the bootstrap
            env.update(bootstrap_env())
        return env

    def start(self) -> None:
        if self.attached:
            self._follow(force=True)
            return
        assert self.spec is not None
        for sub in ("events", "logs", "slurm"):
            (self.run_dir / sub).mkdir(parents=True, exist_ok=True)
        if self.spec.script is not None:
            script = self.spec.script.resolve()
        else:
            script = self.run_dir / "slurm" / "job.sbatch"
            script.write_text(self.batch_script())
            script.chmod(0o755)
        self._submit_cmd = self.submit_command(script)
        try:
            proc = run(self._submit_cmd, env={**os.environ, **self.job_environment()})
        except SlurmError as e:
            raise TargetError(f"cannot submit the job: {e}") from None
        self.job_id = int(proc.stdout.strip().split(";")[0])
        self._t0 = time.monotonic()
        self._write_guard()
        self._follow(force=True)

    # -- following -----------------------------------------------------------------------------

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
        return SlurmJobResult(self.job_id, exit_code(job.get("ExitCode", "")),
                              set(self._lost), time.monotonic() - self._t0)

    def stop(self) -> None:
        """Cancel the job (every step on every node; Slurm continues stopped processes before
        it signals them) and wait until it has left every node; resume what faults left."""
        if self.job_id is not None and not self.attached:
            job = self._follow(force=True)
            if job is not None and job.get("JobState") not in TERMINAL:
                try:
                    run(["scancel", "--full", str(self.job_id)])
                except SlurmError as e:
                    print(f"faultlab: {e}", file=sys.stderr)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                job = self._follow(force=True)
                if job is None or job.get("JobState") in TERMINAL:
                    break
                time.sleep(0.2)
        self.restore_cluster()

    def restore_cluster(self) -> dict[str, list[str]]:
        """Resume every node a fault set down, start every machine a fault killed."""
        out: dict[str, list[str]] = {"resumed": [], "machines_started": []}
        for node in list(self._nodes_down):
            if self.resume_node(node):
                out["resumed"].append(node)
        for node in list(self._machines):
            if self.start_machine(node):
                out["machines_started"].append(node)
        return out

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

    # -- nodes and ranks -----------------------------------------------------------------------

    def agent_pids(self) -> dict[str, int]:  # pragma: no cover - not a process of this host
        raise FaultError("a Slurm job's processes are on its nodes, not on this host")

    def node_names(self) -> list[str]:
        self._follow()
        return list(self._nodes)

    def ranks(self) -> list[int]:
        self.refresh()
        return self.stream.current_ranks()

    def rank_pid(self, rank: int) -> int:
        self.refresh()
        start = self.stream.latest_start(rank)
        if start is None:
            raise FaultError(f"rank {rank} has not started (yet); ranks seen: "
                             f"{self.stream.current_ranks() or 'none'}")
        pid, node = int(start["pid"]), str(start["node"])
        self._pid_node[pid] = node  # a pid is only unique on its node
        return pid

    def node_of_rank(self, rank: int) -> str:
        self.refresh()
        start = self.stream.latest_start(rank)
        if start is None:
            raise FaultError(f"rank {rank} has not started (yet)")
        return str(start["node"])

    def assert_owned(self, pid: int) -> None:
        if pid not in self._pid_node:
            raise FaultError(f"process {pid} is not known as one of job {self.job_id}'s (ranks' "
                             f"start events, node queries); faultlab signals only the job's")

    def pids(self) -> set[int]:
        """No process of a Slurm job runs on this host."""
        return set()

    # -- acting on a node, from inside the allocation ------------------------------------------

    def on_node(self, node: str, *args: str) -> dict[str, Any]:
        """Run faultlab's node command on ``node`` as a step of the job (``--overlap``: it
        shares the CPUs the job's step holds); returns its JSON answer."""
        if self.job_id is None:
            raise FaultError("the job was not submitted")
        cmd = ["srun", "--jobid", str(self.job_id), "--overlap", "-w", node, "-N1", "-n1",
               "--quiet", "--chdir", str(self.run_dir), sys.executable, "-m",
               "faultlab.targets.slurm.node", *args, "--run-dir", str(self.run_dir)]
        try:
            proc = run(cmd, check=False, timeout_s=30)
        except SlurmError as e:
            raise FaultError(str(e)) from None
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            raise FaultError(f"{shlex.join(cmd)}: exit {proc.returncode}: "
                             f"{proc.stderr.strip()[-300:] or 'no answer'}")
        answer: dict[str, Any] = json.loads(lines[-1])
        if "t" in answer:
            self.action_t = float(answer["t"])
        for pid in answer.get("pids", []):
            self._pid_node[int(pid)] = node
        return answer

    def signal(self, pid: int, sig: int) -> bool:
        import signal as signals

        self.assert_owned(pid)
        name = signals.Signals(sig).name.removeprefix("SIG")
        answer = self.on_node(self._pid_node[pid], "signal", "--sig", name, "--pid", str(pid))
        return pid in answer.get("signalled", [])

    def node_pids(self, node: str) -> list[int]:
        return [int(p) for p in self.on_node(self._node(node), "pids")["pids"]]

    def kill_node(self, node: str, sig: int) -> list[int]:
        """Every process of the job on ``node`` at once (its agent and workers)."""
        import signal as signals

        name = signals.Signals(sig).name.removeprefix("SIG")
        self._lost.add(node)
        return [int(p) for p in self.on_node(self._node(node), "signal", "--sig", name,
                                             "--all")["signalled"]]

    def continue_all(self) -> None:
        if self.job_id is None or self.state() != "RUNNING":
            return
        for node in self.node_names():
            try:
                self.on_node(node, "signal", "--sig", "CONT", "--all")
            except FaultError:
                pass  # a node that is gone has nothing left to continue

    def _node(self, node: str) -> str:
        if node not in self.node_names():
            raise FaultError(f"no node {node!r} in job {self.job_id}; its nodes are "
                             f"{', '.join(self._nodes) or 'none (not running)'}")
        return node

    def mark_lost(self, node: str) -> None:
        self._lost.add(node)

    # -- the scheduler's own mechanisms --------------------------------------------------------

    def set_node_state(self, node: str, state: str, reason: str) -> None:
        """``scontrol update nodename=NODE state=down|drain``; recorded for the guard first."""
        assert self.spec is not None
        if not self.spec.allow_node_state_changes:
            raise FaultError(f"setting {node} {state} changes it for every user of the cluster: "
                             f"allow it with slurm.allow_node_state_changes: true")
        self._nodes_down.append(node)
        self._write_guard()
        try:
            run(["scontrol", "update", f"nodename={node}", f"state={state}",
                 f"reason={reason}"])
        except SlurmError as e:
            raise FaultError(f"{e} (changing a node's state needs Slurm operator rights)") \
                from None

    def resume_node(self, node: str) -> bool:
        """Return a node a fault set down to service; False if it was not one of those."""
        if node not in self._nodes_down:
            return False
        try:
            run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
        finally:
            self._nodes_down.remove(node)
            self._write_guard()
        return True

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

    def kill_machine(self, node: str) -> list[str]:
        """The local test cluster only: ``docker kill`` the node's container (a machine loss:
        slurmd goes with it, and Slurm must notice by itself, through ``SlurmdTimeout``)."""
        self._node(node)
        label = _docker(["inspect", "-f", "{{index .Config.Labels \"" + LAB_LABEL + "\"}}",
                         node])
        if label.returncode != 0 or label.stdout.strip() != "1":
            raise FaultError(f"{node} is not a container of the local test cluster "
                             f"(scripts/slurm-cluster.sh); on a real cluster a machine cannot "
                             f"be killed from the login node: use slurm_node_down, or "
                             f"node_kill with method: processes")
        self._machines.append(node)
        self._lost.add(node)
        self._write_guard()
        proc = _docker(["kill", node])
        if proc.returncode != 0:
            raise FaultError(f"docker kill {node}: {proc.stderr.strip()}")
        return [node]

    def start_machine(self, node: str) -> bool:
        if node not in self._machines:
            return False
        try:
            _docker(["start", node])
        finally:
            self._machines.remove(node)
            self._write_guard()
        return True

    # -- the guard -----------------------------------------------------------------------------

    def guard_state(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "cancel": not self.attached,
                "nodes_down": list(self._nodes_down), "machines": list(self._machines),
                "slurm_conf": os.environ.get("SLURM_CONF")}

    def _write_guard(self) -> None:
        self.guard_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.guard_path.with_suffix(f".{uuid.uuid4().hex[:6]}.tmp")
        tmp.write_text(json.dumps(self.guard_state()))
        os.replace(tmp, self.guard_path)

    # -- for a person --------------------------------------------------------------------------

    def describe(self) -> str:
        return (f"slurm job {self.job_id}: {shlex.join(self._submit_cmd)}"
                if self._submit_cmd else f"slurm job {self.job_id} (attached)")

    def log_tail(self, num_lines: int = 50) -> str:
        out = []
        for log in sorted((self.run_dir / "logs").glob("*.log")) + sorted(
                (self.run_dir / "logs").glob("slurm-*.out")):
            lines = log.read_text(errors="replace").splitlines()[-num_lines:]
            out.append(f"--- {log} (last {len(lines)} lines)\n" + "\n".join(lines))
        return "\n".join(out)


def _docker(args: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60)
    except (FileNotFoundError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(["docker", *args], 1, "", str(e))


def _script_sets_output(script: Path) -> bool:
    for line in script.read_text(errors="replace").splitlines():
        words = line.split()
        if words[:1] == ["#SBATCH"] and any(w.startswith(("-o", "--output")) for w in words[1:]):
            return True
    return False


def restore_from_guard(state: dict[str, Any]) -> list[str]:
    """What the guard does when faultlab died: cancel the job (unless attached), resume the
    nodes a fault set down, start the machines a fault killed. Returns what it did."""
    done = []
    env = {**os.environ, **({"SLURM_CONF": state["slurm_conf"]} if state.get("slurm_conf")
                            else {})}
    if state.get("job_id") and state.get("cancel"):
        run(["scancel", "--full", str(state["job_id"])], env=env, check=False)
        done.append(f"cancelled job {state['job_id']}")
    for node in state.get("nodes_down", []):
        run(["scontrol", "update", f"nodename={node}", "state=resume"], env=env, check=False)
        done.append(f"resumed {node}")
    for node in state.get("machines", []):
        _docker(["start", node])
        done.append(f"started machine {node}")
    return done
