"""The local Slurm test cluster for the benchmarks that run on it (``bench_slurm.py``,
``bench_soak.py --slurm-cluster``, ``bench_large.py --slurm``): ``scripts/slurm-cluster.sh``
brings it up or down, and this process's ``SLURM_CONF`` and ``FAULTLAB_SLURM_SHARED`` point at
it, as ``eval "$(scripts/slurm-cluster.sh env)"`` does in a shell."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

__all__ = ["cluster_down", "cluster_up"]

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "slurm-cluster.sh"
LAB = Path(os.environ.get("FAULTLAB_SLURM_LAB", "/var/lib/faultlab-slurm"))


def cluster_up(nodes: int = 3) -> bool:
    """Bring the cluster up with ``nodes`` nodes (root and Docker) and point this process at
    it; prints the script's last line; False if it did not come up."""
    up = subprocess.run(["bash", str(SCRIPT), "up", str(nodes)], capture_output=True,
                        text=True, check=False)
    print(up.stdout.strip().splitlines()[-1] if up.stdout.strip() else up.stderr, flush=True)
    if up.returncode != 0:
        return False
    os.environ["SLURM_CONF"] = str(LAB / "etc" / "slurm" / "slurm.conf")
    os.environ["FAULTLAB_SLURM_SHARED"] = str(LAB / "shared")
    return True


def cluster_down() -> None:
    subprocess.run(["bash", str(SCRIPT), "down"], capture_output=True, check=False)
