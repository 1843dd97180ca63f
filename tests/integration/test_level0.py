"""Integration level 0 end to end: an unmodified FSDP2 + DCP trainer (examples/fsdp2_dcp) under
plain torchrun, 2 ranks, with nothing but faultlab's bootstrap on PYTHONPATH. The records are
read with observe's own reader, as the engine would read them.

Launch 1 trains steps 1-4 and checkpoints at 2 and 4; launch 2 resumes from step_4, with a
planned grad_nan at step 5 (the first step after the resume, so the step the agent is told
before the first backward of a process must be the resumed one) and trains to step 6.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from faultlab.observe.stream import EventStream
from faultlab.runtime.bootstrap import bootstrap_env
from faultlab.runtime.plan import write_plan
from tests.unit.runtime_entries import entries

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TRAINER = REPO / "examples" / "fsdp2_dcp" / "train.py"
LAUNCH_TIMEOUT_S = 240


def _launch(run_dir: Path, ckpt_dir: Path, steps: int, **env: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", str(TRAINER), "--steps", str(steps), "--ckpt-every", "2", "--ckpt-dir",
           str(ckpt_dir)]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTLAB_")}
    full_env.update(FAULTLAB_RUN_DIR=str(run_dir), **env)
    full_env.update(bootstrap_env(full_env))
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=full_env, cwd=REPO, capture_output=True, text=True,
                          timeout=LAUNCH_TIMEOUT_S, check=False)
    output = (proc.stdout + proc.stderr).splitlines()
    if proc.returncode != 0 or any("faultlab bootstrap:" in line for line in output):
        tail = "\n".join(output[-50:])
        pytest.fail(f"launch failed (rc {proc.returncode}, {time.monotonic() - t0:.1f} s):\n"
                    f"  PYTHONPATH={full_env['PYTHONPATH']} FAULTLAB_BOOTSTRAP=1 "
                    f"FAULTLAB_RUN_DIR={run_dir} {' '.join(cmd)}\n--- last 50 lines ---\n{tail}")


def _by_pid(records: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        out.setdefault(r["pid"], []).append(r)
    return out


def test_an_unmodified_trainer_is_observed_and_resumes_with_its_step(tmp_path: Path) -> None:
    run_dir, ckpt_dir = tmp_path / "run", tmp_path / "ckpt"
    stream = EventStream(run_dir)

    _launch(run_dir, ckpt_dir, steps=4)
    first = stream.poll()
    starts = [r for r in first if r["kind"] == "start"]
    assert sorted(r["rank"] for r in starts) == [0, 1], "one start per rank, none for the agent"
    assert all(r["level"] == 0 and r["world_size"] == 2 for r in starts)
    assert stream.current_ranks() == [0, 1]
    for rank in (0, 1):
        steps = [r for r in first if r["kind"] == "step" and r["rank"] == rank]
        assert [r["step"] for r in steps] == [1, 2, 3, 4]
        assert {r["step_source"] for r in steps} == {"optimizer_state"}
    saved = [r for r in first if r["kind"] == "checkpoint_saved"]
    assert [(r["rank"], r["step"], r["path"]) for r in saved] == \
        [(0, 2, str(ckpt_dir / "step_2")), (0, 4, str(ckpt_dir / "step_4"))]
    assert all(r["bytes"] > 0 and r["async"] is False for r in saved)
    exits = [r for r in first if r["kind"] == "exit"]
    assert sorted((r["rank"], r["reason"], r["code"], r["step"]) for r in exits) == \
        [(0, "completed", 0, 4), (1, "completed", 0, 4)]

    plan = write_plan(run_dir / "runtime" / "plan.json", entries([
        {"id": "nan", "type": "grad_nan", "ranks": [1], "steps": [5],
         "params": {"param_glob": "blocks.0.*"}}]))
    _launch(run_dir, ckpt_dir, steps=6, FAULTLAB_RUNTIME_PLAN=str(plan))
    second = stream.poll()
    assert stream.current_ranks() == [0, 1] and stream.max_step() == 6
    for pid, records in _by_pid(second).items():
        kinds = [r["kind"] for r in records]
        rank = records[0]["rank"]
        assert kinds[0] == "start" and kinds[1] == "checkpoint_loaded", (pid, kinds)
        loaded = records[1]
        assert (loaded["step"], loaded["step_source"], loaded["path"]) == \
            (4, "optimizer_state", str(ckpt_dir / "step_4"))
        steps = [r for r in records if r["kind"] == "step"]
        assert [(r["step"], r["step_source"]) for r in steps] == \
            [(5, "optimizer_state"), (6, "optimizer_state")]
        assert loaded["t"] < steps[0]["t"]
        struck = [r for r in records if r["kind"] == "fault_injected"]
        if rank == 1:
            (nan,) = struck
            assert nan["step"] == 5 and nan["fault_id"] == "nan"
            assert nan["params"] and all(p.startswith("blocks.0.") for p in nan["params"])
        else:
            assert struck == []
        assert records[-1]["kind"] == "exit" and records[-1]["reason"] == "completed"
    assert [r["step"] for r in second if r["kind"] == "checkpoint_saved"] == [6]
