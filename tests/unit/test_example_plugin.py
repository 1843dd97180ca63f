"""examples/plugin, a team's in-rank fault (optimizer_exception), loaded by import path: nothing
is installed. Its declaration validates on faultlab's side, its plan entry names its action,
and the action strikes through the hooks API inside the optimizer step of its step only, once
per job (a restarted process replaying the step is not struck again)."""

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
from fsdp_helpers import Recorder

from faultlab.runtime.agent import Agent, Identity
from faultlab.runtime.plan import parse_entry

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
