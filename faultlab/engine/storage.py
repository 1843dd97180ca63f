"""Which directory the storage faults' passthrough serves, and the mount's place in a run.

A run with a fault whose class declares ``mounts_storage`` (``Fault.mounts_storage``: the
built-in storage faults) serves the job's checkpoint directory through the FUSE passthrough
(``faultlab.storage``) from before the launch to after the job stopped; every other run is
unchanged. The directory is the reference trainer's ``{run_dir}/checkpoints``, or for a user's
command ``target.checkpoint_dir``, else its first checkpoint-like argument under ``{run_dir}``
(``--ckpt-dir {run_dir}/ckpt``; a file argument, ``--save-path {run_dir}/model.pt``, serves its
directory): ``faultlab.spec.checkpoint_args.checkpoint_dir_of``. Without either, or with a
fixed checkpoint path, the experiment does not load: faultlab never mounts over a directory
the trainer does not use, nor over a team's own checkpoints.
"""

from __future__ import annotations

from pathlib import Path

from faultlab.errors import FaultlabError
from faultlab.spec import Experiment
from faultlab.spec.checkpoint_args import RUN_DIR, checkpoint_dir_of

__all__ = ["needs_exact_mount", "needs_storage_mount", "storage_dir"]


def needs_storage_mount(exp: Experiment) -> bool:
    """Does a fault of ``exp`` declare ``mounts_storage`` (``Fault.mounts_storage``)?"""
    return any(f.fault_class.mounts_storage for f in exp.faults)


def needs_exact_mount(exp: Experiment) -> bool:
    """Must every lookup reach the passthrough (a fault of ``exp`` declares
    ``Fault.needs_exact_mount``: a node's own view of the directory)?"""
    return any(f.fault_class.needs_exact_mount for f in exp.faults)


def storage_dir(exp: Experiment, job_dir: Path, source: Path | None = None) -> Path:
    """The directory the passthrough serves for this run (see the module docstring)."""
    root = job_dir.resolve()
    if not exp.target.command:
        return root / "checkpoints"
    template, why = checkpoint_dir_of(exp.target.command, exp.target.checkpoint_dir)
    if template is None:  # the spec refuses it first; an experiment built around it lands here
        raise FaultlabError(f"{source or exp.name}: target: the storage faults: {why}")
    path = Path(template.replace(RUN_DIR, str(root)))
    if exp.target.checkpoint_dir is not None:
        return path
    return path.parent if path.suffix and not path.is_dir() else path
