"""The runtime agent in this process: plan validation, fire-once semantics, the control channel
on a real socket, the client's errors, the interposer on the session's one-rank gloo group, and
the faultlab-side fault classes. The 2-process FSDP2 scenarios are in test_runtime_fsdp.py."""

from __future__ import annotations

import gc
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from fsdp_helpers import Recorder
from runtime_entries import entries, entry

from faultlab import runtime
from faultlab.errors import FaultError
from faultlab.faults import Victim
from faultlab.faults.collective import (
    CollectiveDelayFault,
    CollectiveErrorFault,
    CollectiveHangFault,
    CollectivePartitionFault,
)
from faultlab.faults.numeric import GradInfFault, GradNanFault, LossSpikeFault, WeightBitflipFault
from faultlab.faults.runtime_base import RuntimeFault
from faultlab.observe.stream import EventStream
from faultlab.runtime import interposer
from faultlab.runtime.agent import Agent, Identity, NullAgent
from faultlab.runtime.client import RuntimeControlError, new_secret, send
from faultlab.runtime.hooks import load_action
from faultlab.runtime.plan import PlanError, load_plan, parse_entry, write_plan

FAULT_CLASSES: list[type[RuntimeFault]] = [
    GradNanFault, GradInfFault, LossSpikeFault, WeightBitflipFault, CollectiveDelayFault,
    CollectiveHangFault, CollectiveErrorFault, CollectivePartitionFault]
SECRET = "s3cret"


def _ident(run_dir: Path, rank: int = 0, restart: int = 0) -> Identity:
    return Identity(run_dir=run_dir, rank=rank, world_size=2, restart=restart, node="node0",
                    pid=os.getpid())


@pytest.fixture
def make_agent(tmp_path: Path) -> Iterator[Any]:
    """Agents built here are closed (listener stopped, faults released) after the test."""
    made: list[Agent] = []

    def make(plan: list[dict[str, Any]] | None = None, *, rank: int = 0, restart: int = 0,
             model: Any = None, secret: str | None = None, emit: Any = None) -> Agent:
        parsed = [parse_entry(entry(p)) for p in plan or []]
        agent = Agent(_ident(tmp_path, rank, restart), model=model, emit=emit, plan=parsed,
                      secret=secret)
        made.append(agent)
        return agent

    yield make
    for agent in made:
        agent.close()


@pytest.fixture
def interposed() -> Iterator[None]:
    interposer.install()
    try:
        yield
    finally:
        interposer.uninstall()


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))


def _backward(model: torch.nn.Module, agent: Agent | None = None) -> dict[str, bool]:
    """One backward; which parameters got a finite gradient."""
    model.zero_grad(set_to_none=True)
    loss = model(torch.ones(3, 4)).sum()
    (agent.loss(loss) if agent else loss).backward()
    return {n: bool(torch.isfinite(p.grad).all()) for n, p in model.named_parameters()}


# --- plan -----------------------------------------------------------------------------------

def test_plan_round_trips_the_action_and_its_params(tmp_path: Path) -> None:
    path = write_plan(tmp_path / "plan.json", entries([
        {"id": "a", "type": "grad_nan", "steps": [3]},
        {"id": "b", "type": "collective_delay", "ranks": [1], "from_step": 2, "to_step": 4,
         "params": {"delay_ms": 5, "ops": ["all_gather_single"]}}]))
    a, b = load_plan(path)
    assert a.action == "faultlab.runtime.actions.numeric:GradNan"
    assert a.params == {"param_glob": "*", "fraction": 1.0, "seed": 0} and a.ranks is None
    assert b.params["ops"] == ["all_gather_single"] and b.params["jitter_ms"] == 0.0
    assert [b.in_window(s) for s in (1, 2, 4, 5)] == [False, True, True, False]
    assert json.loads(path.read_text())["faults"][1]["params"]["ops"] == ["all_gather_single"]


_NAN = "faultlab.runtime.actions.numeric:GradNan"


@pytest.mark.parametrize("raw, message", [
    ({"type": "grad_nan", "action": "grad_nan", "steps": [1]},
     "('f').action: 'grad_nan' is not an import path 'package.module:Class'"),
    ({"type": "", "action": _NAN}, "('f').type: '' is not a fault type name"),
    ({"type": "grad_nan", "action": _NAN, "from_step": 5, "to_step": 3},
     "from_step 5 is after to_step 3"),
    ({"type": "grad_nan", "action": _NAN, "ranks": [-1]},
     "('f').ranks: -1 is not an integer >= 0"),
    ({"type": "grad_nan", "action": _NAN, "steps": []}, "('f').steps: [] is not a non-empty list"),
    ({"type": "grad_nan", "action": _NAN, "step": 3},
     "unknown key(s) 'step'; valid: id, type, action, ranks"),
])
def test_plan_errors_say_where_and_what(tmp_path: Path, raw: dict[str, Any],
                                        message: str) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"faults": [{"id": "f", **raw}]}))
    with pytest.raises(PlanError) as err:
        load_plan(path)
    assert str(err.value).startswith(f"{path}: faults[0]") and message in str(err.value)


@pytest.mark.parametrize("cls, params, message", [
    (GradNanFault, {"fraction": 1.5}, "fraction"),
    (GradNanFault, {"bogus": 1}, "bogus"),
    (CollectiveHangFault, {"ops": ["allgather"]},
     "'allgather' matches no interceptable operation"),
    (CollectivePartitionFault, {}, "groups"),
    (CollectivePartitionFault, {"groups": [[0, 1], [1]]}, "rank 1 is in more than one group"),
    (LossSpikeFault, {"scale": 0}, "0 is not allowed"),
])
def test_params_are_validated_on_faultlabs_side(cls: type[RuntimeFault], params: dict[str, Any],
                                                message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cls.Params(**params)


def test_an_action_is_loaded_only_when_named_and_must_be_one(make_agent, tmp_path) -> None:
    with pytest.raises(PlanError, match="a planned grad_nan needs 'steps' or 'from_step'"):
        make_agent([{"id": "f", "type": "grad_nan"}])
    with pytest.raises(PlanError, match="'no.such.module:X' cannot be loaded in this rank"):
        make_agent([{"id": "f", "type": "x", "action": "no.such.module:X", "steps": [1]}])
    with pytest.raises(PlanError, match="is not a faultlab.runtime.hooks.RankAction subclass"):
        make_agent([{"id": "f", "type": "x", "action": "faultlab.runtime.plan:FaultEntry",
                     "steps": [1]}])
    # a rank the entry does not name never imports its action
    make_agent([{"id": "f", "type": "x", "action": "no.such.module:X", "steps": [1],
                 "ranks": [1]}], rank=0)
    agent = make_agent(secret=SECRET)
    reply = agent._handle({"op": "inject", "fault": {"id": "l", "type": "x",
                                                     "action": "no.such.module:X"}})
    assert not reply["ok"] and "cannot be loaded in this rank" in reply["error"]


def test_plan_file_errors(tmp_path: Path) -> None:
    dup = entries([{"id": "x", "type": "collective_hang"}] * 2)
    with pytest.raises(PlanError, match="fault id\\(s\\) 'x' appear more than once"):
        write_plan(tmp_path / "p.json", dup)
    assert not (tmp_path / "p.json").exists()  # an invalid plan is never written
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(PlanError, match="bad.json: not valid JSON"):
        load_plan(tmp_path / "bad.json")
    with pytest.raises(PlanError, match="cannot read the runtime plan .* FAULTLAB_RUNTIME_PLAN"):
        load_plan(tmp_path / "missing.json")


# --- numeric faults and fire-once -------------------------------------------------------------

def test_grad_nan_strikes_once_per_step_across_rollbacks_and_restarts(make_agent,
                                                                      tmp_path: Path) -> None:
    plan = [{"id": "nan#1", "type": "grad_nan", "ranks": [0], "steps": [2]}]
    model, rec = _model(), Recorder()
    agent = make_agent(plan, model=model, emit=rec.emit)
    agent.step(1)
    assert all(_backward(model).values())
    agent.step(2)
    assert not any(_backward(model).values())  # whole local shard of every matching param
    [event] = rec.of("fault_injected")
    assert event == {"kind": "fault_injected", "fault_id": "nan#1", "type": "grad_nan",
                     "step": 2, "rank": 0, "source": "plan", "value": "nan",
                     "what": "whole local gradient shard",
                     "params": ["0.bias", "0.weight", "1.bias", "1.weight"]}
    agent.step(2)  # an in-process rollback replays step 2
    assert all(_backward(model).values())
    assert [p.name for p in (tmp_path / "runtime" / "fired").iterdir()] \
        == [p.name for p in (tmp_path / "runtime" / "fired").glob("nan_1-*-rank0-step2")]
    restarted = make_agent(plan, restart=1, model=model, emit=rec.emit)  # a new process
    restarted.step(2)
    assert all(_backward(model).values()) and len(rec.of("fault_injected")) == 1
    other_rank = make_agent([{**plan[0], "ranks": None}], rank=1, model=model, emit=rec.emit)
    other_rank.step(2)  # the marker is per rank: rank 1 has not been hit yet
    assert not any(_backward(model).values())


def test_grad_fraction_picks_the_same_seeded_parameters_every_time(make_agent) -> None:
    plan = [{"id": "inf", "type": "grad_inf", "steps": [1],
             "params": {"fraction": 0.5, "param_glob": "*weight*", "seed": 7}}]
    picks = []
    for rank in (0, 1):
        model, rec = _model(), Recorder()
        agent = make_agent(plan, rank=rank, model=model, emit=rec.emit)
        agent.step(1)
        finite = _backward(model)
        picks.append(rec.of("fault_injected")[0]["params"])
        assert [n for n, ok in finite.items() if not ok] == picks[-1]
    assert picks[0] == picks[1] and len(picks[0]) == 1
    assert torch.isinf(next(_model().parameters())).sum() == 0  # sanity: a fresh model is clean


def test_loss_spike_scales_the_loss_at_its_step_only(make_agent) -> None:
    rec = Recorder()
    agent = make_agent([{"id": "spike", "type": "loss_spike", "steps": [3],
                         "params": {"scale": 100.0}}], emit=rec.emit)
    one = torch.tensor(1.5)
    agent.step(2)
    assert agent.loss(one) is one
    agent.step(3)
    assert float(agent.loss(one)) == 150.0 and float(agent.loss(one)) == 150.0  # micro-batches
    agent.step(3)
    assert float(agent.loss(one)) == 1.5
    assert [e["step"] for e in rec.of("fault_injected", fault_id="spike")] == [3]


def test_weight_bitflip_flips_exactly_the_reported_bit(make_agent) -> None:
    model, rec = _model(), Recorder()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    agent = make_agent([{"id": "flip", "type": "weight_bitflip", "steps": [1],
                         "params": {"param_glob": "1.*", "num_bits": 1, "seed": 5}}],
                       model=model, emit=rec.emit)
    agent.step(1)
    [flip] = rec.of("fault_injected")[0]["flips"]
    changed = {n: (p.detach() != before[n]).nonzero().flatten().tolist()
               for n, p in model.named_parameters() if (p.detach() != before[n]).any()}
    param = dict(model.named_parameters())[flip["param"]]
    assert flip["param"].startswith("1.") and list(changed) == [flip["param"]]
    assert torch.equal((param.detach() != before[flip["param"]]).view(-1).nonzero().flatten(),
                       torch.tensor([flip["index"]]))
    old_bits, new_bits = (struct.unpack("<I", struct.pack("<f", v))[0]
                          for v in (flip["old"], flip["new"]))
    assert old_bits ^ new_bits == 1 << flip["bit"]
    agent.step(1)  # replayed: no second flip
    assert len(rec.of("fault_injected")) == 1


def test_live_numeric_inject_strikes_at_the_next_step_and_undo_cancels(make_agent) -> None:
    model, rec = _model(), Recorder()
    agent = make_agent(model=model, emit=rec.emit)
    agent.step(4)
    reply = agent._handle({"op": "inject", "fault": entry({"id": "live", "type": "grad_inf"})})
    assert reply == {"ok": True, "id": "live", "applies": True, "applies_at": "next step",
                     "step": 4}
    assert all(_backward(model).values())  # not during the step it arrived in
    agent.step(5)
    assert not any(_backward(model).values())
    assert rec.of("fault_injected")[0]["step"] == 5 and rec.of("fault_injected")[0]["source"] \
        == "live"
    agent._handle({"op": "inject", "fault": entry({"id": "later", "type": "grad_nan"})})
    assert agent._handle({"op": "undo", "id": "later"})["undone"] is True
    agent.step(6)
    assert all(_backward(model).values())


def test_a_glob_matching_nothing_is_reported_not_raised(make_agent) -> None:
    model, rec = _model(), Recorder()
    agent = make_agent([{"id": "g", "type": "grad_nan", "steps": [1],
                         "params": {"param_glob": "blocks.*"}}], model=model, emit=rec.emit)
    agent.step(1)
    [failed] = rec.of("fault_failed")
    assert "param_glob 'blocks.*' matches no parameter" in failed["error"]
    assert all(_backward(model).values())


# --- the control channel and the client --------------------------------------------------------

def _raw(agent: Agent, payload: bytes) -> dict[str, Any]:
    assert agent._server is not None
    with socket.create_connection((agent._server.host, agent._server.port), timeout=5) as c:
        c.sendall(payload)
        return json.loads(c.makefile("rb").readline())


def test_control_channel_needs_the_secret(make_agent, tmp_path: Path) -> None:
    agent = make_agent(secret=SECRET, rank=1, emit=Recorder().emit)
    info = json.loads((tmp_path / "runtime" / "rank1.json").read_text())
    assert info == {"rank": 1, "restart": 0, "host": "127.0.0.1", "port": info["port"],
                    "pid": os.getpid()}
    delay = entry({"id": "d", "type": "collective_delay", "params": {"delay_ms": 1}})
    assert send(tmp_path, 1, "wrong", {"op": "inject", "fault": delay}) \
        == {"ok": False, "error": "bad secret"}
    assert agent.status()["active"] == []  # nothing else happened
    assert _raw(agent, b'{"op": "ping"}\n') == {"ok": False, "error": "bad secret"}
    assert send(tmp_path, 1, SECRET, {"op": "ping"})["rank"] == 1
    reply = send(tmp_path, 1, SECRET, {"op": "inject", "fault": delay})
    assert reply["ok"] and reply["applies_at"] == "now"
    assert send(tmp_path, 1, SECRET, {"op": "inject", "fault": delay})["already"] is True
    status = send(tmp_path, 1, SECRET, {"op": "status"})
    assert [a["id"] for a in status["active"]] == ["d"] and "counts" in status
    assert send(tmp_path, 1, SECRET, {"op": "undo", "id": "d"})["undone"] is True
    assert send(tmp_path, 1, SECRET, {"op": "undo", "id": "d"})["undone"] is False
    assert send(tmp_path, 1, SECRET, {"op": "status"})["active"] == []
    bad = send(tmp_path, 1, SECRET, {"op": "inject", "fault": {"id": "x", "type": "nope"}})
    assert bad["ok"] is False and "action: None is not an import path" in bad["error"]
    assert "unknown op 'reboot'" in send(tmp_path, 1, SECRET, {"op": "reboot"})["error"]
    assert _raw(agent, b"not json\n")["error"] == "request is not one line of JSON"
    assert "longer than" in _raw(agent, b"x" * (70 * 1024) + b"\n")["error"]
    agent.close()
    assert not (tmp_path / "runtime" / "rank1.json").exists()


def test_listener_never_binds_every_interface(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="would listen on every interface"):
        Agent(_ident(tmp_path), secret=SECRET, host="0.0.0.0")


def test_client_errors_name_the_rank_and_run_dir(tmp_path: Path) -> None:
    with pytest.raises(RuntimeControlError, match=f"rank 3 of the job in {tmp_path}: no runtime "
                                                  f"agent is listening"):
        send(tmp_path, 3, SECRET, {"op": "ping"})
    addr = tmp_path / "runtime" / "rank0.json"
    addr.parent.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    addr.write_text(json.dumps({"host": "127.0.0.1", "port": 1, "pid": dead.pid}))
    with pytest.raises(RuntimeControlError, match=f"process {dead.pid} .* is gone"):
        send(tmp_path, 0, SECRET, {"op": "ping"})
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    addr.write_text(json.dumps({"host": "127.0.0.1", "port": port, "pid": os.getpid()}))
    with pytest.raises(RuntimeControlError, match="cannot reach the agent"):
        send(tmp_path, 0, SECRET, {"op": "ping"})
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        addr.write_text(json.dumps({"host": "127.0.0.1", "port": silent.getsockname()[1],
                                    "pid": os.getpid()}))
        with pytest.raises(RuntimeControlError, match="did not answer within 0.2 s"):
            send(tmp_path, 0, SECRET, {"op": "ping"}, timeout_s=0.2)
    addr.write_text("{")
    with pytest.raises(RuntimeControlError, match="unreadable agent address file"):
        send(tmp_path, 0, SECRET, {"op": "ping"})
    assert len(new_secret()) == 64 and new_secret() != new_secret()


# --- the interposer on the session's one-rank process group -----------------------------------

def test_interposer_counts_calls_and_strikes(mesh, interposed, make_agent, tmp_path) -> None:
    rec = Recorder()
    make_agent(secret=SECRET, emit=rec.emit)
    t = torch.ones(2)
    before = interposer.counts()
    dist.all_reduce(t)
    dist.all_gather_object([None], {"x": 1})  # calls all_gather inside: counted once
    after = interposer.counts()
    assert after["all_reduce"] - before.get("all_reduce", 0) == 1
    assert after["all_gather_object"] - before.get("all_gather_object", 0) == 1
    assert after.get("all_gather", 0) == before.get("all_gather", 0)

    def inject(fault: dict[str, Any]) -> None:
        assert send(tmp_path, 0, SECRET, {"op": "inject", "fault": entry(fault)})["ok"]

    inject({"id": "err", "type": "collective_error", "params": {"ops": ["all_reduce"]}})
    with pytest.raises(dist.DistBackendError, match="faultlab collective_error: Connection "
                                                    "reset by peer"):
        dist.all_reduce(t)
    dist.all_reduce(t)  # num_calls=1: the next one goes through
    inject({"id": "part", "type": "collective_partition", "params": {"groups": [[0], [1]]}})
    dist.all_reduce(t)  # every participant (rank 0 alone) is in one group: proceeds
    inject({"id": "hang", "type": "collective_hang", "params": {"ops": ["barrier"]}})
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (dist.barrier(), done.set()), daemon=True)
    waiter.start()
    assert not done.wait(0.3)  # hung
    assert send(tmp_path, 0, SECRET, {"op": "undo", "id": "hang"})["undone"] is True
    assert done.wait(5)
    hang_events = [e["kind"] for e in rec.events if e.get("fault_id") == "hang"]
    assert hang_events == ["fault_injected", "fault_undone"]
    assert rec.of("fault_undone", fault_id="hang")[0]["blocked_s"] >= 0.25
    assert not rec.of("fault_injected", fault_id="part")


def test_the_interposer_keeps_no_tensor_alive(mesh, interposed) -> None:
    """A chaos tool must not change the behaviour it judges: the interposer once kept the last
    collectives' CPU tensors alive through exit, which hid torch 2.13's gloo abort at exit
    from a trainer's golden run (issue 38). A tensor that went through a collective is the
    trainer's alone again afterwards."""
    t = torch.ones(3)
    dist.all_reduce(t)
    dist.broadcast_object_list([{"step": 6}], src=0)  # DCP's last collective at every save
    assert t._use_count() == 1
    gone = weakref.ref(t)
    del t
    gc.collect()
    assert gone() is None


def test_a_planned_collective_error_strikes_once_per_job(mesh, interposed, make_agent,
                                                         tmp_path) -> None:
    plan = [{"id": "e1", "type": "collective_error", "steps": [1],
             "params": {"ops": ["all_reduce"], "num_calls": 2}}]
    agent = make_agent(plan, emit=Recorder().emit)
    agent.step(1)
    for _ in range(2):
        with pytest.raises(dist.DistBackendError):
            dist.all_reduce(torch.ones(1))
    dist.all_reduce(torch.ones(1))
    assert list((tmp_path / "runtime" / "fired").glob("e1-*-rank0-once"))
    agent.close()
    restarted = make_agent(plan, restart=1, emit=Recorder().emit)
    restarted.step(1)  # the restarted process replays step 1: no error this time
    dist.all_reduce(torch.ones(1))


def test_attach_outside_faultlab_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("FAULTLAB_RUN_DIR", "FAULTLAB_RUNTIME_PLAN", "FAULTLAB_RUNTIME_SECRET"):
        monkeypatch.delenv(key, raising=False)
    rt = runtime.attach(None, None)
    assert isinstance(rt, NullAgent) and not rt.enabled
    x = object()
    assert rt.loss(x) is x and rt.step(1) is None and rt.close() is None
    monkeypatch.setenv("FAULTLAB_RUNTIME_PLAN", "/tmp/p.json")
    with pytest.raises(ValueError, match="FAULTLAB_RUNTIME_PLAN set without FAULTLAB_RUN_DIR"):
        runtime.attach(None, None)


def test_attach_writes_its_own_event_file_that_faultlab_reads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interposed) -> None:
    write_plan(tmp_path / "plan.json", entries([{"id": "s", "type": "loss_spike",
                                                 "steps": [1]}]))
    monkeypatch.setenv("FAULTLAB_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("FAULTLAB_RUNTIME_PLAN", str(tmp_path / "plan.json"))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    monkeypatch.setenv("FAULTLAB_NODE", "node1")
    monkeypatch.delenv("FAULTLAB_RUNTIME_SECRET", raising=False)
    rt = runtime.attach(None, None)
    try:
        assert isinstance(rt, Agent) and rt._server is None  # no secret: no listener
        rt.step(1)
        rt.loss(torch.tensor(1.0))
    finally:
        rt.close()
    path = tmp_path / "events" / f"node1-rank1-restart2-pid{os.getpid()}-runtime.jsonl"
    assert path.exists()
    stream = EventStream(tmp_path)
    [event] = stream.poll()
    assert {k: event[k] for k in ("kind", "rank", "world_size", "restart", "node", "pid",
                                  "fault_id", "step")} == {
        "kind": "fault_injected", "rank": 1, "world_size": 2, "restart": 2, "node": "node1",
        "pid": os.getpid(), "fault_id": "s", "step": 1}


# --- faultlab-side fault classes -------------------------------------------------------------

@pytest.mark.parametrize("cls", FAULT_CLASSES, ids=lambda c: c.type)
def test_a_fault_names_its_action_and_hands_it_complete_params(cls: type[RuntimeFault]) -> None:
    assert cls.family in ("numeric", "collective")
    assert cls.rank_action and load_action(cls.rank_action).strikes == cls.strikes
    required = {"groups": [[0], [1]]} if cls.type == "collective_partition" else {}
    params = cls.Params(**required)
    # num_steps is the engine's (it becomes the plan entry's step window), not the action's
    faultlab_only = {"num_steps"} if cls.type == "collective_delay" else set()
    assert faultlab_only.isdisjoint(params.runtime_params())
    assert set(params.runtime_params()) == set(type(params).model_fields) - faultlab_only
    for name, field in type(params).model_fields.items():
        assert field.description, name
    raw = cls(params).plan_entry("f1", [0], [4])
    assert raw["action"] == cls.rank_action
    parsed = parse_entry(raw)
    if "seed" in parsed.params:
        assert parsed.params["seed"] is not None  # derived from the fault id


class _Ctx:
    """A FaultContext with the ``runtime`` method the engine provides."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.sent: list[tuple[int, dict[str, Any]]] = []

    def ranks(self) -> list[int]:
        return [0, 1]

    def runtime(self, rank: int, message: dict[str, Any]) -> dict[str, Any]:
        self.sent.append((rank, message))
        return send(self.run_dir, rank, SECRET, message)


def test_runtime_faults_inject_and_undo_through_the_context(make_agent, tmp_path) -> None:
    agent = make_agent(secret=SECRET, emit=Recorder().emit)
    ctx = _Ctx(tmp_path)
    fault = CollectiveDelayFault(CollectiveDelayFault.Params(delay_ms=1))
    fault.fault_id = "exp-delay"
    assert fault.inject(ctx, Victim("rank", 0)) == {"fault_id": "exp-delay", "ranks": [0],
                                                    "applies_at": {0: "now"}}
    assert [a["id"] for a in agent.status()["active"]] == ["exp-delay"]
    assert fault.undo(ctx) == {"fault_id": "exp-delay", "undone_ranks": [0],
                               "unreachable_ranks": []}
    assert agent.status()["active"] == [] and fault.undo(ctx) == {}
    nan = GradNanFault(GradNanFault.Params())
    with pytest.raises(FaultError, match="rank 1 of the job .* no runtime agent"):
        nan.inject(ctx, Victim("all"))  # rank 0 gets it, rank 1 has no agent
    assert nan.undo(ctx)["unreachable_ranks"] == [1]  # a gone rank is fine
    with pytest.raises(FaultError, match="needs a target whose context can reach the runtime"):
        nan.inject(object(), Victim("rank", 0))  # type: ignore[arg-type]


def test_importing_the_runtime_pulls_in_nothing_else_of_faultlab_but_errors_nor_torch() -> None:
    code = ("import json, sys, faultlab.runtime, faultlab.runtime.client; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('faultlab', 'reference_trainer', 'torch'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out) == sorted(["faultlab", "faultlab.errors", "faultlab.runtime", *(
        f"faultlab.runtime.{m}" for m in ("agent", "client", "control", "gates", "hooks",
                                          "identity", "records", "events", "interposer", "plan",
                                          "site", "uplink", "watch"))])
    # the node relay's daemon (runtime.relay) is a process of its own: no rank imports it


def test_the_rank_side_imports_neither_pydantic_nor_the_engine() -> None:
    """Every module a rank may import (the bootstrap, the agent, every built-in action) keeps
    the rank's import cost: no pydantic, nothing of faultlab's side (the fault classes, the
    spec, the engine). An action is loaded only when a plan names it."""
    mods = ("faultlab.runtime", "faultlab.runtime.auto", "faultlab.runtime.agent",
            "faultlab.runtime.hooks", "faultlab.runtime.actions.numeric",
            "faultlab.runtime.actions.collective", "faultlab.runtime.actions.gpu",
            "faultlab.runtime.gpu",
            "faultlab.runtime.nvml_overlay")
    code = ("import importlib, json, sys\n"
            f"for m in {mods!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted(sys.modules)))")
    loaded = set(json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                           text=True, check=True).stdout))
    forbidden = ("pydantic", "faultlab.engine", "faultlab.spec", "faultlab.faults",
                 "faultlab.fault_api", "faultlab.judge", "faultlab.targets", "faultlab.observe")
    assert not {m for m in loaded if m.split(".")[0] == "pydantic"
                or any(m == f or m.startswith(f + ".") for f in forbidden)}
    bare = ("import json, sys, faultlab.runtime.auto, faultlab.runtime.agent; "
            "print(json.dumps(sorted(m for m in sys.modules if 'actions' in m)))")
    assert json.loads(subprocess.run([sys.executable, "-c", bare], capture_output=True,
                                     text=True, check=True).stdout) == []
