"""The golden run's reference is keyed by the machines it ran on, and a reference from other
hardware is never used (issue 53, part 5).

- ``faultlab.runtime.site`` reads a node's GPUs and driver from ``/proc/driver/nvidia`` (a
  directory laid out as the driver lays it out stands for a GPU node here), rank 0's
  ``start`` record carries the site;
- on Slurm the key carries the nodes' site (kept per cluster and selection: a login host
  without GPUs keys an H100 partition's reference by the H100s), and a run that reports other
  hardware moves it;
- the judge refuses a reference whose site differs from the run's: bitwise and within-noise
  are not measured, the note says which hardware; the runner then drops the entry
  (``refuse_other_hardware``).

On the real cluster, tests/slurm/test_slurm_experiments.py checks that the key carries what the
nodes report (one ``srun`` probe on a node), and that the probe refuses a run directory the
nodes do not see.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from faultlab.engine.golden import GoldenRun, golden_key, golden_run, reference_site
from faultlab.engine.golden_site import refuse_other_hardware
from faultlab.judge import judge
from faultlab.observe import compute_metrics
from faultlab.observe.site import other_hardware, run_site
from faultlab.runtime.events import EventLog, read_events
from faultlab.runtime.site import describe, difference, nvidia_driver, nvidia_gpus, site
from faultlab.spec import experiment_from_dict
from faultlab.targets.slurm import site as slurm_site
from tests.unit.test_engine import INJECTED, KILL, _run_events, exp_with

H100 = "NVIDIA H100 80GB HBM3"
CLUSTER = slurm_site.cluster_name()  # None here, unless a test cluster answers


def gpu_node(root: Path, models: list[str], driver: str = "550.54.15") -> Path:
    """``root`` laid out as the NVIDIA driver lays out ``/proc/driver/nvidia``."""
    nv = root / "proc" / "driver" / "nvidia"
    for i, model in enumerate(models):
        bus = nv / "gpus" / f"0000:{0x18 + i:02x}:00.0"
        bus.mkdir(parents=True)
        (bus / "information").write_text(
            f"Model: \t\t {model}\nIRQ:   \t\t 95\nGPU UUID: \t GPU-{i:08d}\n"
            f"Bus Location: \t 0000:{0x18 + i:02x}:00.0\nDevice Minor: \t {i}\n")
    (nv / "version").write_text(
        f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {driver}  Release Build  "
        f"(dvs-builder@U16-I3-B03-4-3)  Tue Mar  5 22:23:56 UTC 2024\nGCC version:  gcc 12\n")
    return root


def test_a_gpu_node_is_read_from_the_drivers_proc_files_without_touching_a_device(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = gpu_node(tmp_path, [H100] * 8)
    assert nvidia_gpus(root) == [H100] * 8 and nvidia_driver(root) == "550.54.15"
    # torch built without CUDA cannot use them: the job computes on the CPU
    here = site(4, root=root)
    assert here["accelerator"] == "cpu" and here["cpu"] and here["world_size"] == 4
    monkeypatch.setattr(torch.version, "cuda", "12.8")  # a CUDA build of torch
    gpu = site(4, root=root)
    assert (gpu["accelerator"], gpu["accelerator_count"], gpu["driver"], gpu["cuda"],
            gpu["cpu"]) == (H100, 8, "550.54.15", "12.8", None)
    assert not torch.cuda.is_initialized()
    assert describe(gpu, ("accelerator", "driver")) == f"{H100} x8, driver 550.54.15"


def test_two_sites_differ_in_what_decides_the_bits_not_in_the_world_size() -> None:
    a100 = {"accelerator": "NVIDIA A100-SXM4-80GB", "accelerator_count": 8,
            "driver": "535.104.05", "torch": "2.13.0", "cuda": "12.8", "nccl": "2.28.9",
            "cpu": None, "world_size": 16}
    h100 = {**a100, "accelerator": H100, "driver": "550.54.15", "world_size": 8}
    assert difference(a100, {**a100, "world_size": 2}) == ""
    assert difference(a100, None) == "" and difference(None, a100) == ""
    assert other_hardware(a100, h100) == (
        "reference from other hardware (NVIDIA A100-SXM4-80GB x8, driver 535.104.05 vs "
        f"{H100} x8, driver 550.54.15)")


def test_rank_0s_start_record_carries_its_site(tmp_path: Path) -> None:
    for rank in (0, 1):
        EventLog(tmp_path / "events", rank=rank, world_size=2, node="node0",
                 restart=0).emit("start", resumed_from_step=0)
    records = read_events(tmp_path / "events")
    by_rank = {r["rank"]: r for r in records}
    assert "site" not in by_rank[1]
    assert by_rank[0]["site"] == site(2) and by_rank[0]["site"]["torch"] == torch.__version__
    assert run_site(records) == site(2)


def slurm_exp(partition: str | None = None, **expect: Any) -> Any:
    slurm = {"partition": partition} if partition else {}
    return experiment_from_dict({"name": "s", "topology": {"nodes": 2, "launcher": "slurm",
                                                           "slurm": slurm},
                                 "expect": expect or {"completes": True}})


def test_on_slurm_the_key_carries_the_nodes_site_not_the_submit_hosts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAULTLAB_SLURM_SHARED", str(tmp_path))
    exp = slurm_exp("gpu")
    host = reference_site(exp)  # nothing known of the nodes yet: this host's site
    assert host["accelerator"] == site()["accelerator"] and host["target"] == "slurm"
    before = golden_key(exp)
    nodes = {**site(), "accelerator": H100, "accelerator_count": 8, "driver": "550.54.15",
             "cpu": None}
    # what the probe or a run on the partition's nodes reported
    assert slurm_site.learn(exp, CLUSTER, nodes, "probe on gpu-17 (srun)")
    where = reference_site(exp)
    assert (where["accelerator"], where["accelerator_count"], where["driver"]) == \
        (H100, 8, "550.54.15")
    assert golden_key(exp) != before
    # kept per selection: another partition's nodes are not these
    other = slurm_exp("cpu")
    assert reference_site(other)["accelerator"] == host["accelerator"]
    entry = json.loads(slurm_site.sites_file(exp, CLUSTER).read_text())  # type: ignore[union-attr]
    assert entry["source"] == "probe on gpu-17 (srun)" and "world_size" not in entry["site"]
    # the same report again changes nothing; another one (a driver upgrade) does
    assert not slurm_site.learn(exp, CLUSTER, nodes, "golden run x")
    assert slurm_site.learn(exp, CLUSTER, {**nodes, "driver": "560.28.03"}, "run y")
    assert reference_site(exp)["driver"] == "560.28.03"


def test_the_probe_selection_follows_sbatch_and_the_script(tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH -p gpu -C h100\nsrun x\n")
    exp = experiment_from_dict({"name": "s", "topology": {"nodes": 2, "launcher": "slurm",
        "slurm": {"script": str(script), "account": "ml",
                  "sbatch_args": ["--gres=gpu:8", "--exclusive", "-w", "gpu-[1-2]"]}}})
    assert slurm_site.selection(exp) == ["--partition=gpu", "--constraint=h100",
                                         "--account=ml", "--gres=gpu:8",
                                         "--nodelist=gpu-[1-2]"]


def golden_from(site_: dict[str, Any] | None, digest: str = "abc") -> GoldenRun:
    return GoldenRun(key="k", digest=digest, losses={1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0},
                     wall_s=1.0, run_dir="", cached=True, site=site_,
                     second={"digest": digest, "losses": {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}})


def test_a_reference_from_other_hardware_is_not_used_by_the_verdict() -> None:
    exp = exp_with(KILL, "  completes: true\n  bitwise_equal_to_golden: true\n"
                         "  matches_golden_within_noise: 3\n")
    here = site(1)
    events = [{**e, "site": here} if e["kind"] == "start" else e for e in _run_events("abc")]
    metrics = compute_metrics(events, INJECTED)
    a100 = {**here, "accelerator": "NVIDIA A100-SXM4-80GB", "accelerator_count": 8,
            "driver": "535.104.05", "cpu": None}

    def slas(golden: GoldenRun) -> dict[str, Any]:
        return {s.name: s for s in judge(exp, metrics, golden, timed_out=False,
                                         faults=INJECTED, events=events)}

    same = slas(golden_from(dict(here)))  # the same site: judged, and equal
    assert same["bitwise_equal_to_golden"].passed and same["bitwise_equal_to_golden"].measured
    assert same["matches_golden_within_noise"].passed
    other = slas(golden_from(a100))  # the same digest, from A100s: never a pass
    note = other_hardware(a100, here)
    assert note.startswith("reference from other hardware (NVIDIA A100-SXM4-80GB x8, driver "
                           "535.104.05 vs cpu (")
    for key in ("bitwise_equal_to_golden", "matches_golden_within_noise"):
        assert other[key].measured is None and not other[key].passed, other[key]
        assert other[key].inconclusive, other[key]  # never a pass, nor a failure of recovery
        assert other[key].note.startswith(f"not measured: {note}"), other[key].note
    assert other["completes"].note == same["completes"].note  # what needs none: as ever
    # a golden run that reported no site (a trainer writing its own records): the key decides
    assert slas(golden_from(None))["bitwise_equal_to_golden"].passed


def test_a_refused_reference_is_dropped_and_the_next_run_keys_the_nodes_it_met(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAULTLAB_SLURM_SHARED", str(tmp_path / "shared"))
    exp = slurm_exp(bitwise_equal_to_golden=True)
    a100 = {**site(), "accelerator": "NVIDIA A100-SXM4-80GB", "accelerator_count": 8,
            "driver": "535.104.05", "cpu": None}
    assert slurm_site.learn(exp, CLUSTER, a100, "probe on a100-1 (srun)")
    key = golden_key(exp)
    cache = tmp_path / "golden"
    cache.mkdir()
    entry = {"digest": "abc", "losses": {"1": 1.0}, "wall_s": 1.0, "run_dir": str(tmp_path),
             "site": a100, "checkpoints_outside": []}
    (cache / f"{key}.json").write_text(json.dumps(entry))
    old = golden_run(exp, cache, timeout_s=1)  # cached, the nodes known: nothing runs
    assert old.cached and old.site == a100
    h100 = {**a100, "accelerator": H100, "driver": "550.54.15"}
    events = [{"kind": "start", "rank": 0, "t": 1.0, "site": h100}]  # the run met H100s
    note = refuse_other_hardware(exp, cache, old, events, "run r")
    assert note == other_hardware(a100, h100) and not (cache / f"{key}.json").exists()
    assert golden_key(exp) != key and reference_site(exp)["accelerator"] == H100
    # an entry another process wrote since (another site) is not dropped by a stale refusal
    (cache / f"{key}.json").write_text(json.dumps({**entry, "site": h100}))
    refuse_other_hardware(exp, cache, old, events, "run r")
    assert (cache / f"{key}.json").exists()
