"""The ``sdc`` fault in this process, no torchrun: its parameters, the launch plan, and its
rank-side action through a real runtime agent on a tiny model (surfaces, ops, persistence,
lifetimes, the ``fault_struck`` records). The level-0 paths (the module of the first forward,
the primary optimizer's post-hook) through a real observer."""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from fsdp_helpers import Recorder
from pydantic import ValidationError
from torch import nn

from faultlab import runtime
from faultlab.engine.runtime_plan import RuntimeSetup
from faultlab.errors import FaultError, InvalidExperimentError
from faultlab.faults import Victim
from faultlab.faults.sdc import SdcFault
from faultlab.runtime import auto
from faultlab.runtime.actions import sdc as sdc_action
from faultlab.runtime.agent import Agent, Identity
from faultlab.runtime.plan import load_plan, parse_entry, write_plan
from faultlab.spec import experiment_from_dict
from tests.unit.test_runtime_auto import _records, _train


def _agent(run_dir: Path, params: dict[str, Any], *, model: Any, optimizer: Any = None,
           rank: int = 0, node: str = "node0", ranks: list[int] | None = None,
           from_step: int = 1, seed: int = 7) -> tuple[Agent, Recorder]:
    """A real agent whose launch plan holds one sdc entry, as the engine writes it."""
    fault = SdcFault(SdcFault.Params(**params, seed=seed))
    raw = fault.plan_entry("sdc-1", [rank] if ranks is None else ranks, None)
    raw["from_step"] = from_step
    rec = Recorder()
    ident = Identity(run_dir=run_dir, rank=rank, world_size=2, restart=0, node=node,
                     pid=os.getpid())
    return Agent(ident, model=model, optimizer=optimizer, emit=rec.emit,
                 plan=[parse_entry(raw)]), rec


@pytest.fixture
def agents() -> Any:
    made: list[Agent] = []

    def make(*args: Any, **kwargs: Any) -> tuple[Agent, Recorder]:
        agent, rec = _agent(*args, **kwargs)
        made.append(agent)
        return agent, rec

    yield make
    for agent in made:
        agent.close()


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a new process would (``lifetime: process`` is held per process)."""
    monkeypatch.setattr(sdc_action, "_PROCESS_OWNED", set())


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 6))


X = torch.arange(16.0).reshape(4, 4) / 10 - 0.5
Y = X.flip(0) * 1.5


# --- parameters and the plan -----------------------------------------------------------------

@pytest.mark.parametrize("params, where, says", [
    ({"surface": "update", "module_glob": "net.*"}, "module_glob", "surface is 'update'"),
    ({"surface": "activation", "param_glob": "w"}, "param_glob", "surface is 'activation'"),
    ({"op": "bitflip", "magnitude": 0.1}, "magnitude", "applies only with op: scale or noise"),
    ({"op": "scale", "bit_index": 3}, "bit_index", "applies only with op: bitflip"),
    ({"probability": 0.1}, "probability", "persistence is 'deterministic'"),
    ({"num_elements": 3, "fraction": 0.5}, "fraction", "not both"),
    ({"magnitude": 0.0}, "magnitude", "greater than 0"),
    ({"magnitude": 1e7}, "magnitude", "less than or equal to 1000000"),
    ({"surface": "loss"}, "surface", "'activation', 'gradient', 'update' or 'weights'"),
    ({"lifetime": "forever"}, "lifetime", "'job', 'process' or 'node'"),
    ({"magnitud": 0.1}, "magnitud", "Extra inputs are not permitted"),
])
def test_bad_params_are_refused_where_they_are(params: dict[str, Any], where: str,
                                               says: str) -> None:
    with pytest.raises(ValidationError) as e:
        SdcFault.Params(**params)
    (error,) = e.value.errors()
    assert error["loc"] == (where,) and says in str(e.value), str(e.value)


def test_a_step_triggered_sdc_is_planned_from_its_step_to_the_end(tmp_path: Path) -> None:
    doc = {"name": "sdc", "target": {"trainer": "reference", "preset": "tiny"},
           "topology": {"nodes": 2, "procs_per_node": 1}, "run": {"steps": 30},
           "faults": [{"id": "bad", "type": "sdc", "target": {"rank": 1},
                       "trigger": {"at_step": 12}, "params": {"surface": "update"}},
                      {"id": "node", "type": "sdc", "target": {"rank": 0},
                       "trigger": {"at_step": 3}, "params": {"lifetime": "node"}}]}
    exp = experiment_from_dict(doc)
    assert exp.faults[0].fault_class.capabilities() == ("corrupts_silently",)
    RuntimeSetup.create(exp, tmp_path)
    bad, node = load_plan(tmp_path / "runtime" / "plan.json")
    assert (bad.ranks, bad.steps, bad.from_step, bad.to_step) == ((1,), None, 12, None)
    assert bad.params["surface"] == "update" and bad.params["victim_ranks"] == [1]
    assert node.ranks is None and node.params["victim_ranks"] == [0]  # every rank checks
    with pytest.raises(Exception, match="cannot be undone"):
        experiment_from_dict({**doc, "faults": [{**doc["faults"][0], "duration_s": 5}]})


@pytest.mark.parametrize("fault, where, says", [
    ({"target": "random", "trigger": {"at_step": 3}}, "faults[0].target",
     "target {rank: N} or all, not 'random', or change params.lifetime"),
    ({"target": {"rank": 1}, "trigger": {"at_time_s": 3}}, "faults[0].trigger",
     "give it an at_step trigger, or change params.lifetime"),
])
def test_an_sdc_that_only_the_launch_plan_can_carry_needs_a_step_and_a_rank(
        fault: dict[str, Any], where: str, says: str) -> None:
    doc = {"name": "sdc", "target": {"trainer": "reference", "preset": "tiny"},
           "topology": {"nodes": 2, "procs_per_node": 1}, "run": {"steps": 30},
           "faults": [{"type": "sdc", **fault}]}
    with pytest.raises(InvalidExperimentError, match=re.escape(f"{where}: sdc with lifetime 'job' "
                                                        f"must be planned at launch")) as e:
        experiment_from_dict(doc)
    assert says in str(e.value)
    live = {**fault, "target": {"rank": 1}, "trigger": {"at_time_s": 3},
            "params": {"lifetime": "process"}}
    assert experiment_from_dict({**doc, "faults": [{"type": "sdc", **live}]})
    with pytest.raises(FaultError, match="must be planned at launch"):  # the engine's last word
        SdcFault(SdcFault.Params()).inject(object(), Victim("rank", 0))  # type: ignore[arg-type]


# --- activation ------------------------------------------------------------------------------

def test_deterministic_activation_gives_the_same_wrong_output_for_the_same_input(
        agents: Any, tmp_path: Path) -> None:
    model = _model()
    clean = copy.deepcopy(model)
    agent, rec = agents(tmp_path, {"surface": "activation", "module_glob": "2",
                                   "op": "noise", "magnitude": 0.5, "num_elements": 3},
                        model=model)
    agent.step(1)
    out_x, again_x, out_y = model(X), model(X), model(Y)
    hit_x, hit_y = out_x != clean(X), out_y != clean(Y)
    assert int(hit_x.sum()) == 3 and int(hit_y.sum()) == 3
    assert torch.equal(out_x, again_x)  # a same-device replay agrees with itself
    assert not torch.equal(hit_x, hit_y)  # another input, other elements
    out_x.sum().backward()  # the gradient flows as if nothing happened
    clean(X).sum().backward()
    assert torch.equal(model[0].weight.grad, clean[0].weight.grad)
    agent.step(2)
    (struck,) = rec.of("fault_struck")
    assert {k: struck[k] for k in ("fault_id", "type", "step", "rank", "surface", "op",
                                   "num_elements", "changed", "magnitude", "where")} == {
        "fault_id": "sdc-1", "type": "sdc", "step": 1, "rank": 0, "surface": "activation",
        "op": "noise", "num_elements": 9, "changed": 9, "magnitude": 0.5, "where": ["2"]}
    assert len(rec.of("fault_injected")) == 1


def test_an_activation_glob_that_matches_nothing_fails_with_the_modules_it_saw(
        agents: Any, tmp_path: Path) -> None:
    model = _model()
    agent, rec = agents(tmp_path, {"surface": "activation", "module_glob": "*.fc*"},
                        model=model)
    agent.step(1)
    assert torch.equal(model(X), copy.deepcopy(model)(X))
    (failed,) = rec.of("fault_failed")
    assert "no module matches '*.fc*'" in failed["error"]
    assert "'0', '1', '2'" in failed["error"] and "module_glob" in failed["error"]
    agent.step(2)
    assert len(rec.of("fault_failed")) == 1  # retired: reported once


def test_intermittent_is_reproducible_by_seed_and_a_replay_draws_anew(agents: Any,
                                                                      tmp_path: Path) -> None:
    def outputs(run_dir: Path) -> list[torch.Tensor]:
        model = _model()
        agent, _ = agents(run_dir, {"surface": "activation", "persistence": "intermittent",
                                    "probability": 0.5, "op": "sign_flip"}, model=model)
        agent.step(1)
        with torch.no_grad():
            return [model(X) for _ in range(12)]

    first, second = outputs(tmp_path / "a"), outputs(tmp_path / "b")
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    distinct = {tuple(o.flatten().tolist()) for o in first}
    assert len(distinct) > 1  # replays of one input in one step do not all agree


def test_once_strikes_each_step_once_and_never_in_a_replay_or_a_restart(
        agents: Any, tmp_path: Path) -> None:
    model = _model()
    clean = copy.deepcopy(model)
    params = {"surface": "activation", "persistence": "once", "op": "scale", "magnitude": 1.0}
    agent, _ = agents(tmp_path, params, model=model)
    agent.step(1)
    with torch.no_grad():
        assert not torch.equal(model(X), clean(X))
        assert torch.equal(model(X), clean(X))  # the same step replayed
        agent.step(2)
        assert not torch.equal(model(X), clean(X))
    agent.close()
    restarted, _ = agents(tmp_path, params, model=model)  # a new process replays step 2
    restarted.step(2)
    with torch.no_grad():
        assert torch.equal(model(X), clean(X))


# --- what each op does ------------------------------------------------------------------------

def _weights(agents: Any, run_dir: Path, params: dict[str, Any]) -> tuple[Any, Any, Recorder]:
    """Old and new ``0.weight`` after the weights surface struck at step 1."""
    model = _model()
    old = model[0].weight.detach().clone()
    agent, rec = agents(run_dir, {"surface": "weights", "param_glob": "0.weight",
                                  "num_elements": 5, **params}, model=model)
    agent.step(1)
    return old.flatten(), model[0].weight.detach().flatten(), rec


def test_bitflip_flips_exactly_bit_k_of_n_elements(agents: Any, tmp_path: Path) -> None:
    old, new, rec = _weights(agents, tmp_path, {"op": "bitflip", "bit_index": 13})
    xor = old.view(torch.int32) ^ new.view(torch.int32)
    assert int((xor != 0).sum()) == 5 and set(xor[xor != 0].tolist()) == {1 << 13}
    (struck,) = rec.of("fault_struck")
    assert struck["bit_index"] == 13 and struck["magnitude"] is None
    assert struck["where"] == ["0.weight"] and struck["num_elements"] == 5


@pytest.mark.parametrize("magnitude", [1e-7, 1e-3, 10.0])
def test_scale_multiplies_by_one_plus_magnitude(agents: Any, tmp_path: Path,
                                                magnitude: float) -> None:
    old, new, rec = _weights(agents, tmp_path, {"op": "scale", "magnitude": magnitude})
    hit = new != old
    (struck,) = rec.of("fault_struck")
    assert struck["changed"] == int(hit.sum()) <= 5 == struck["num_elements"]
    expected = (old.double() * (1 + magnitude)).float()
    assert torch.equal(new[hit], expected[hit]) and hit.any()


def test_noise_is_relative_to_each_value(agents: Any, tmp_path: Path) -> None:
    old, new, _ = _weights(agents, tmp_path, {"op": "noise", "magnitude": 1e-2,
                                              "num_elements": 32})
    hit = new != old
    relative = ((new - old).abs() / old.abs())[hit]
    assert int(hit.sum()) == 32 and float(relative.max()) < 6e-2
    assert float(relative.mean()) == pytest.approx(1e-2 * (2 / torch.pi) ** 0.5, rel=0.4)


def test_sign_flip_negates_the_chosen_elements(agents: Any, tmp_path: Path) -> None:
    old, new, _ = _weights(agents, tmp_path, {"op": "sign_flip"})
    hit = new != old
    assert int(hit.sum()) == 5 and torch.equal(new[hit], -old[hit])


def test_a_bit_outside_the_dtype_is_a_fault_failed_not_an_exception(agents: Any,
                                                                   tmp_path: Path) -> None:
    old, new, rec = _weights(agents, tmp_path, {"op": "bitflip", "bit_index": 40})
    assert torch.equal(old, new)
    (failed,) = rec.of("fault_failed")
    assert "bit_index 40 is outside the 32-bit elements" in failed["error"]


# --- gradient and update -----------------------------------------------------------------------

def test_gradient_is_corrupted_before_accumulation_and_replays_agree(agents: Any,
                                                                     tmp_path: Path) -> None:
    model = _model()
    clean = copy.deepcopy(model)
    agent, rec = agents(tmp_path, {"surface": "gradient", "param_glob": "2.bias",
                                   "op": "scale", "magnitude": 100.0, "num_elements": 4},
                        model=model)
    seen: list[torch.Tensor] = []  # what a post-accumulate hook (DDP's reducer) gets
    model[2].bias.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.clone()))
    agent.step(1)
    model(X).square().sum().backward()
    clean(X).square().sum().backward()
    hit = model[2].bias.grad != clean[2].bias.grad
    assert int(hit.sum()) == 4 and torch.equal(seen[0], model[2].bias.grad)
    assert torch.equal(model[0].weight.grad, clean[0].weight.grad)
    first = model[2].bias.grad.clone()
    model.zero_grad()
    model(X).square().sum().backward()  # a same-device replay of the step
    assert torch.equal(model[2].bias.grad, first)
    agent.step(2)
    assert rec.of("fault_struck")[0]["where"] == ["2.bias"]


def test_update_makes_this_replica_leave_its_twin_right_after_the_step(
        agents: Any, tmp_path: Path) -> None:
    model, twin = _model(), _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.1)
    agent, rec = agents(tmp_path, {"surface": "update", "op": "sign_flip", "num_elements": 2},
                        model=model, optimizer=opt, from_step=2)
    for step in (1, 2, 3):
        agent.step(step)
        for m, o in ((model, opt), (twin, twin_opt)):
            m(X).square().mean().backward()
            o.step()
            o.zero_grad()
        if step == 1:
            assert all(torch.equal(a, b) for a, b in zip(model.parameters(),
                                                        twin.parameters(), strict=True))
    assert not torch.equal(model[0].weight, twin[0].weight)
    agent.close()
    steps = [(r["step"], r["num_elements"], len(r["where"])) for r in rec.of("fault_struck")]
    assert steps == [(2, 8, 4), (3, 8, 4)]  # every step from the trigger on, every parameter


# --- lifetimes ----------------------------------------------------------------------------------

def _strikes(agent: Agent, model: nn.Module, step: int) -> bool:
    clean = copy.deepcopy(model)
    agent.step(step)
    with torch.no_grad():
        return not torch.equal(model(X), clean(X))


@pytest.mark.parametrize("lifetime, after_restart", [("job", True), ("process", False)])
def test_a_restarted_victim_strikes_again_only_for_lifetime_job(
        agents: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lifetime: str,
        after_restart: bool) -> None:
    model = _model()
    params = {"surface": "activation", "op": "sign_flip", "lifetime": lifetime}
    first, _ = agents(tmp_path, params, model=model)
    assert _strikes(first, model, 1)
    first.close()
    monkeypatch.setattr(sdc_action, "_PROCESS_OWNED", set())  # a new process
    restarted, _ = agents(tmp_path, params, model=model)
    assert _strikes(restarted, model, 1) is after_restart


def test_lifetime_node_stays_with_the_node_not_the_rank(agents: Any, tmp_path: Path) -> None:
    params = {"surface": "activation", "op": "sign_flip", "lifetime": "node"}
    model = _model()
    victim, _ = agents(tmp_path, params, model=model, rank=1, node="node1", ranks=[1])
    assert _strikes(victim, model, 1)
    victim.close()
    moved, _ = agents(tmp_path, params, model=model, rank=1, node="node3", ranks=[1])
    assert not _strikes(moved, model, 1)  # the victim rank on a replacement node
    other, _ = agents(tmp_path, params, model=model, rank=0, node="node1", ranks=[1])
    assert _strikes(other, model, 1)  # another rank on the bad node


# --- level 0 ----------------------------------------------------------------------------------

def test_level_0_finds_the_modules_and_corrupts_the_update_before_the_step_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "_current", None)
    monkeypatch.setenv("FAULTLAB_STEP_DIGEST", "1")
    plans = [SdcFault(SdcFault.Params(surface="update", op="sign_flip", seed=1)).plan_entry(
                 "upd", [0], None),
             SdcFault(SdcFault.Params(surface="activation", module_glob="net.*", seed=1)
                      ).plan_entry("act", [0], None)]
    for raw in plans:
        raw["from_step"] = 2
    monkeypatch.setenv("FAULTLAB_RUNTIME_PLAN", str(write_plan(tmp_path / "plan.json", plans)))
    obs = auto.Observer(Identity(run_dir=tmp_path, rank=0, world_size=1, restart=0,
                                 node="node0", pid=os.getpid()))
    obs.start(exit_hooks=False)
    try:
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        _train(model, opt, 1)
        before = auto.param_digest(opt)
        _train(model, opt, 1)
        after = auto.param_digest(opt)
    finally:
        obs.stop()
    steps = {r["step"]: r for r in _records(tmp_path, "step")}
    assert steps[1]["param_digest"] == before and steps[2]["param_digest"] == after
    (failed,) = _records(tmp_path, "fault_failed")
    assert failed["fault_id"] == "act" and "'0', '1', '2'" in failed["error"]
    (struck,) = _records(tmp_path, "fault_struck")
    assert struck["fault_id"] == "upd" and struck["step"] == 2
    assert struck["t"] <= steps[2]["t"]  # written in the step, before its record


def test_gradient_is_in_ddps_bucket_before_its_all_reduce(mesh: Any, agents: Any,
                                                          tmp_path: Path) -> None:
    """Through DDP the corruption is in ``.grad`` after backward. DDP's reducer hooks run on
    accumulation, and the test above shows a post-accumulate hook already sees the wrong
    value; a one-rank group cannot show the averaging into other replicas itself (checked:
    even a post-accumulate corruption survives a world of one)."""
    from torch.nn.parallel import DistributedDataParallel

    model = _model()
    clean = copy.deepcopy(model)
    ddp = DistributedDataParallel(model)
    agent, _ = agents(tmp_path, {"surface": "gradient", "param_glob": "module.2.bias",
                                 "op": "scale", "magnitude": 100.0, "num_elements": 4},
                      model=ddp)
    agent.step(1)
    ddp(X).square().sum().backward()
    clean(X).square().sum().backward()
    assert int((model[2].bias.grad != clean[2].bias.grad).sum()) == 4
