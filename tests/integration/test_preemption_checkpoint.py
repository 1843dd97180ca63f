"""An emergency checkpoint taken mid-step holds exactly the state of the last completed step.

A notice caught at a block boundary abandons the step in flight (forward or backward half
done, some FSDP2 blocks unsharded) and saves the previous step. That save must equal, tensor
for tensor, what a clean stop at the same step saves (``--stop-after``): model, optimizer
state, every rank's RNG state and the trainer state. Two real 2-rank jobs of the ``tiny``
preset; the notice comes from the fake AWS metadata endpoint the trainer polls.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from faultlab.metadata import MetadataServer
from faultlab.runtime.events import read_events
from faultlab.targets.launcher import LocalJob
from reference_trainer.config import TrainConfig
from reference_trainer.plugin import command

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def wait_for(run_dir: Path, pred: Any, timeout_s: float = 240) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        events = read_events(run_dir / "events") if (run_dir / "events").exists() else []
        if pred(events):
            return events
        assert time.monotonic() < deadline, f"timed out; last events: {events[-5:]}"
        time.sleep(0.02)


def state_of(path: Path, tmp: Path) -> dict[str, Any]:
    dcp_to_torch_save(str(path), str(tmp / f"{path.parent.parent.name}.pt"))
    sd = torch.load(tmp / f"{path.parent.parent.name}.pt", weights_only=True)
    flat: dict[str, Any] = {}

    def walk(obj: Any, key: str) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{key}.{k}")
        elif isinstance(obj, list | tuple):
            for i, v in enumerate(obj):
                walk(v, f"{key}[{i}]")
        else:
            flat[key] = obj
    walk(sd, "")
    for name in ("trainer_state.json", *(f"rng/rank{r}.json" for r in (0, 1))):
        flat[name] = json.loads((path / name).read_text())
    return flat


def test_mid_step_emergency_checkpoint_equals_a_clean_stop_at_that_step(tmp_path: Path) -> None:
    cfg = dict(preset="tiny", steps=40, checkpoint_every=1000, seed=0, preemption_poll_s=0.05)
    servers = {n: MetadataServer("aws", node=n, imds_v2_required=True).start()
               for n in ("node0", "node1")}
    preempted = tmp_path / "preempted"
    try:
        with LocalJob(command=command(TrainConfig(run_dir=preempted, **cfg)), run_dir=preempted,
                      nodes=2, min_nodes=1,
                      max_restarts=0, node_env={n: s.env() for n, s in servers.items()}) as job:
            wait_for(preempted, lambda ev: any(e["kind"] == "step" and e["step"] >= 6
                                               for e in ev))
            time.sleep(0.07)  # into the next step's forward or backward
            servers["node1"].announce_preemption(notice_s=60)
            events = wait_for(preempted, lambda ev: len([e for e in ev if e["kind"] == "exit"])
                              >= 2)
            job.wait(timeout_s=60)
    finally:
        for s in servers.values():
            s.stop()
    [saved] = [e for e in events if e["kind"] == "checkpoint_saved" and e.get("emergency")]
    exits = [e for e in events if e["kind"] == "exit"]
    assert {e["code"] for e in exits} == {5}
    assert {e["reason"] for e in exits} == {"preempted", "peer_preempted"}
    k = saved["step"]
    assert not saved.get("reused") and {e["step"] for e in exits} == {k}
    last_done = max(e["step"] for e in events if e["kind"] == "step")
    assert k == last_done  # nothing completed is lost, nothing half-done is saved

    clean = tmp_path / "clean"
    with LocalJob(command=command(TrainConfig(run_dir=clean, stop_after=k, **cfg)),
                  run_dir=clean, nodes=2) as job:
        assert job.wait(timeout_s=240).ok

    name = f"step_{k:08d}"
    got = state_of(preempted / "checkpoints" / name, tmp_path)
    want = state_of(clean / "checkpoints" / name, tmp_path)
    # the runs' configs differ only where they must: the clean run was told where to stop
    for state, run_dir in ((got, preempted), (want, clean)):
        config = state["trainer_state.json"]["config"]
        assert config.pop("run_dir") == str(run_dir)
        assert config.pop("stop_after") == (k if run_dir == clean else None)
    assert got.keys() == want.keys()
    differ = [key for key in want if not (
        torch.equal(got[key], want[key]) if isinstance(want[key], torch.Tensor)
        else got[key] == want[key])]
    assert differ == [], f"caught at {exits[0].get('caught')!r}; differing: {differ[:10]}"
