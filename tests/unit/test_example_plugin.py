"""examples/plugin, a team's in-rank fault (optimizer_exception), loaded by import path: nothing
is installed. Its declaration validates on faultlab's side, its plan entry names its action,
and the action strikes through the hooks API inside the optimizer step of its step only, once
per job (a restarted process replaying the step is not struck again). At level 0 (no
``attach``, no optimizer given) it strikes through torch's global optimizer-step pre-hook,
registered for its step only, on the primary optimizer's training step only. The package's
SLA, peers_released_within_s, is judged here from hand-written records; the real jobs are in
tests/plugin/test_example_plugin_e2e.py."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint.state_dict as dcp_state_dict
from fsdp_helpers import Recorder
from torch.optim import optimizer as optim_module

from faultlab import runtime
from faultlab.runtime import auto
from faultlab.runtime.agent import Agent, Identity
from faultlab.runtime.plan import parse_entry, write_plan

PLUGIN = Path(__file__).resolve().parents[2] / "examples" / "plugin"


@pytest.fixture
def plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.syspath_prepend(str(PLUGIN))
    yield importlib.import_module("faultlab_example_plugin.faults").OptimizerExceptionFault
    for name in [m for m in sys.modules if m.startswith("faultlab_example_plugin")]:
        del sys.modules[name]


def _agent(tmp_path: Path, entry: dict[str, Any], restart: int = 0) -> tuple[Agent, Any, Any]:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder()
    ident = Identity(run_dir=tmp_path, rank=1, world_size=2, restart=restart, node="node0",
                     pid=os.getpid())
    agent = Agent(ident, model=model, optimizer=optimizer, emit=rec.emit,
                  plan=[parse_entry(entry)])
    return agent, optimizer, rec


def _train_step(agent: Agent, optimizer: Any, n: int) -> None:
    agent.step(n)
    optimizer.zero_grad()
    agent.model(torch.ones(1, 2)).sum().backward()
    optimizer.step()


def test_the_plugin_fault_raises_in_one_optimizer_step_once_per_job(plugin, tmp_path) -> None:
    with pytest.raises(ValueError, match="exception"):
        plugin.Params(exception="SystemExit")  # validated on faultlab's side only
    fault = plugin(plugin.Params(message="boom"))
    entry = fault.plan_entry("opt#1", [1], [3])
    assert entry["action"] == "faultlab_example_plugin.actions:OptimizerException"
    assert entry["params"] == {"message": "boom", "exception": "RuntimeError"}
    agent, optimizer, rec = _agent(tmp_path, entry)
    try:
        for n in (1, 2):
            _train_step(agent, optimizer, n)
        with pytest.raises(RuntimeError, match="optimizer_exception on rank 1 at step 3: boom"):
            _train_step(agent, optimizer, 3)
        [event] = rec.of("fault_injected")
        assert (event["fault_id"], event["type"], event["step"], event["source"]) == \
            ("opt#1", "optimizer_exception", 3, "plan")
        _train_step(agent, optimizer, 4)  # the hook is gone after its step
    finally:
        agent.close()
    again, optimizer, rec = _agent(tmp_path, entry, restart=1)
    try:
        _train_step(again, optimizer, 3)  # a restarted process replays step 3: not again
        assert rec.of("fault_injected") == []
    finally:
        again.close()


def test_the_plugin_action_imports_neither_pydantic_nor_faultlabs_engine() -> None:
    code = ("import json, sys; import faultlab_example_plugin.actions; "
            "print(json.dumps(sorted(sys.modules)))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(PLUGIN), os.environ.get("PYTHONPATH")]))}
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                       text=True, check=True, env=env).stdout)
    assert not [m for m in loaded if m.split(".")[0] == "pydantic"
                or m.startswith(("faultlab.engine", "faultlab.faults", "faultlab.spec",
                                 "faultlab.fault_api"))]


def test_attach_without_an_optimizer_strikes_through_the_global_pre_hook(plugin,
                                                                         tmp_path) -> None:
    entry = plugin(plugin.Params(message="boom")).plan_entry("opt", [1], [2])
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder()
    agent = Agent(Identity(run_dir=tmp_path, rank=1, world_size=2, restart=0, node="node0",
                           pid=os.getpid()), model=model, emit=rec.emit,
                  plan=[parse_entry(entry)])  # attach(model, None)
    try:
        _train_step(agent, optimizer, 1)
        assert not optim_module._global_optimizer_pre_hooks  # nothing armed: no hook
        with pytest.raises(RuntimeError, match="at step 2: boom"):
            _train_step(agent, optimizer, 2)
        _train_step(agent, optimizer, 3)
        assert not optim_module._global_optimizer_pre_hooks  # removed after its step
    finally:
        agent.close()
    assert [e["step"] for e in rec.of("fault_injected")] == [2]


def test_at_level_0_it_strikes_the_primary_optimizers_training_step_only(
        plugin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = plugin(plugin.Params(message="boom")).plan_entry("opt", [0], [1, 3])
    monkeypatch.setenv("FAULTLAB_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("FAULTLAB_RUNTIME_PLAN", str(write_plan(tmp_path / "plan.json",
                                                               [entry])))
    monkeypatch.delenv("FAULTLAB_RUNTIME_SECRET", raising=False)
    monkeypatch.setattr(runtime, "_current", None)
    obs = auto.Observer(Identity(run_dir=tmp_path, rank=0, world_size=1, restart=0,
                                 node="node0", pid=os.getpid()))
    obs.start(exit_hooks=False)
    try:
        torch.manual_seed(0)
        model, other = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
        adam = torch.optim.AdamW(model.parameters())
        sgd = torch.optim.SGD(other.parameters(), lr=0.1)

        def step(opt: Any, net: Any, *, checkpoint: bool = False) -> None:
            loss = net(torch.ones(1, 2)).sum()  # the first training forward arms step 1
            if checkpoint:  # get_state_dict steps the empty optimizer: not a training step
                dcp_state_dict.get_state_dict(model, adam)
            loss.backward()
            opt.step()
            opt.zero_grad()

        with pytest.raises(RuntimeError, match="optimizer_exception on rank 0 at step 1"):
            step(adam, model, checkpoint=True)
        step(adam, model)  # the trainer retries step 1: struck once, not again
        assert not optim_module._global_optimizer_pre_hooks  # step 2: nothing armed
        step(adam, model)
        step(sgd, other)  # step 3 is armed, but this is not the primary optimizer
        with pytest.raises(RuntimeError, match="at step 3"):
            step(adam, model)
        records = [json.loads(line) for p in (tmp_path / "events").glob("*-level0.jsonl")
                   for line in p.read_text().splitlines()]
        assert [r["step"] for r in records if r["kind"] == "fault_injected"] == [1, 3]
        assert [r["step"] for r in records if r["kind"] == "step"] == [1, 2]
    finally:
        obs.stop()
    assert not optim_module._global_optimizer_pre_hooks


# --- the package's SLA, peers_released_within_s, from hand-written records ---------------------

@pytest.fixture
def peers_sla(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.syspath_prepend(str(PLUGIN))
    yield importlib.import_module("faultlab_example_plugin.slas").PEERS_RELEASED_WITHIN_S
    for name in [m for m in sys.modules if m.startswith("faultlab_example_plugin")]:
        del sys.modules[name]


def _ev(t: float, kind: str, pid: int, rank: int, **fields: Any) -> dict[str, Any]:
    return {"t": t, "kind": kind, "pid": pid, "rank": rank, "restart": 0, "node": f"node{rank}",
            "world_size": 2, **fields}


STRUCK = [_ev(90.0, "start", 10, 0), _ev(90.1, "start", 11, 1),
          _ev(95.0, "step", 10, 0, step=5), _ev(95.0, "step", 11, 1, step=5),
          _ev(100.0, "fault_injected", 11, 1, fault_id="opt", type="optimizer_exception",
              step=6),
          _ev(100.05, "exit", 11, 1, reason="error", code=1)]


def _judge(sla: Any, events: list[dict[str, Any]], bound: float = 30) -> Any:
    from types import SimpleNamespace

    from faultlab.observe import FaultRecord

    faults = [FaultRecord(id="opt", type="optimizer_exception", injected_t=100.0,
                          target="rank 1", details={"rank": 1, "step": 6})] \
        if any(e["kind"] == "fault_injected" for e in events) else []
    ev = SimpleNamespace(events=events, faults=faults, unfinished="",
                         findings_for=lambda key: [])
    return sla.judge(ev, bound)


@pytest.mark.parametrize(("after", "measured", "passed", "note"), [
    ([_ev(100.4, "exit", 10, 0, reason="error", code=1)], 0.4, True,
     "peers released 0.40 s after rank 1 raised at step 6 (bound 30 s): rank 0 by its exit "
     "(error) after 0.40 s"),
    ([_ev(104.5, "start", 20, 0, restart=1, t_process_created=103.2)], 3.2, True,
     "rank 0 stopped by the launcher (gone by its restart) after 3.20 s"),
    ([_ev(140.0, "exit", 10, 0, reason="watchdog", code=3)], 40.0, False,
     "peers released 40.00 s after rank 1"),
    ([], None, False, "not measured: opt: a peer of rank 1 left no record of leaving after it "
                      "raised at step 6 (rank 0 left no exit record, and no restart followed)"),
])
def test_peers_released_is_measured_from_the_peers_records(peers_sla, after, measured, passed,
                                                           note) -> None:
    out = _judge(peers_sla, STRUCK + after)
    assert out.measured == pytest.approx(measured) if measured else out.measured is None
    assert out.passed is passed and note in out.note, out.note


def test_peers_released_is_not_measured_without_a_strike_or_a_peer(peers_sla) -> None:
    out = _judge(peers_sla, [_ev(90.0, "start", 10, 0), _ev(95.0, "exit", 10, 0,
                                                            reason="completed")])
    assert (out.measured, out.passed) == (None, False)
    assert out.note == "not measured: no optimizer_exception struck (no fault_injected record " \
                       "of one)"
    alone = [e for e in STRUCK if e["rank"] == 1]
    out = _judge(peers_sla, alone)
    assert (out.measured, out.passed) == (None, False)
    assert "rank 1 had no peer running when it raised" in out.note
