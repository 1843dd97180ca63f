"""The engine's side of in-rank faults (launch plan, secret) and the post-run checkpoint scan."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from fsdp_helpers import Recorder, build_fsdp, train_step
from torch.distributed.device_mesh import DeviceMesh

from faultlab.engine.checkpoints import scan_checkpoints
from faultlab.engine.runner import _struck
from faultlab.engine.runtime_plan import RuntimeSetup, planned_victim_ranks, read_secret
from faultlab.observe import EventStream, FaultRecord
from faultlab.spec import experiment_from_dict
from reference_trainer.checkpoint import CheckpointManager

DOC = {
    "name": "plan",
    "target": {"trainer": "reference", "preset": "tiny"},
    "topology": {"nodes": 2, "procs_per_node": 1},
    "run": {"steps": 30, "checkpoint_every": 10},
    "faults": [
        {"id": "nan", "type": "grad_nan", "target": {"rank": 1}, "trigger": {"at_step": 12}},
        {"id": "spike", "type": "loss_spike", "target": "all", "trigger": {"at_step": 5}},
        {"id": "live-nan", "type": "grad_inf", "target": {"node": 1},
         "trigger": {"at_step": 7}},
        {"id": "timed", "type": "grad_nan", "target": {"rank": 0},
         "trigger": {"at_time_s": 3}},
        {"id": "slow", "type": "collective_delay", "target": {"rank": 0},
         "trigger": {"at_step": 4}, "duration_s": 2, "params": {"delay_ms": 10}},
        {"id": "window", "type": "collective_delay", "target": {"rank": 1},
         "trigger": {"at_step": 6}, "params": {"delay_ms": 10, "num_steps": 3}},
    ],
}


def test_only_step_triggered_numeric_faults_on_known_ranks_are_planned(tmp_path: Path) -> None:
    exp = experiment_from_dict(DOC)
    assert [planned_victim_ranks(exp, i) for i in range(6)] == [
        [1], None, False, False, False, [1]]
    setup = RuntimeSetup.create(exp, tmp_path)
    assert setup.planned == {0: [1], 1: None, 5: [1]}
    plan = json.loads((tmp_path / "runtime" / "plan.json").read_text())
    assert [(f["id"], f["type"], f["ranks"], f["steps"], f.get("from_step"), f.get("to_step"))
            for f in plan["faults"]] == [
        ("nan", "grad_nan", [1], [12], None, None), ("spike", "loss_spike", None, [5], None, None),
        ("window", "collective_delay", [1], None, 6, 8)]
    assert "num_steps" not in plan["faults"][2]["params"]  # the window is the entry's
    secret_file = tmp_path / "runtime" / "secret"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    assert read_secret(tmp_path) == setup.secret and len(setup.secret) >= 32
    assert setup.env == {"FAULTLAB_RUNTIME_SECRET": setup.secret, "FAULTLAB_CHANNEL": "socket",
                         "FAULTLAB_RUNTIME_PLAN": str(tmp_path / "runtime" / "plan.json"),
                         # the faults injected live by step: "slow" at 4, "live-nan" at 7
                         "FAULTLAB_STEP_GATES": "4,7", "FAULTLAB_STEP_GATE_TIMEOUT_S": "60"}
    assert RuntimeSetup.create(exp, tmp_path).secret != setup.secret  # one per launch
    assert read_secret(tmp_path / "elsewhere") is None


def test_checkpoint_scan_finds_a_saved_nan_and_skips_what_does_not_verify(
        mesh: DeviceMesh, tmp_path: Path) -> None:
    model, optimizer = build_fsdp(mesh)
    mgr = CheckpointManager(tmp_path, keep=10, async_save=False, rank=0, world_size=1,
                            process_group=dist.group.WORLD, emit=Recorder().emit,
                            beat=lambda: None)
    state = {"config": {"seed": 0, "preset": "tiny"},
             "sampler": {"consumed": 0, "global_batch": 12}}
    train_step(model, optimizer, seed=1)
    mgr.save(10, model, optimizer, {"step": 10, **state})
    with torch.no_grad():  # what a NaN that slipped past every check would leave behind
        next(model.parameters()).to_local()[0] = float("nan")
    mgr.save(20, model, optimizer, {"step": 20, **state})
    train_step(model, optimizer, seed=3)
    mgr.save(30, model, optimizer, {"step": 30, **state})
    damaged = tmp_path / "step_00000030" / "MANIFEST.json"
    damaged.write_text(damaged.read_text().replace('"step"', '"stpe"'))

    scan = scan_checkpoints(tmp_path)
    assert [Path(p).name for p in scan.checked] == ["step_00000010", "step_00000020"]
    [(bad_path, keys)] = scan.nonfinite.items()
    assert Path(bad_path).name == "step_00000020"
    first = next(iter(dict(model.named_parameters())))
    assert f"model.{first}" in keys
    assert list(scan.not_read) == [str(tmp_path / "step_00000030")]
    assert scan.all_finite is False
    assert scan_checkpoints(tmp_path / "empty").all_finite is None


def test_a_struck_window_fault_records_its_planned_step_window(tmp_path: Path) -> None:
    """The journal's record of a windowed collective_delay carries its window, which is what
    ``slowdown`` compares with the steps before it (tests/unit/test_observe_metrics.py)."""
    exp = experiment_from_dict(DOC)
    strike = {"t": 5.0, "kind": "fault_injected", "fault_id": "window", "type": "collective_delay",
              "step": 6, "rank": 1, "source": "plan", "op": "all_reduce"}

    def target(*events: dict[str, object]) -> SimpleNamespace:
        run = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        (run / "events").mkdir(parents=True)
        (run / "events" / "rank1.jsonl").write_text("".join(json.dumps(e) + "\n"
                                                            for e in events))
        stream = EventStream(run)
        stream.poll()
        return SimpleNamespace(stream=stream)

    records: list[FaultRecord] = []
    assert _struck(exp, 5, target(strike), records)  # type: ignore[arg-type]
    assert records[0].details["window_steps"] == [6, 8]
    assert records[0].details["ranks"] == [1] and records[0].injected_t == 5.0
    assert _struck(exp, 0, target(  # type: ignore[arg-type]
        {**strike, "fault_id": "nan", "type": "grad_nan", "step": 12}), records)
    assert "window_steps" not in records[1].details  # a one-step fault has no window
