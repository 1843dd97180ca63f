"""A team's entry point, written the way many are: it names the run after its Slurm allocation,
then runs the unchanged FSDP2 + DCP trainer of examples/fsdp2_dcp with the same arguments.

Outside an allocation it cannot start (``KeyError: 'SLURM_JOB_ID'``): its reference run has to
be computed on the cluster, as the same batch job without faults.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

RUN_NAME = f"fsdp2-{os.environ['SLURM_JOB_ID']}"  # the allocation names the run

if __name__ == "__main__":
    if os.environ.get("RANK", "0") == "0":
        print(f"run {RUN_NAME} on {os.environ.get('SLURM_JOB_NODELIST', '?')}", flush=True)
    sys.argv[0] = str(Path(__file__).resolve().parents[1] / "fsdp2_dcp" / "train.py")
    runpy.run_path(sys.argv[0], run_name="__main__")
