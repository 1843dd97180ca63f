"""``SlurmTarget``: the ``Target`` contract for a Slurm batch job, submitted or attached.

The job is started as ``job.py`` builds it, followed through the controller as
``scheduler.py`` does, and changes the cluster outside the job only as ``guard.py`` records;
this module holds the rest: the target's state, its life cycle (``start``, ``stop``) and how
its ranks and nodes are addressed. Faults reach a node the way Slurm lets a job's owner reach
it: a step inside the job's allocation, ``srun --jobid J --overlap -w NODE -N1 -n1``, running
faultlab's node command (``faultlab.targets.slurm.node``) against the node's own process table,
never the login host's. ``stop`` cancels the job (not an attached one: it is not faultlab's).
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel

from faultlab.errors import FaultError, TargetError
from faultlab.observe import EventStream
from faultlab.runtime.relay import CHANNEL_ENV, HUB_ENV
from faultlab.spec import Experiment
from faultlab.spec.launch_check import Problems
from faultlab.spec.target import TargetSpec, Topology
from faultlab.targets.base import JobContext
from faultlab.targets.slurm import site
from faultlab.targets.slurm.guard import ClusterChanges
from faultlab.targets.slurm.job import JobSubmission, prepare_job_dir
from faultlab.targets.slurm.scheduler import SchedulerView
from faultlab.targets.slurm.settings import SlurmSettings
from faultlab.targets.slurm.slurmcli import (
    TERMINAL,
    SlurmError,
    run,
    show_job,
)

__all__ = ["SlurmTarget"]


class SlurmTarget(JobSubmission, SchedulerView, ClusterChanges, JobContext):
    """One Slurm batch job of an experiment (faultlab's batch script or the user's)."""

    offers: ClassVar[frozenset[str]] = frozenset({
        "slurm_controller",  # SchedulerView, ClusterChanges: scontrol, scancel
        "node_machine",  # ClusterChanges.kill_machine (the local test cluster's containers)
    })
    settings: ClassVar[type[BaseModel] | None] = SlurmSettings
    """The block ``topology.slurm:``."""
    launch_lines: ClassVar[bool] = False
    """The batch script (faultlab's or the team's) starts the nodes."""

    @classmethod
    def check_launch(cls, target: TargetSpec, topology: Topology) -> Problems:
        if target.launch is None:
            return []
        return [(("target", "launch"), "on Slurm the batch script starts the nodes: "
                 "faultlab's, or your own (topology.slurm.script), submitted unchanged; leave "
                 "launch unset")]

    def __init__(self, exp: Experiment, run_dir: Path,
                 node_env: dict[str, dict[str, str]] | None = None, *,
                 job_id: int | None = None) -> None:
        self.exp = exp
        self.seed = exp.seed
        self.spec = exp.topology.settings
        assert self.spec is not None
        self.run_dir = run_dir.resolve()
        self.stream = EventStream(self.run_dir / "events")
        self.job_id = job_id
        """Set at submission, or given: a job that is already running (attached by id)."""
        self.attached = job_id is not None
        self.env: dict[str, str] = {}
        for env in (node_env or {}).values():
            self.env.update(env)
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

    def attach_hub(self, hub: Any) -> str | None:
        """The node relays connect to ``hub`` at ``control_host``; where no address of this
        host can be named, the job runs on the file channel (one events file per node)."""
        try:
            host = self.control_host()
        except TargetError as e:
            self.env[CHANNEL_ENV] = "file"
            return str(e)
        self.stream.attach(hub)
        self.env[HUB_ENV] = hub.address(host)
        return None

    def control_host(self) -> str:
        """The address the compute nodes reach this host at: ``FAULTLAB_CONTROL_HOST``, else
        this host's address on its route to slurmctld (``SlurmctldHost`` of ``slurm.conf``,
        else of ``scontrol show config``)."""
        if os.environ.get("FAULTLAB_CONTROL_HOST"):
            return os.environ["FAULTLAB_CONTROL_HOST"]
        ctld = _controller_address()
        if not ctld:
            raise TargetError("neither slurm.conf nor scontrol show config names the "
                              "controller (SlurmctldHost); set FAULTLAB_CONTROL_HOST")
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((socket.gethostbyname(ctld), 6817))  # no packet is sent
                return str(probe.getsockname()[0])
        except OSError as e:
            raise TargetError(f"no route to the controller at {ctld}: {e}") from None

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

    @classmethod
    def reference_site(cls, exp: Experiment) -> dict[str, Any]:
        """The cluster (``ClusterName``), and the site its nodes of ``exp``'s selection were
        last known to compute on (``faultlab.targets.slurm.site``; nothing known yet: the
        engine's reading of this host stands until the probe or a run says)."""
        cluster = site.cluster_name()
        entry = site.known(exp, cluster) or {}
        return {"cluster": cluster, **(entry.get("site") or {})}

    @classmethod
    def preflight(cls, exp: Experiment) -> list[tuple[tuple[str | int, ...], str]]:
        """What stops a job of ``exp`` before it runs, known without submitting anything
        (``faultlab.targets.slurm.preflight``): each the YAML path to change and why."""
        from faultlab.targets.slurm.preflight import preflight

        return preflight(exp)

    @classmethod
    def probe_site(cls, exp: Experiment) -> None:
        """Before a golden run is looked up: one ``srun`` on a node of the selection, unless
        its site is known (``site.probe``); raises ``TargetError`` where the nodes do not see
        the runs root."""
        site.probe(exp, site.cluster_name())

    @classmethod
    def site_seen(cls, exp: Experiment, reported: dict[str, Any], source: str) -> bool:
        """A run's rank 0 reported ``reported``: the nodes' site of the selection from now on
        (``site.learn``); whether that changed it."""
        return site.learn(exp, site.cluster_name(), reported, source)

    @classmethod
    def golden_cache_dir(cls, exp: Experiment, default: Path) -> Path:
        """The shared runs root's ``.golden`` (``topology.slurm.run_dir``): every experiment of
        a suite, from whichever login node, finds it."""
        try:
            assert exp.topology.settings is not None
            return exp.topology.settings.runs_root() / ".golden"
        except ValueError:  # no shared root: prepare_run_dir says so when the run starts
            return default

    @classmethod
    def code_files(cls, exp: Experiment) -> list[Path]:
        """The team's batch script: it is the job a golden run submits."""
        slurm = exp.topology.settings
        return [Path(slurm.script)] if slurm is not None and slurm.script is not None else []

    @classmethod
    def prepare_run_dir(cls, exp: Experiment, run_folder: Path) -> Path:
        """On the cluster's shared filesystem (``prepare_job_dir``)."""
        try:
            return prepare_job_dir(exp, run_folder)
        except (OSError, ValueError) as e:
            raise TargetError(f"topology.slurm.run_dir: "
                              f"{str(e).removeprefix('slurm.run_dir: ')}") from None

    def refresh(self) -> None:
        if self.attached:  # no engine polls the stream of an attached job
            self.stream.poll()

    # -- submitting ----------------------------------------------------------------------------

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
        self.guard_now()  # the job id, for the guard, before anything else can fail
        self._follow(force=True)

    # -- following -----------------------------------------------------------------------------

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


def _controller_address() -> str:
    """slurmctld's address (or name): the first ``SlurmctldHost=name(addr)`` of the
    configuration file (``SLURM_CONF``), else of ``scontrol show config``; "" if neither."""
    conf = Path(os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
    try:
        text = conf.read_text(errors="replace")
    except OSError:
        text = ""
    if "SlurmctldHost" not in text:
        try:
            text = run(["scontrol", "show", "config"], timeout_s=10).stdout
        except SlurmError:
            return ""
    for line in text.splitlines():
        key, _, value = line.partition("=")
        value = value.strip().split()[0] if value.strip() else ""
        if key.strip().startswith(("SlurmctldHost", "ControlMachine")) and value:
            return value[value.index("(") + 1:-1] if value.endswith(")") else value
    return ""
