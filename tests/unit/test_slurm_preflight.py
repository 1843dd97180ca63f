"""``faultlab validate`` (and ``faultlab run``, before its golden run) refuses a Slurm job that
cannot run, located at the field to change (``faultlab.targets.slurm.preflight``). These are
the problems the document alone shows; what only the cluster can say (a partition it does not
have, too few nodes, a run directory its nodes do not see) is checked on the real cluster in
tests/slurm."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from faultlab.cli import main as cli_main

EXPERIMENT = """\
name: s
target: {trainer: reference, preset: tiny}
topology:
  nodes: 2
  launcher: slurm
  slurm:
    run_dir: RUN_DIR
    sbatch_args: [--exclusive, --export=NONE, -N4]
expect: {completes: true}
"""


def test_a_node_local_run_dir_and_sbatch_args_that_take_the_job_away_are_refused(
        tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(EXPERIMENT.replace("RUN_DIR", "/tmp/faultlab-runs"))
    assert cli_main(["validate", str(path)]) == 2
    err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert f"{path}:7 topology.slurm.run_dir: '/tmp/faultlab-runs' is under '/tmp', which " \
           f"every node has its own of" in err, err
    assert f"{path}:8 topology.slurm.sbatch_args[1]: '--export=NONE': the job would not get " \
           f"faultlab's environment" in err and "--export=ALL,NONE" in err, err
    assert f"{path}:8 topology.slurm.sbatch_args[2]: '-N4': the job's size is topology.nodes" \
        in err, err
    assert "sbatch_args[0]" not in err and "nothing was run" in err
    # faultlab run refuses it the same way, before its golden run: nothing is launched
    assert cli_main(["run", str(path), "--report-dir", str(tmp_path / "r")]) == 2
    assert not (tmp_path / "r").exists()


def test_a_teams_script_that_holds_the_job_or_drops_the_environment_is_refused(
        tmp_path: Path, capsys: Any) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --hold\n"
                      "#SBATCH --export=NONE\nsrun python train.py\n")
    path = tmp_path / "s.yaml"
    path.write_text(EXPERIMENT.replace("RUN_DIR", str(tmp_path / "shared"))
                    .replace("sbatch_args: [--exclusive, --export=NONE, -N4]",
                             f"script: {script}"))
    assert cli_main(["validate", str(path)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{path}:8 topology.slurm.script: {script}:3: '--hold': a held job never starts; " \
           f"remove it from the script" in err, err
    assert f"{script}:4: '--export=NONE'" in err and "--nodes" not in err, err
