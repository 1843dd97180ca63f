"""Integration level 0 without torchrun: when the bootstrap activates and how it chains
(subprocesses, most without torch), and what the observer records in this process (a tiny
model: steps and their source, the primary optimizer, checkpoints, numeric faults, an explicit
attach). The 2-rank FSDP2 + DCP job is in tests/integration/test_level0.py."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint.state_dict as dcp_state_dict
from torch import nn

from faultlab import runtime
from faultlab.runtime import auto, auto_checkpoints
from faultlab.runtime.bootstrap import BOOTSTRAP_DIR, bootstrap_env
from faultlab.runtime.bootstrap.sitecustomize import should_activate
from faultlab.runtime.identity import Identity
from faultlab.runtime.plan import write_plan
from tests.unit.runtime_entries import entries

WORKER = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
PROBE = ("import os, sys; print(json.dumps({'finder': any(type(f).__name__ == "
         "'PostImportFinder' for f in sys.meta_path), 'torch': 'torch' in sys.modules, "
         "'owner': os.environ.get('FAULTLAB_BOOTSTRAP_PID'), 'pid': os.getpid(), "
         "'user': getattr(sys.modules.get('sitecustomize'), 'USER_SITECUSTOMIZE', False)}))")


# --- the bootstrap: activation rules and chaining (subprocesses) ------------------------------

def _python(code: str, env: dict[str, str],
            timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("FAULTLAB_") and k not in (*WORKER, "PYTHONPATH")}
    return subprocess.run([sys.executable, "-c", code], env={**base, **env}, text=True,
                          capture_output=True, timeout=timeout_s, check=False)


def _probe(env: dict[str, str]) -> dict[str, Any]:
    proc = _python(f"import json; {PROBE}", env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _bootstrapped(run_dir: Path, **extra: str) -> dict[str, str]:
    env = {"FAULTLAB_RUN_DIR": str(run_dir), **extra}
    return {**env, **bootstrap_env(env)}


@pytest.fixture
def user_site(tmp_path: Path) -> Path:
    """A user's own sitecustomize, later on PYTHONPATH than the bootstrap."""
    site = tmp_path / "usersite"
    site.mkdir()
    (site / "sitecustomize.py").write_text("USER_SITECUSTOMIZE = True\n")
    return site


@pytest.mark.parametrize("env,active", [
    ({}, False),
    ({"FAULTLAB_BOOTSTRAP": "1"}, False),  # no run directory
    ({"FAULTLAB_RUN_DIR": "/r"}, False),  # not asked for
    ({"FAULTLAB_RUN_DIR": "/r", "FAULTLAB_BOOTSTRAP": "1"}, False),  # torchrun's agent
    ({"FAULTLAB_RUN_DIR": "/r", "FAULTLAB_BOOTSTRAP": "1", "WORLD_SIZE": "2"}, False),
    ({"FAULTLAB_RUN_DIR": "/r", "FAULTLAB_BOOTSTRAP": "0", **WORKER}, False),
    ({"FAULTLAB_RUN_DIR": "/r", "FAULTLAB_BOOTSTRAP": "1", **WORKER}, True),
    ({"FAULTLAB_RUN_DIR": "/r", "FAULTLAB_BOOTSTRAP": "1", **WORKER,
      "FAULTLAB_BOOTSTRAP_PID": "7"}, False),  # a child of an activated worker
    ({"FAULTLAB_RUN_DIR": "/r", "FAULTLAB_BOOTSTRAP": "1", **WORKER,
      "FAULTLAB_BOOTSTRAP_PID": "42"}, True),  # the worker itself after an exec
])
def test_it_activates_only_in_a_faultlab_torchrun_worker(env: dict[str, str],
                                                          active: bool) -> None:
    assert should_activate(env, pid=42) is active


def test_a_worker_gets_the_hook_but_not_torch_and_the_user_sitecustomize_still_runs(
        tmp_path: Path, user_site: Path) -> None:
    env = _bootstrapped(tmp_path, **WORKER, PYTHONPATH=str(user_site))
    assert env["PYTHONPATH"].split(os.pathsep) == [str(BOOTSTRAP_DIR), str(user_site)]
    seen = _probe(env)
    assert seen["finder"] and not seen["torch"], "torch must not be imported eagerly"
    assert seen["owner"] == str(seen["pid"])
    assert seen["user"], "the user's sitecustomize was shadowed, not chained"


@pytest.mark.parametrize("missing", ["RANK", "LOCAL_RANK"])
def test_the_torchrun_agent_process_is_left_alone(tmp_path: Path, user_site: Path,
                                                  missing: str) -> None:
    env = _bootstrapped(tmp_path, **WORKER, PYTHONPATH=str(user_site))
    del env[missing]
    seen = _probe(env)
    assert not seen["finder"] and seen["owner"] is None
    assert seen["user"]


def test_a_child_of_a_worker_is_left_alone(tmp_path: Path) -> None:
    seen = _probe(_bootstrapped(tmp_path, **WORKER, FAULTLAB_BOOTSTRAP_PID="1"))
    assert not seen["finder"]


SCRIPT = """
import sys, torch
model = torch.nn.Linear(4, 2)
opt = torch.optim.AdamW(model.parameters())
for _ in range(2):
    model(torch.ones(3, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
print("trainer done", flush=True)
"""


@pytest.mark.parametrize("ending,reason,code", [
    ("", "completed", 0),
    ("sys.exit(3)", "error", 3),
    ("raise ValueError('boom')", "error", 1),
    # the fix for the abort at exit (finding abort_at_exit): leave without finalizing
    ("import os; sys.stdout.flush(); os._exit(0)", "completed", 0),
    ("import os; os._exit(5)", "error", 5),
])
def test_a_bootstrapped_process_reports_start_steps_and_exit(
        tmp_path: Path, ending: str, reason: str, code: int) -> None:
    proc = _python(SCRIPT + ending, _bootstrapped(tmp_path, **WORKER))
    assert proc.returncode == code, proc.stderr
    assert "trainer done" in proc.stdout
    assert "faultlab bootstrap:" not in proc.stderr
    records = _records(tmp_path)
    assert [r["kind"] for r in records] == ["start", "step", "step", "exit"]
    start, exit_ = records[0], records[-1]
    assert start["level"] == 0 and start["resumed_from_step"] is None
    assert start["t_main"] >= start["t_bootstrap"] >= start["t_process_created"] - 0.05
    assert [r["step"] for r in records[1:3]] == [1, 2]
    assert (exit_["reason"], exit_["code"], exit_["step"]) == (reason, code, 2)
    if ending.startswith("raise"):
        assert exit_["error"] == "ValueError: boom"
        assert "Traceback" in proc.stderr  # the previous excepthook still ran


def test_an_error_inside_the_bootstrap_is_one_line_and_the_program_goes_on(
        tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    proc = _python(SCRIPT, _bootstrapped(not_a_dir, **WORKER))
    assert proc.returncode == 0 and "trainer done" in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if "faultlab bootstrap:" in line]
    assert len(lines) == 1 and lines[0].startswith("faultlab bootstrap: "), proc.stderr


# --- the observer in this process ------------------------------------------------------------

def _records(run_dir: Path, kind: str | None = None) -> list[dict[str, Any]]:
    out = []
    for path in sorted((run_dir / "events").glob("*-level0.jsonl")):
        out += [json.loads(line) for line in path.read_text().splitlines()]
    out.sort(key=lambda r: r["t"])
    return [r for r in out if kind is None or r["kind"] == kind]


@pytest.fixture
def observe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Start observers in this process (no exit hooks); each is stopped after the test."""
    monkeypatch.setenv("FAULTLAB_RUN_DIR", str(tmp_path))
    monkeypatch.setattr(runtime, "_current", None)  # attach() leaves its agent there
    for key in ("FAULTLAB_RUNTIME_PLAN", "FAULTLAB_RUNTIME_SECRET"):
        monkeypatch.delenv(key, raising=False)
    started: list[auto.Observer] = []

    def start(plan: list[dict[str, Any]] | None = None) -> auto.Observer:
        if started:
            started[-1].stop()
        if plan is not None:
            monkeypatch.setenv("FAULTLAB_RUNTIME_PLAN",
                               str(write_plan(tmp_path / "plan.json", entries(plan))))
        obs = auto.Observer(Identity(run_dir=tmp_path, rank=0, world_size=1, restart=0,
                                     node="node0", pid=os.getpid()))
        obs.start(exit_hooks=False)
        started.append(obs)
        return obs

    yield start
    for obs in started:
        obs.stop()


def _model(width: int = 8) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 2))


def _train(model: nn.Sequential, opt: torch.optim.Optimizer, num_steps: int,
           skip_nonfinite: bool = False) -> int:
    """A plain loop; with ``skip_nonfinite`` a non-finite gradient skips the step and redoes
    it. Returns how many iterations were skipped."""
    skipped = done = 0
    while done < num_steps:
        width = next(model.parameters()).shape[-1]  # the first Linear's in_features
        model(torch.ones(4, width)).square().mean().backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if skip_nonfinite and not all(torch.isfinite(g).all() for g in grads):
            opt.zero_grad()
            skipped += 1
            assert skipped < 5, "the same NaN struck again and again"
            continue
        opt.step()
        opt.zero_grad()
        done += 1
    return skipped


def test_steps_come_from_the_primary_optimizers_state(observe: Any, tmp_path: Path) -> None:
    observe()
    model, other = _model(), _model()
    adam = torch.optim.Adam(model.parameters())
    sgd = torch.optim.SGD(other.parameters(), lr=0.1)
    _train(model, adam, 2)
    _train(other, sgd, 3)  # not the primary: the first optimizer that stepped is
    _train(model, adam, 1)
    steps = _records(tmp_path, "step")
    assert [(r["step"], r["step_source"]) for r in steps] == \
        [(1, "optimizer_state"), (2, "optimizer_state"), (3, "optimizer_state")]
    assert all(r["step_time_s"] >= 0 for r in steps)


def test_get_state_dicts_initialising_step_is_not_a_step(observe: Any, tmp_path: Path) -> None:
    observe()
    model = _model()
    adam = torch.optim.AdamW(model.parameters())
    dcp_state_dict.get_state_dict(model, adam)  # steps an empty optimizer with zero grads
    assert float(adam.state[next(model.parameters())]["step"]) == 1
    _train(model, adam, 2)
    assert [r["step"] for r in _records(tmp_path, "step")] == [1, 2]


def test_a_resume_continues_the_optimizers_step_and_names_the_checkpoint(
        observe: Any, tmp_path: Path) -> None:
    observe()
    model = _model()
    adam = torch.optim.Adam(model.parameters())
    _train(model, adam, 3)
    ckpt = tmp_path / "ckpt" / "model.pt"
    ckpt.parent.mkdir()
    torch.save({"model": model.state_dict(), "optim": adam.state_dict()}, ckpt)
    torch.save({"loss": torch.tensor(1.0), "lr": 1e-3}, tmp_path / "metrics.pt")  # not one
    saved = _records(tmp_path, "checkpoint_saved")
    assert [(r["step"], r["path"], r["async"]) for r in saved] == [(3, str(ckpt), False)]
    assert saved[0]["bytes"] == ckpt.stat().st_size

    observe()  # a new process, as far as the observer can tell
    model = _model()
    adam = torch.optim.Adam(model.parameters())
    state = torch.load(ckpt)
    model.load_state_dict(state["model"])
    adam.load_state_dict(state["optim"])
    _train(model, adam, 2)
    loaded = _records(tmp_path, "checkpoint_loaded")
    assert [(r["step"], r["step_source"], r["path"]) for r in loaded] == \
        [(3, "optimizer_state", str(ckpt))]
    assert [r["step"] for r in _records(tmp_path, "step")][-2:] == [4, 5]
    assert loaded[0]["t"] < _records(tmp_path, "step")[-2]["t"]


def test_a_load_that_raises_is_reported_and_still_raises(observe: Any, tmp_path: Path) -> None:
    """A torn checkpoint (a full disk cut last.ckpt short): the trainer reached its load and
    it failed. That is evidence its resume path ran (observe.metrics.reached_load), so the
    failure is a record; the exception is the trainer's, unchanged."""
    observe()
    torn = tmp_path / "last.ckpt"
    torn.write_bytes(b"PK\x03\x04 not a whole zip")
    with pytest.raises(RuntimeError, match="PytorchStreamReader"):
        torch.load(torn)
    (failed,) = _records(tmp_path, "checkpoint_load_failed")
    assert failed["path"] == str(torn) and "PytorchStreamReader" in failed["error"]
    assert _records(tmp_path, "checkpoint_loaded") == []


def test_without_a_step_in_the_state_steps_are_counted_from_the_checkpoints_path(
        observe: Any, tmp_path: Path) -> None:
    observe()
    model = _model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    _train(model, sgd, 2)
    ckpt = tmp_path / "step_00000020" / "state.pt"
    ckpt.parent.mkdir()
    torch.save({"model": model.state_dict(), "optim": sgd.state_dict()}, ckpt)  # small, but
    sgd.load_state_dict(torch.load(ckpt)["optim"])  # it holds an optimizer's state_dict
    _train(model, sgd, 1)
    assert [(r["step"], r["step_source"]) for r in _records(tmp_path, "step")] == \
        [(1, "counted"), (2, "counted"), (21, "counted")]
    loaded = _records(tmp_path, "checkpoint_loaded")
    assert [(r["step"], r["step_source"]) for r in loaded] == [(20, "path")]


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_saves_sync_and_async_and_a_load_are_reported_once(observe: Any,
                                                               tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    observe()
    model = _model(64)
    adam = torch.optim.Adam(model.parameters())
    _train(model, adam, 2)
    dcp.save({"model": model.state_dict()}, checkpoint_id=tmp_path / "step_2")
    _train(model, adam, 1)
    future: Any = dcp.async_save({"model": model.state_dict()},
                            checkpoint_id=str(tmp_path / "step_3"))
    future.result(timeout=60)
    deadline = time.monotonic() + 10  # the done callback runs just after result() returns
    while len(_records(tmp_path, "checkpoint_saved")) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    saved = _records(tmp_path, "checkpoint_saved")
    assert [(r["step"], r["path"], r["async"]) for r in saved] == \
        [(2, str(tmp_path / "step_2"), False), (3, str(tmp_path / "step_3"), True)]
    assert all(r["bytes"] > 64 * 64 * 4 for r in saved)
    assert saved[1]["seconds"] >= saved[1]["stall_s"]

    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=tmp_path / "step_2")  # the model only: Adam keeps step 3
    model.load_state_dict(state["model"])
    _train(model, adam, 1)
    (loaded,) = _records(tmp_path, "checkpoint_loaded")
    assert (loaded["step"], loaded["step_source"]) == (2, "path")  # the state did not change
    assert _records(tmp_path, "step")[-1]["step"] == 4


def test_lightning_saves_through_its_own_file_layer_and_are_still_seen(observe: Any,
                                                                       tmp_path: Path) -> None:
    """Lightning serialises into a buffer and writes through fsspec: torch.save never sees a
    path, so its _atomic_save is wrapped; the load goes through torch.load on the open file."""
    from lightning_fabric.utilities import cloud_io

    observe()
    model = _model(128)
    adam = torch.optim.Adam(model.parameters())
    _train(model, adam, 2)
    ckpt = {"state_dict": model.state_dict(), "optimizer_states": [adam.state_dict()],
            "global_step": 2}
    cloud_io._atomic_save(ckpt, tmp_path / "epoch=0-step=2.ckpt")
    cloud_io._atomic_save({"epoch": 0}, tmp_path / "not-a-checkpoint.ckpt")
    (saved,) = _records(tmp_path, "checkpoint_saved")
    assert (saved["step"], saved["path"]) == (2, str(tmp_path / "epoch=0-step=2.ckpt"))
    cloud_io._load(tmp_path / "epoch=0-step=2.ckpt", weights_only=False)
    _train(model, adam, 1)
    (loaded,) = _records(tmp_path, "checkpoint_loaded")
    assert (loaded["path"], loaded["step"]) == (str(tmp_path / "epoch=0-step=2.ckpt"), 2)


def test_the_bootstrap_hooks_the_import_of_every_framework_save_module() -> None:
    from faultlab.runtime.bootstrap.sitecustomize import HOOKED_MODULES

    assert set(auto_checkpoints.FRAMEWORK_SAVES) <= set(HOOKED_MODULES)


def test_a_planned_nan_strikes_once_at_its_step_even_when_the_trainer_redoes_it(
        observe: Any, tmp_path: Path) -> None:
    observe(plan=[{"id": "nan", "type": "grad_nan", "steps": [1, 3],
                   "params": {"param_glob": "2.*"}}])
    model = _model()
    adam = torch.optim.Adam(model.parameters())
    assert _train(model, adam, 4, skip_nonfinite=True) == 2  # steps 1 and 3, once each
    struck = _records(tmp_path, "fault_injected")
    assert [(r["step"], r["params"]) for r in struck] == \
        [(1, ["2.bias", "2.weight"]), (3, ["2.bias", "2.weight"])]  # the model's own names
    assert [r["step"] for r in _records(tmp_path, "step")] == [1, 2, 3, 4]


def test_a_bitflip_strikes_a_parameter_the_optimizer_holds(observe: Any,
                                                           tmp_path: Path) -> None:
    observe(plan=[{"id": "flip", "type": "weight_bitflip", "steps": [2],
                   "params": {"bit_index": 31}}, {"id": "spike", "type": "loss_spike",
                                                  "steps": [2]}])
    model = _model()
    frozen = nn.Linear(8, 8)  # run in the forward, but not trained: never a target
    adam = torch.optim.Adam(model.parameters())
    model.insert(0, frozen)
    frozen.requires_grad_(False)
    before = frozen.weight.detach().clone()
    _train(model, adam, 2)
    (flip,) = _records(tmp_path, "fault_injected")
    assert flip["step"] == 2 and not flip["flips"][0]["param"].startswith("0.")
    assert torch.equal(frozen.weight, before)
    (failed,) = _records(tmp_path, "fault_failed")
    assert failed["fault_id"] == "spike" and "rt.loss" in failed["error"]


def test_an_explicit_attach_takes_over_steps_and_faults(observe: Any, tmp_path: Path) -> None:
    obs = observe(plan=[{"id": "nan", "type": "grad_nan", "steps": [2]}])
    model = _model()
    adam = torch.optim.Adam(model.parameters())
    _train(model, adam, 1)
    level0_agent = obs.agent
    rt = runtime.attach(model, adam)  # level 1: the trainer numbers its steps itself
    try:
        for n in (11, 12):
            rt.step(n)
            rt.loss(model(torch.ones(4, 8)).square().mean()).backward()
            adam.step()
            adam.zero_grad()
    finally:
        rt.close()
    assert obs.level == 1 and obs.agent is None and level0_agent is not rt
    steps = _records(tmp_path, "step")
    assert [(r["step"], r["step_source"]) for r in steps] == \
        [(1, "optimizer_state"), (11, "attach"), (12, "attach")]
    assert all(isinstance(r["loss"], float) for r in steps[1:])
    assert _records(tmp_path, "fault_injected") == []  # step 2 never came: no double strike


def test_an_attach_with_an_emitter_is_level_2_and_the_observer_goes_quiet(
        observe: Any, tmp_path: Path) -> None:
    obs = observe()
    model = _model()
    adam = torch.optim.Adam(model.parameters())
    rt = runtime.attach(model, adam, emit=lambda kind, **fields: None)
    try:
        _train(model, adam, 2)
        torch.save({"optim": adam.state_dict()}, tmp_path / "ckpt.pt")
    finally:
        rt.close()
    assert obs.level == 2
    assert [r["kind"] for r in _records(tmp_path)] == ["start"]


def test_stop_puts_back_everything_start_changed(observe: Any) -> None:
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer as optim_module

    from faultlab.runtime import interposer

    originals = (torch.save, torch.load, torch.optim.Optimizer.__init__,
                 dcp_state_dict._init_optim_state, runtime.attach, sys.exit, sys.excepthook)
    obs = observe()
    assert torch.save is not originals[0] and interposer.installed()
    obs.stop()
    assert (torch.save, torch.load, torch.optim.Optimizer.__init__,
            dcp_state_dict._init_optim_state, runtime.attach, sys.exit, sys.excepthook) == \
        originals
    assert not optim_module._global_optimizer_post_hooks
    assert not nn_module._global_forward_pre_hooks
    assert not interposer.installed() and runtime._current is None  # type: ignore[attr-defined]


# --- what counts as a checkpoint ----------------------------------------------------------------

def _floats(num_bytes: int) -> torch.Tensor:
    return torch.zeros(num_bytes // 4)


@pytest.mark.parametrize("obj,is_checkpoint", [
    ({"fc.weight": _floats(auto_checkpoints.CHECKPOINT_MIN_BYTES)}, True),
    ({"fc.weight": _floats(auto_checkpoints.CHECKPOINT_MIN_BYTES - 4)}, False),
    ({"model": {"0.weight": _floats(32 * 1024), "0.bias": _floats(32 * 1024)}}, True),  # summed
    ({"w": [_floats(32 * 1024), {"bias": (_floats(32 * 1024),)}]}, True),  # nested
    ({"optim": {"state": {}, "param_groups": [{"lr": 0.1}]}}, True),  # an optimizer's
    ({"loss": 1.5, "step": 20, "lr": torch.tensor(1e-3)}, False),  # metrics
    ({"input_ids": _floats(1 << 20), "labels": _floats(1 << 20)}, False),  # a data shard
    (_floats(1024 * 1024), False),  # a bare tensor: what DCP writes per shard
    ([_floats(1024 * 1024)], False),
    (nn.Linear(128, 128), True),
    (nn.Linear(4, 4), False),
])
def test_what_a_torch_save_must_hold_to_count_as_a_checkpoint(obj: Any,
                                                              is_checkpoint: bool) -> None:
    assert auto_checkpoints.is_checkpoint_object(obj) is is_checkpoint


@pytest.mark.parametrize("path,step", [
    ("/ckpt/step_00000020", 20), ("/ckpt/step=20/model.pt", 20), ("/ckpt/step-20", 20),
    ("/ckpts/ckpt_20.pt", 20), ("/runs/r7/checkpoint-000300", 300), ("/x/iter_5/s.pt", 5),
    ("/ckpts/step_10/../step_30", 30), ("/ckpts/latest.pt", None), ("/runs/run42/model.pt", None),
])
def test_the_step_a_checkpoint_path_names(path: str, step: int | None) -> None:
    assert auto_checkpoints.step_from_path(path) == step


def test_bootstrap_env_puts_the_directory_first_once() -> None:
    env = bootstrap_env({"PYTHONPATH": os.pathsep.join(["/a", str(BOOTSTRAP_DIR), "/b"])})
    assert env == {"PYTHONPATH": os.pathsep.join([str(BOOTSTRAP_DIR), "/a", "/b"]),
                   "FAULTLAB_BOOTSTRAP": "1"}
    assert (BOOTSTRAP_DIR / "sitecustomize.py").is_file()
    assert sorted(p.name for p in BOOTSTRAP_DIR.iterdir() if p.suffix == ".py") == \
        ["__init__.py", "sitecustomize.py"]  # everything there is a top-level module in a rank


def test_the_example_trainer_imports_nothing_of_faultlab() -> None:
    source = (Path(__file__).resolve().parents[2] / "examples/fsdp2_dcp/train.py").read_text()
    imported = [a.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Import)
                for a in n.names]
    imported += [n.module for n in ast.walk(ast.parse(source))
                 if isinstance(n, ast.ImportFrom) and n.module]
    assert "torch" in imported
    assert not [m for m in imported if m.split(".")[0] == "faultlab"]
