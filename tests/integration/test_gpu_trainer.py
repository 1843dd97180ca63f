"""The reference trainer's answers to a failing GPU, in one real trainer process each (no
torchrun: the single-process path of ``reference_trainer.train``), its GPU faults delivered as
faultlab delivers them (the node's GPU state file, the bootstrap on PYTHONPATH): an OOM retried
once then named in exit code 8, and a lost GPU found by the health check at start (exit 7).
The multi-node answers run as the shipped experiments (experiments/gpu_*.yaml)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from faultlab.runtime.bootstrap import BOOTSTRAP_DIR
from faultlab.runtime.events import read_events
from faultlab.runtime.gpu import write_state
from reference_trainer.health import EXIT_CODES
from tests.unit.runtime_entries import gpu_entry

pytestmark = pytest.mark.integration


def _train(run_dir: Path, faults: list[dict[str, Any]]) -> tuple[int, list[dict[str, Any]]]:
    state = run_dir / "gpu" / "state.json"
    write_state(state, faults)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAULTLAB_", "RANK",
                                                                     "WORLD_SIZE", "LOCAL_"))}
    env.update(PYTHONPATH=str(BOOTSTRAP_DIR), FAULTLAB_GPU_STATE=str(state), LOCAL_RANK="0",
               FAULTLAB_GPU_COUNT="1")
    proc = subprocess.run([sys.executable, "-m", "reference_trainer.train", "--run-dir",
                           str(run_dir), "--preset", "tiny", "--steps", "3",
                           "--checkpoint-every", "3"], env=env, capture_output=True, text=True,
                          timeout=180)
    return proc.returncode, read_events(run_dir / "events")


def test_oom_is_retried_once_then_named_in_the_exit(tmp_path: Path) -> None:
    code, events = _train(tmp_path, [
        gpu_entry(f"oom{i}", "gpu_oom", leave_mib=256, devices=[0]) for i in (1, 2)])
    ooms = [e for e in events if e["kind"] == "anomaly" and e["what"] == "gpu_oom"]
    assert [e["action"] for e in ooms] == ["retry", "exit"] and ooms[0]["step"] == 1
    [exit_] = [e for e in events if e["kind"] == "exit"]
    assert code == EXIT_CODES["gpu_oom"] == exit_["code"] and exit_["reason"] == "gpu_oom"
    assert exit_["error"].startswith("torch.OutOfMemoryError: CUDA out of memory.")


def test_one_oom_is_absorbed_by_the_retry(tmp_path: Path) -> None:
    code, events = _train(tmp_path, [gpu_entry("oom", "gpu_oom", leave_mib=256, devices=[0])])
    assert code == 0 and [e["step"] for e in events if e["kind"] == "step"] == [1, 2, 3]
    assert [e["action"] for e in events if e.get("what") == "gpu_oom"] == ["retry"]


def test_a_lost_gpu_found_at_start_makes_the_rank_leave(tmp_path: Path) -> None:
    code, events = _train(tmp_path, [gpu_entry("lost", "gpu_error", xid=79, sticky=True,
                                               devices=[0], t=0.0)])
    [health] = [e for e in events if e["kind"] == "gpu_health"]
    assert health["status"] == "unhealthy"
    assert health["reasons"] == ["GPU is lost (NVMLError_GpuIsLost)"]
    [exit_] = [e for e in events if e["kind"] == "exit"]
    assert code == EXIT_CODES["gpu_unhealthy"] and exit_["reason"] == "gpu_unhealthy"
    assert not [e for e in events if e["kind"] == "step"]
