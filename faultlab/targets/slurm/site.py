"""Where a Slurm job's nodes compute, known before a run: one probe per cluster and partition.

A login node is not a compute node: on a GPU cluster it has no GPU, and its driver, CUDA and
NCCL need not be the nodes'. The golden run's cache key therefore carries the *nodes'* site
(``faultlab.runtime.site``), kept in ``<runs root>/.sites/<cluster>-<hash>.json``, one file per
cluster and node selection (partition, account, the options of ``sbatch_args`` and of a team
script's ``#SBATCH`` lines that choose nodes). It is learnt two ways:

- **the probe** (``probe``): before the first golden run of such a selection, one ``srun``
  (one node, one task, the same selection, waiting at most ``PROBE_WAIT_S`` for an
  allocation) runs ``python -m faultlab.runtime.site`` on a node, which also says whether it
  sees a token file faultlab wrote in the runs root (a run directory the nodes do not share
  cannot run: ``NotShared``);
- **what the runs report** (``learn``): every golden run's and experiment's rank 0 writes its
  site in its ``start`` record; when it differs from the file (a driver upgraded, the probe
  could not run), the file takes it, so the next lookup uses the right key.

``known`` reads the file; it runs nothing (``faultlab validate`` uses it).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from faultlab.errors import NotShared
from faultlab.runtime.site import COMPARED
from faultlab.spec import Experiment
from faultlab.targets.slurm.slurmcli import SlurmError, run

__all__ = ["PROBE_WAIT_S", "NotShared", "cluster_name", "known", "learn", "probe",
           "selection", "sites_file"]

PROBE_WAIT_S = 60
"""How long the probe waits for a node (``srun --immediate``); past it, the key is this host's
until a run reports the nodes' site."""

_SELECTING = {"--partition": "-p", "--account": "-A", "--constraint": "-C", "--gres": None,
              "--gpus": "-G", "--gpus-per-node": None, "--gpus-per-task": None,
              "--nodelist": "-w", "--exclude": "-x", "--qos": "-q", "--reservation": None,
              "--clusters": "-M", "--cluster-constraint": None}
"""sbatch options that choose which nodes a job gets (their short forms): the probe passes
them to ``srun``, and they tell one selection's site file from another's."""



def cluster_name() -> str | None:
    """``ClusterName`` of ``scontrol show config`` (None: no cluster answers here)."""
    try:
        out = run(["scontrol", "show", "config"], timeout_s=10).stdout
    except SlurmError:
        return None
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "ClusterName":
            return value.strip()
    return None


def selection(exp: Experiment) -> list[str]:
    """The options that choose ``exp``'s nodes, as ``srun`` takes them: partition, account,
    and those of ``sbatch_args`` and of the team script's ``#SBATCH`` lines (command line
    last: it overrides the script, as for ``sbatch``)."""
    spec = exp.topology.settings
    assert spec is not None
    args = []
    if spec.script is not None:
        for line in spec.script.read_text(errors="replace").splitlines():
            if line.startswith("#SBATCH"):
                args += line.split()[1:]
    args += [f"--partition={spec.partition}"] if spec.partition else []
    args += [f"--account={spec.account}"] if spec.account else []
    return _selecting([*args, *spec.sbatch_args])  # in sbatch's order: the last one counts


def _selecting(args: list[str]) -> list[str]:
    out, i = [], 0
    shorts = {s: long for long, s in _SELECTING.items() if s}
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=")
        long = name if name in _SELECTING else shorts.get(arg[:2])
        if long is None:
            i += 1
            continue
        if name in _SELECTING and eq:
            out.append(f"{long}={value}")
        elif name in _SELECTING or arg in shorts:  # the value is the next word
            out.append(f"{long}={args[i + 1]}" if i + 1 < len(args) else long)
            i += 1
        else:  # -pgpu
            out.append(f"{long}={arg[2:]}")
        i += 1
    return out


def sites_file(exp: Experiment, cluster: str | None) -> Path | None:
    """Where the nodes' site of ``exp``'s selection is kept (None: no shared runs root)."""
    assert exp.topology.settings is not None
    try:
        root = exp.topology.settings.runs_root()
    except ValueError:
        return None
    digest = hashlib.sha256(json.dumps(selection(exp)).encode()).hexdigest()[:12]
    return root / ".sites" / f"{cluster or 'cluster'}-{digest}.json"


def known(exp: Experiment, cluster: str | None) -> dict[str, Any] | None:
    """What is known of the nodes of ``exp``'s selection (``site``, ``source``, ``t``,
    ``shared``), without running anything; None: nothing yet."""
    path = sites_file(exp, cluster)
    try:
        entry = json.loads(path.read_text()) if path is not None else None
    except (OSError, ValueError):
        return None
    return entry if isinstance(entry, dict) else None


def learn(exp: Experiment, cluster: str | None, site: dict[str, Any], source: str) -> bool:
    """A run of ``exp`` reported its rank 0's site: keep it where it differs from what was
    known. Returns whether it changed."""
    path = sites_file(exp, cluster)
    mine = {k: site.get(k) for k in COMPARED}
    before = known(exp, cluster)
    if path is None or (before is not None and before.get("site") == mine):
        return False
    _write(path, {"site": mine, "source": source, "t": time.time(),
                  "shared": (before or {}).get("shared", True)})
    return True


def probe(exp: Experiment, cluster: str | None) -> dict[str, Any] | None:
    """Run the probe unless the nodes' site is known and they were seen to share the runs
    root; returns what is known after it (None: it could not run). Raises ``NotShared``."""
    entry = known(exp, cluster)
    path = sites_file(exp, cluster)
    if path is None or (entry is not None and entry.get("shared") is True):
        return entry
    path.parent.mkdir(parents=True, exist_ok=True)
    token = path.parent / f"probe-{os.getpid()}-{time.time_ns()}.token"
    token.write_text("faultlab probe\n")
    try:
        answer = _srun(exp, token)
    finally:
        token.unlink(missing_ok=True)
    if answer is None:
        return entry
    shared = bool(answer.get("seen", {}).get(str(token)))
    entry = {"site": {k: answer["site"].get(k) for k in COMPARED}, "shared": shared,
             "source": f"probe on {answer.get('node')} (srun)", "t": time.time()}
    _write(path, entry)
    if not shared:
        raise NotShared(not_shared(exp, entry))
    return entry


def not_shared(exp: Experiment, entry: dict[str, Any]) -> str:
    """The refusal of a runs root the nodes did not see (the probe's ``entry``)."""
    assert exp.topology.settings is not None
    root = exp.topology.settings.runs_root()
    return (f"topology.slurm.run_dir: the nodes do not see {str(root)!r} (the {entry['source']} "
            f"at {time.strftime('%Y-%m-%d %H:%M', time.localtime(entry['t']))} found no file "
            f"faultlab wrote there), so no run of {exp.name!r}, its golden run included, can "
            f"start: give a directory on the filesystem every node mounts at the same path")


def _srun(exp: Experiment, token: Path) -> dict[str, Any] | None:
    assert exp.topology.settings is not None
    cmd = ["srun", "--nodes=1", "--ntasks=1", "--job-name=faultlab-site", "--quiet",
           f"--immediate={PROBE_WAIT_S}", f"--chdir={token.parent}", *selection(exp),
           sys.executable, "-m", "faultlab.runtime.site", str(token)]
    try:
        proc = run(cmd, timeout_s=PROBE_WAIT_S + 120, check=False)
    except SlurmError:
        return None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return answer if isinstance(answer, dict) and isinstance(answer.get("site"), dict) \
        else None


def _write(path: Path, entry: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(entry))
    os.replace(tmp, path)
