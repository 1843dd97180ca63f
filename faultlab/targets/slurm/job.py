"""How a Slurm job is started: its directory, the batch script, the ``sbatch`` command line.

The run directory is on the cluster's shared filesystem (``slurm.run_dir``, made by
``prepare_job_dir``): the ranks write their events, logs and checkpoints there, and faultlab, on
the login node, reads them at the same path. ``JobSubmission`` is the part of ``SlurmTarget``
that builds what ``start`` submits: faultlab's own batch script (one torchrun agent per
allocated node through ``srun``, the c10d rendezvous on the first node, the registered trainer
or ``target.command`` as each rank) or the user's own script (``slurm.script``), unchanged, and
the environment exported to it.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from faultlab.runtime.bootstrap import bootstrap_env
from faultlab.spec import Experiment
from faultlab.targets.slurm.settings import SlurmSettings

__all__ = ["JobSubmission", "prepare_job_dir"]


def prepare_job_dir(exp: Experiment, run_folder: Path) -> Path:
    """The run's job directory on the shared filesystem (``slurm.run_dir``), named after the
    run folder, with ``run_folder/job`` a link to it; returns the shared path."""
    assert exp.topology.settings is not None
    shared = (exp.topology.settings.runs_root() / run_folder.name).resolve()
    shared.mkdir(parents=True, exist_ok=True)
    os.chmod(shared, 0o755)
    link = run_folder / "job"
    if not link.exists():
        link.symlink_to(shared, target_is_directory=True)
    return shared


class JobSubmission:
    """``SlurmTarget``'s submission: the batch script, the ``sbatch`` line, the job's
    environment (``start`` submits them)."""

    exp: Experiment
    spec: SlurmSettings | None
    run_dir: Path
    env: dict[str, str]

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
        # topology.nodes is the job's size for every run of the experiment, the golden run's
        # included: on the command line it overrides a team script's #SBATCH --nodes (which
        # made an 8-node experiment run on the script's 2 nodes, and its golden run on 8).
        cmd += ["--nodes", str(topo.nodes)]
        if spec.script is None:
            cmd += ["--ntasks-per-node", "1",
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


def _script_sets_output(script: Path) -> bool:
    for line in script.read_text(errors="replace").splitlines():
        words = line.split()
        if words[:1] == ["#SBATCH"] and any(w.startswith(("-o", "--output")) for w in words[1:]):
            return True
    return False
