"""The slow faults on CPU: gpu_slow's speed, factor and episodes (validation, the schedule as a
pure function, the rank's slowdown and its ground-truth records), the NVML view that follows
the schedule (a fresh copy of the real pynvml module, no GPU), and collective_delay's
bandwidth-style hold."""

from __future__ import annotations

import importlib.util
import os
import textwrap
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist
from fsdp_helpers import Recorder
from runtime_entries import entry, gpu_entry
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)

from faultlab.errors import InvalidExperimentError
from faultlab.faults.collective import CollectiveDelayFault
from faultlab.faults.gpu import GpuSlowFault
from faultlab.runtime import interposer, nvml_overlay
from faultlab.runtime.actions.collective import payload_bytes
from faultlab.runtime.agent import Agent, Identity
from faultlab.runtime.events import read_events
from faultlab.runtime.gpu import GpuState, write_state
from faultlab.runtime.plan import parse_entry
from faultlab.runtime.throttle import Phase, phase
from faultlab.spec import parse_experiment


def _this_thread_sleeps(monkeypatch: pytest.MonkeyPatch, record: Any) -> None:
    """Hand this thread's ``time.sleep`` calls to ``record`` instead of sleeping. The module's
    ``time`` is the one ``time`` module: patching its ``sleep`` patches every thread's, so only
    this thread's are recorded, and another thread (a timer or an agent's control thread an
    earlier test left running) still sleeps for real."""
    real, me = time.sleep, threading.get_ident()
    monkeypatch.setattr("faultlab.runtime.actions.gpu.time.sleep",
                        lambda s: record(s) if threading.get_ident() == me else real(s))


def problems(params: str, fault: str = "gpu_slow") -> list[str]:
    text = textwrap.dedent(f"""\
        name: s
        target: {{trainer: reference, preset: tiny}}
        topology: {{nodes: 2, procs_per_node: 1}}
        run: {{steps: 20, timeout_s: 120}}
        faults:
          - type: {fault}
            target: {{rank: 1}}
            trigger: {{at_step: 5}}
            duration_s: 30
            params: {params}
        """)
    with pytest.raises(InvalidExperimentError) as info:
        parse_experiment(text, "s.yaml")
    return [str(p) for p in info.value.problems]


def test_speed_is_one_over_factor_and_the_default_stays_1_5() -> None:
    assert GpuSlowFault.Params(speed=0.7).slowdown == pytest.approx(1 / 0.7)
    assert GpuSlowFault.Params(factor=1.1).slowdown == 1.1  # the low end of a sweep
    assert GpuSlowFault.Params().slowdown == 1.5
    entry = gpu_entry("s", "gpu_slow", speed=0.5, episodes={"on_steps": 2, "off_steps": 3})
    assert entry["factor"] == 2.0 and entry["nvml"]["clock_factor"] == 2.0
    assert entry["episodes"] == {"on_steps": 2, "off_steps": 3}


@pytest.mark.parametrize(("params", "where", "says"), [
    ("{factor: 2, speed: 0.5}", "faults[0].params", "give one: factor F is speed 1/F"),
    ("{speed: 1}", "faults[0].params.speed", "must be >= 0.01 and < 1"),
    ("{factor: 1}", "faults[0].params.factor", "must be > 1 and at most 100"),
    ("{episodes: {on_s: 2, off_steps: 3}}", "faults[0].params.episodes",
     "give either on_s and off_s"),
    ("{episodes: {on_steps: 2}}", "faults[0].params.episodes", "['on_steps']"),
    ("{episodes: {period_s: 5}}", "faults[0].params.episodes.period_s",
     "valid keys: on_s, off_s, on_steps, off_steps"),
    ("{episodes: {on_s: 0, off_s: 3}}", "faults[0].params.episodes.on_s", "must be > 0, got 0"),
])
def test_bad_slow_params_are_located(params: str, where: str, says: str) -> None:
    found = problems(params)
    assert found and all("s.yaml:" in p for p in found), found
    assert any(where in p and says in p for p in found), found


def test_the_schedule_is_a_pure_function_of_time_or_steps() -> None:
    assert phase(None, 1e9) == Phase(True, 0, 0.0, None)  # steady: slow until undone
    seconds = {"on_s": 2.0, "off_s": 3.0}
    assert phase(seconds, 0.0) == Phase(True, 0, 0.0, 2.0)
    assert phase(seconds, 1.99) == Phase(True, 0, 0.0, 2.0)
    assert phase(seconds, 2.0) == Phase(False, 0, 2.0, 5.0)
    assert phase(seconds, 5.0) == Phase(True, 1, 5.0, 7.0)
    assert phase(seconds, -1.0) == phase(seconds, 0.0)
    steps = {"on_steps": 2, "off_steps": 3}
    assert [phase(steps, s).on for s in range(11)] == [
        True, True, False, False, False, True, True, False, False, False, True]
    assert phase(steps, 7).episode == 1 and phase(steps, 10).episode == 2


def _rank_env(monkeypatch: pytest.MonkeyPatch, run_dir: Path) -> None:
    for key, value in {"FAULTLAB_RUN_DIR": str(run_dir), "RANK": "1", "WORLD_SIZE": "2",
                       "LOCAL_RANK": "0", "FAULTLAB_NODE": "node1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("FAULTLAB_CHANNEL", raising=False)


def _fresh_nvml(state: Path) -> ModuleType:
    """A module object of its own for the real pynvml, overlaid (the test process's pynvml is
    left alone); there is no GPU here, so it shows faked devices."""
    spec = importlib.util.find_spec("pynvml")
    assert spec is not None and spec.loader is not None
    nvml = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nvml)
    assert nvml_overlay.apply(nvml, {"FAULTLAB_GPU_STATE": str(state),
                                     "FAULTLAB_GPU_COUNT": "2"}) is not None
    nvml.nvmlInit()
    return nvml


def _view(nvml: ModuleType, index: int) -> tuple[int, int, int, int, int]:
    h = nvml.nvmlDeviceGetHandleByIndex(index)
    return (nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
            nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM),
            nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_SM),
            nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
            nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))


HEALTHY = (1980, 2619, 1980, 41, 0)


def test_steps_episodes_slow_the_rank_record_ground_truth_and_move_nvml(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _rank_env(monkeypatch, tmp_path)
    state = tmp_path / "gpu" / "node1" / "state.json"
    write_state(state, [gpu_entry("slow", "gpu_slow", devices=[0], t=100.0, factor=2.0,
                                  episodes={"on_steps": 2, "off_steps": 1})])
    nvml = _fresh_nvml(state)
    assert _view(nvml, 0) == (990, 2619, 1980, 92, 0x68)  # throttled from the injection
    gpu = GpuState(state, 0, 1)
    slept: list[float] = []
    _this_thread_sleeps(monkeypatch, slept.append)
    seen = []
    model = torch.nn.Linear(4, 4)  # a real module, its forward timed by the real hooks
    for _ in range(7):  # no runtime agent here: a step is an outermost forward
        gpu.pre_forward(model, ())
        gpu.post_forward(model, (), None)
        seen.append(_view(nvml, 0))
    on = [(1, 2), (4, 5), (7,)]  # forwards 1-2 slow, 3 not, 4-5 slow, 6 not, 7 slow
    assert len(slept) == 5 and all(s > 0 for s in slept)
    assert [v[0] for v in seen] == [990, 990, 1980, 990, 990, 1980, 990]
    assert seen[2] == HEALTHY and seen[5] == HEALTHY  # between episodes: healthy
    write_state(state, [])  # undone
    gpu.refresh(1e12)
    assert _view(nvml, 0) == HEALTHY and _view(nvml, 1) == HEALTHY
    records = [r for r in read_events(tmp_path / "events") if r["fault_id"] == "slow"]
    struck = [(r["step"], r["episode"], r.get("until_step")) for r in records
              if r["kind"] == "fault_struck"]
    eased = [(r["step"], r["episode"], r["why"]) for r in records if r["kind"] == "fault_eased"]
    assert struck == [(s[0], i, s[0] + 2) for i, s in enumerate(on)]
    assert eased == [(3, 0, "episode over"), (6, 1, "episode over"), (7, 2, "undone")]
    assert {(r["rank"], r["node"], r["factor"], r["type"]) for r in records} == {
        (1, "node1", 2.0, "gpu_slow")}


def test_seconds_episodes_move_nvml_with_the_clock_in_any_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state.json"
    write_state(state, [gpu_entry("slow", "gpu_slow", devices=[1], t=1000.0, speed=0.5,
                                  episodes={"on_s": 2, "off_s": 3})])
    nvml = _fresh_nvml(state)
    now = [1000.0]
    monkeypatch.setattr("faultlab.runtime.nvml_overlay.time.time", lambda: now[0])
    views = []
    for t in (1000.5, 1001.99, 1002.0, 1004.99, 1005.0, 1007.5):
        now[0] = t
        views.append((_view(nvml, 1)[0], _view(nvml, 1)[3], _view(nvml, 0)[0]))
    assert views == [(990, 92, 1980), (990, 92, 1980), (1980, 41, 1980), (1980, 41, 1980),
                     (990, 92, 1980), (1980, 41, 1980)]


def test_a_seconds_episode_is_recorded_at_its_scheduled_start_and_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _rank_env(monkeypatch, tmp_path)
    state = tmp_path / "state.json"
    write_state(state, [gpu_entry("slow", "gpu_slow", devices=[0], t=1000.0, factor=3.0,
                                  episodes={"on_s": 2, "off_s": 3})])
    gpu = GpuState(state, 0, 1)
    gpu.refresh(1e12)
    [action] = gpu.actions.values()
    now = [1000.5]
    slept: list[float] = []
    monkeypatch.setattr("faultlab.runtime.actions.gpu.time.time", lambda: now[0])
    _this_thread_sleeps(monkeypatch, slept.append)
    action.after_forward(None, 0.1)  # in episode 0: (3 - 1) x 0.1 s
    now[0] = 1001.9
    action.after_forward(None, 0.1)  # 0.1 s of the episode left: held only that long
    now[0] = 1003.0
    action.after_forward(None, 0.1)  # between episodes: full speed
    assert slept == [pytest.approx(0.2), pytest.approx(0.1)]
    records = read_events(tmp_path / "events")
    assert [(r["kind"], r["t"], r["episode"]) for r in records] == [
        ("fault_struck", 1000.0, 0), ("fault_eased", 1002.0, 0)]
    assert records[0]["until_t"] == 1002.0 and records[0]["speed"] == pytest.approx(1 / 3)


def test_bandwidth_holds_big_collectives_longer_than_small_ones() -> None:
    big, small = torch.zeros(1 << 20), torch.zeros(16)
    assert payload_bytes((big,), {}) == 4 << 20
    assert payload_bytes(([small, small], small), {"group": None}) == 128
    assert payload_bytes(("x", 3), {}) == 0
    defaults = CollectiveDelayFault.Params().runtime_params()
    assert defaults["delay_ms"] == 100.0 and defaults["bandwidth_gbps"] is None
    link = CollectiveDelayFault.Params(bandwidth_gbps=1.0).runtime_params()
    assert link["delay_ms"] == 0.0  # a link, not a fixed delay, unless both are given
    [bad] = problems("{bandwidth_gbps: 0}", fault="collective_delay")
    assert "faults[0].params.bandwidth_gbps" in bad and "must be > 0, got 0" in bad


def test_a_slow_link_holds_the_victims_big_all_reduce_longer_than_a_small_one(
        mesh: Any, tmp_path: Path) -> None:
    """A real all_reduce on the one-rank gloo group, through the interposer and the agent."""
    plan = [parse_entry(entry({"id": "link", "type": "collective_delay", "ranks": [0],
                               "from_step": 1, "to_step": 9,
                               "params": {"bandwidth_gbps": 1.0, "ops": ["all_reduce"]}}))]
    interposer.install()
    agent = Agent(Identity(run_dir=tmp_path, rank=0, world_size=1, restart=0, node="node0",
                           pid=os.getpid()), emit=Recorder().emit, plan=plan)
    try:
        agent.step(1)
        held = []
        for tensor in (torch.zeros(16), torch.zeros(1 << 20)):  # 64 B, then 4 MiB
            before = agent.status()["active"][0]["total_delay_s"]
            t0 = time.monotonic()
            dist.all_reduce(tensor)
            took = time.monotonic() - t0
            held.append(agent.status()["active"][0]["total_delay_s"] - before)
            assert not took < held[-1]  # the call really waited at least that long
    finally:
        agent.close()
        interposer.uninstall()
    assert held[0] == pytest.approx(64 * 8 / 1e9, abs=1e-4)
    assert held[1] == pytest.approx((4 << 20) * 8 / 1e9, abs=1e-3)  # 33.6 ms at 1 Gbit/s


def test_forward_and_backward_are_each_stretched_by_their_own_compute(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real global module hooks and a real backward: the backward's share is held in the
    autograd engine's final callback, once per backward, only while the episode is on."""
    state = tmp_path / "state.json"
    write_state(state, [gpu_entry("slow", "gpu_slow", devices=[0], factor=2.0,
                                  episodes={"on_steps": 1, "off_steps": 1})])
    gpu = GpuState(state, 0, 0)
    held: list[tuple[str, float]] = []
    _this_thread_sleeps(monkeypatch, lambda s: held.append(
        ("backward" if torch._C._current_graph_task_id() >= 0 else "forward", s)))
    handles = [register_module_forward_pre_hook(gpu.pre_forward),
               register_module_forward_hook(gpu.post_forward)]
    try:
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 1))
        for _ in range(4):  # slow, full speed, slow, full speed
            model(torch.ones(32, 64)).sum().backward()
        with torch.no_grad():
            model(torch.ones(32, 64))  # slow, and no backward to wait for
    finally:
        for h in handles:
            h.remove()
    assert [w for w, _ in held] == ["forward", "backward", "forward", "backward", "forward"]
    assert all(s > 0 for _, s in held)
