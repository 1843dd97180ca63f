"""What stops a Slurm job before it runs, known without submitting anything (``faultlab
validate``, and ``faultlab run`` before its golden run).

From the experiment alone:
- a run directory on a node-local filesystem (``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/run``):
  every node has its own, so the ranks' events and checkpoints never reach faultlab, nor the
  other nodes;
- ``sbatch_args`` that take the job out of faultlab's hands: ``--export`` without ``ALL`` (the
  job would not get ``FAULTLAB_RUN_DIR``), ``--nodes`` (the job's size is ``topology.nodes``,
  for the golden run too), ``--chdir``, ``--array``, ``--hold``, ``--wait``, ``--test-only``;
  the same in a team script's ``#SBATCH`` lines where the command line does not override them
  (``--export``, ``--array``, ``--hold``).

Where the cluster answers here (``scontrol``, ``sinfo``):
- no shared runs root (neither ``run_dir`` nor ``$FAULTLAB_SLURM_SHARED``);
- a partition the cluster does not have, or fewer nodes in it than ``topology.nodes`` (the job
  would wait forever);
- a runs root the nodes were last probed not to see (``faultlab.targets.slurm.site``).

Each problem is ``(yaml path, message)``: the field to change and why, the bad value shown.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from faultlab.spec import Experiment
from faultlab.targets.slurm import site
from faultlab.targets.slurm.settings import SLURM_SHARED_ENV
from faultlab.targets.slurm.slurmcli import SlurmError, run

__all__ = ["NODE_LOCAL", "preflight"]

NODE_LOCAL = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"), Path("/run"))
"""Directories every node of a cluster has its own of."""

_REFUSED = {"--nodes": ("-N", "the job's size is topology.nodes (the golden run's too): set it "
                              "there"),
            "--chdir": ("-D", "faultlab runs the job in its run directory: set "
                              "topology.slurm.run_dir"),
            "--array": ("-a", "an array is many jobs; faultlab follows one"),
            "--hold": ("-H", "a held job never starts"),
            "--wait": ("-W", "sbatch would not return until the job ended"),
            "--test-only": (None, "nothing would be submitted")}
_SCRIPT_REFUSED = ("--array", "--hold")  # faultlab's command line overrides the others

Problems = list[tuple[tuple[str | int, ...], str]]


def preflight(exp: Experiment) -> Problems:
    """Every problem of ``exp``'s Slurm job that is known before it runs (module docstring)."""
    spec = exp.topology.settings
    assert spec is not None
    out: Problems = []
    if spec.run_dir is not None and (local := _node_local(spec.run_dir)):
        out.append((("topology", "slurm", "run_dir"),
                     f"{str(spec.run_dir)!r} is under {str(local)!r}, which every node has its "
                     f"own of: the ranks' events and checkpoints would never reach faultlab "
                     f"nor the other nodes; give a directory on the filesystem every node "
                     f"mounts at the same path"))
    for i, arg in enumerate(spec.sbatch_args):
        why = _refused(arg, _REFUSED, "topology.slurm.sbatch_args")
        if why:
            out.append((("topology", "slurm", "sbatch_args", i), why))
    if spec.script is not None:
        out += _script(spec.script)
    if shutil.which("sinfo") is not None and (cluster := site.cluster_name()) is not None:
        out += _cluster(exp, cluster)
    return out


def _node_local(path: Path) -> Path | None:
    return next((p for p in NODE_LOCAL if path == p or p in path.parents), None)


def _refused(arg: str, refused: dict[str, tuple[str | None, str]], where: str) -> str:
    """Why ``arg`` (an sbatch option as given) stops the job; '' if it does not."""
    name, _, value = arg.partition("=")
    if name == "--export":
        if "ALL" in value.upper().split(","):
            return ""
        return (f"{arg!r}: the job would not get faultlab's environment (FAULTLAB_RUN_DIR, "
                f"the runtime's settings), so neither it nor its golden run could report; "
                f"leave --export out of {where}, or give it ALL "
                f"(--export=ALL{',' + value if value else ''})")
    for long, (short, why) in refused.items():
        if name == long or (short and arg.startswith(short)):
            return f"{arg!r}: {why}; remove it from {where}"
    return ""


def _script(script: Path) -> Problems:
    out: Problems = []
    try:
        lines = script.read_text(errors="replace").splitlines()
    except OSError:
        return out  # the spec refuses a missing script
    refused = {k: v for k, v in _REFUSED.items() if k in _SCRIPT_REFUSED}
    for number, line in enumerate(lines, 1):
        words = line.split()
        if words[:1] != ["#SBATCH"]:
            continue
        for word in words[1:]:
            why = _refused(word, refused, "the script")
            if why:
                out.append((("topology", "slurm", "script"), f"{str(script)}:{number}: {why}"))
    return out


def _cluster(exp: Experiment, cluster: str) -> Problems:
    spec = exp.topology.settings
    assert spec is not None
    out: Problems = []
    if spec.run_dir is None and not os.environ.get(SLURM_SHARED_ENV):
        out.append((("topology", "slurm"),
                    f"no run_dir, and ${SLURM_SHARED_ENV} is not set here: the job's files "
                    f"need a directory every node of cluster {cluster!r} mounts at the same "
                    f"path; set topology.slurm.run_dir"))
    else:
        entry = site.known(exp, cluster)
        if entry is not None and entry.get("shared") is False:
            out.append((("topology", "slurm", "run_dir"), site.not_shared(exp, entry)
                        .removeprefix("topology.slurm.run_dir: ")))
    sizes = _partitions()
    if not sizes:
        return out
    default = next((p for p, (_n, is_default) in sizes.items() if is_default), None)
    partition = spec.partition or default
    if spec.partition is not None and spec.partition not in sizes:
        out.append((("topology", "slurm", "partition"),
                    f"{spec.partition!r} is not a partition of cluster {cluster!r}; its "
                    f"partitions: {', '.join(sorted(sizes))}"))
    elif partition is not None and exp.topology.nodes > sizes[partition][0]:
        out.append((("topology", "nodes"),
                    f"{exp.topology.nodes} nodes, but partition {partition!r} of cluster "
                    f"{cluster!r} has {sizes[partition][0]}: the job would wait forever; ask "
                    f"for at most {sizes[partition][0]}, or name a larger partition "
                    f"(topology.slurm.partition)"))
    return out


def _partitions() -> dict[str, tuple[int, bool]]:
    """Partition → (its nodes, whether it is the default), from ``sinfo``; {} if it fails."""
    try:
        out = run(["sinfo", "-h", "-o", "%P %D"], timeout_s=10).stdout
    except SlurmError:
        return {}
    sizes: dict[str, tuple[int, bool]] = {}
    for line in out.splitlines():
        name, _, count = line.strip().partition(" ")
        if not name or not count.strip().isdigit():
            continue
        bare = name.rstrip("*")
        total = sizes.get(bare, (0, False))[0] + int(count)
        sizes[bare] = (total, name.endswith("*") or sizes.get(bare, (0, False))[1])
    return sizes
