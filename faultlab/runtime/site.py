"""Where a process computes: the site a golden run's reference is keyed and checked by.

Rank 0's ``start`` record carries it (``EventLog`` adds it there, so the reference trainer, a
level-0 trainer and any trainer on faultlab's emitter all write it), the engine reads it on the
host for local and docker nodes, and the slurm target runs it on a node of the partition
(``python -m faultlab.runtime.site``, one ``srun``) to learn the nodes' before a run. The same
function everywhere, so two reports of one machine are equal.

    {"accelerator": "NVIDIA H100 80GB HBM3", "accelerator_count": 8, "driver": "550.54.15",
     "torch": "2.13.0", "cuda": "12.8", "nccl": "2.28.9", "cpu": null, "world_size": 16}

- **accelerator**, **accelerator_count**, **driver**: the node's NVIDIA GPUs and kernel driver,
  read from ``/proc/driver/nvidia`` (no CUDA context is made: the rank's own device choice and
  memory stay untouched); ``cpu`` and 0 where there is none, or where this torch cannot use one
  (a build without CUDA). The count is the node's, not ``CUDA_VISIBLE_DEVICES``'s: the same
  answer on the login host of a GPU node, in each rank and in the probe. Where no NVIDIA driver
  answers but torch has already initialised its device API (ROCm), torch's own names.
- **torch**, **cuda**, **nccl**: the versions this process runs (``torch.version.cuda``, the
  NCCL torch loaded); None where torch is not imported.
- **cpu**: the CPU's model name when the job computes on CPUs (vector units change the last
  bits of a CPU matmul); None on a GPU site.
- **world_size**: recorded, never compared: the topology already keys it.

``difference`` says how two sites differ in what decides the bits (``COMPARED``). This module
imports only the standard library; ``site`` reads ``torch`` only where the process has already
imported it (``main`` imports it).
"""

from __future__ import annotations

import json
import platform
import re
import sys
from pathlib import Path
from typing import Any

__all__ = ["COMPARED", "describe", "difference", "main", "site"]

COMPARED = ("accelerator", "accelerator_count", "driver", "torch", "cuda", "nccl", "cpu")
"""The fields that decide the bits a job computes: a reference from a site that differs in one
of them is not this job's reference."""

_VERSION = re.compile(r"\d+\.\d+(\.\d+)*")


def site(world_size: int | None = None, *, root: Path = Path("/")) -> dict[str, Any]:
    """This process's site (module docstring); ``root``: where ``/proc`` is looked for."""
    torch = sys.modules.get("torch")
    version = getattr(torch, "version", None)
    cuda = getattr(version, "cuda", None)
    out: dict[str, Any] = {
        "accelerator": "cpu", "accelerator_count": 0, "driver": None,
        "torch": getattr(torch, "__version__", None), "cuda": cuda,
        "nccl": _nccl(torch) if cuda else None, "cpu": None, "world_size": world_size}
    models = nvidia_gpus(root)
    if models and (torch is None or cuda):
        out.update(accelerator=" + ".join(sorted(set(models))), accelerator_count=len(models),
                   driver=nvidia_driver(root))
    elif torch is not None and _initialised(torch):
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        out.update(accelerator=" + ".join(sorted(set(names))), accelerator_count=len(names))
    if out["accelerator"] == "cpu":
        out["cpu"] = cpu_model(root)
    return out


def nvidia_gpus(root: Path = Path("/")) -> list[str]:
    """The model of every NVIDIA GPU of the node (``/proc/driver/nvidia/gpus/*/information``,
    bus order); empty without the driver."""
    models = []
    for info in sorted((root / "proc/driver/nvidia/gpus").glob("*/information")):
        try:
            text = info.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Model" and value.strip():
                models.append(value.strip())
                break
    return models


def nvidia_driver(root: Path = Path("/")) -> str | None:
    """The NVIDIA kernel driver's version (``/proc/driver/nvidia/version``), or None."""
    try:
        first = (root / "proc/driver/nvidia/version").read_text(errors="replace")
    except OSError:
        return None
    # "NVRM version: NVIDIA UNIX [Open Kernel Module for] x86_64  550.54.15  Release Build ..."
    line = first.splitlines()[0] if first else ""
    return next((w for w in line.split() if _VERSION.fullmatch(w)), None)


def cpu_model(root: Path = Path("/")) -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the machine's architecture."""
    try:
        text = (root / "proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() == "model name" and value.strip():
            return " ".join(value.split())
    return platform.machine() or "unknown"


def _nccl(torch: Any) -> str | None:
    try:  # ncclGetVersion: a library call, no device is touched
        v = torch.cuda.nccl.version()
    except Exception:  # a build without NCCL
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def _initialised(torch: Any) -> bool:
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:
        return False


def describe(s: dict[str, Any], fields: tuple[str, ...] = COMPARED) -> str:
    """``fields`` of a site in a few words: ``NVIDIA H100 80GB HBM3 x8, driver 550.54.15``."""
    words = []
    if {"accelerator", "accelerator_count", "cpu"} & set(fields):
        accelerator, count = s.get("accelerator"), s.get("accelerator_count") or 0
        if accelerator == "cpu":
            words.append(f"cpu ({s['cpu']})" if s.get("cpu") else "cpu")
        else:
            words.append(f"{accelerator} x{count}" if count else str(accelerator))
    words += [f"{name} {s.get(name) or 'none'}" for name in ("driver", "torch", "cuda", "nccl")
              if name in fields]
    return ", ".join(words)


def difference(reference: dict[str, Any] | None, run: dict[str, Any] | None) -> str:
    """How the ``run``'s site differs from its ``reference``'s, ``A vs B`` over the fields that
    differ; '' when they agree, or when either is unknown (None: nothing to compare)."""
    if not reference or not run:
        return ""
    differ = tuple(f for f in COMPARED if reference.get(f) != run.get(f))
    if not differ:
        return ""
    return f"{describe(reference, differ)} vs {describe(run, differ)}"


TOKEN_WAIT_S = 3.0
"""How long the probe looks again for a token file it does not see at once (a file just made
on another host of a shared filesystem can take a moment to appear)."""


def main() -> int:
    """Print this node's site as one JSON line (the slurm target's probe), with the node's
    name and, for each token file named, whether this node sees it."""
    import socket
    import time

    import torch  # noqa: F401 - the versions are torch's

    deadline = time.monotonic() + TOKEN_WAIT_S
    seen = {arg: Path(arg).is_file() for arg in sys.argv[1:]}
    while not all(seen.values()) and time.monotonic() < deadline:
        time.sleep(0.5)
        seen = {arg: Path(arg).is_file() for arg in sys.argv[1:]}
    print(json.dumps({"site": site(), "node": socket.gethostname(), "seen": seen}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
