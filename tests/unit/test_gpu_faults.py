"""The gpu faults on CPU: validation, the node state they write and undo, the guard's clean-up,
what a rank meets (real processes importing torch under the bootstrap) and what a plain
``pynvml`` health-check script reads through the NVML overlay (a real subprocess, real pynvml
calls, no GPU)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from runtime_entries import gpu_entry

from faultlab.errors import InvalidExperimentError
from faultlab.faults import Victim, fault_types
from faultlab.faults.gpu import GpuErrorFault, GpuOomFault, GpuSlowFault
from faultlab.reaper import clear_gpu_state
from faultlab.runtime.bootstrap import BOOTSTRAP_DIR
from faultlab.runtime.gpu import XIDS, GpuState, read_state, state_paths, write_state
from faultlab.spec import parse_experiment

XID_RE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)")


def doc(fault: str, target: str = "target: {trainer: reference, preset: tiny}") -> str:
    return textwrap.dedent(f"""\
        name: g
        {target}
        topology: {{nodes: 2, procs_per_node: 1}}
        run: {{steps: 20, timeout_s: 120}}
        faults:
          - target: {{node: 1}}
            trigger: {{at_step: 5}}
            duration_s: 30
        """) + textwrap.indent(fault, "    ")


def problems(text: str) -> list[str]:
    with pytest.raises(InvalidExperimentError) as info:
        parse_experiment(text, "g.yaml")
    return [str(p) for p in info.value.problems]


def test_registered_and_listed() -> None:
    assert {"gpu_error", "gpu_oom", "gpu_slow"} <= set(fault_types())
    assert GpuErrorFault.Params().xid == 79 and GpuErrorFault.Params().sticky is False


def test_bad_input_is_one_located_line_each() -> None:
    [xid] = problems(doc("type: gpu_error\nparams: {xid: 80}"))
    assert "g.yaml:" in xid and "faults[0].params.xid" in xid
    assert "13, 31, 43, 48, 79, 94, 95" in xid
    [factor] = problems(doc("type: gpu_slow\nparams: {factor: 1}"))
    assert "faults[0].params.factor" in factor and "must be > 1" in factor
    [leave] = problems(doc("type: gpu_oom\nparams: {leave_mib: 10000000}"))
    assert "faults[0].params.leave_mib" in leave and "not smaller than the device" in leave


def test_a_command_that_is_not_python_cannot_be_reached_in_rank(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\n")
    [why] = problems(doc("type: gpu_error", f"target: {{command: [sh, {script}]}}"))
    assert "faults[0].type" in why and "not a Python interpreter" in why
    assert "start the command with python" in why
    parse_experiment(doc("type: gpu_error", f"target: {{command: [python, {script}]}}"))


class Ctx:
    """Two nodes of one rank each, as the engine's target would report them."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.lost: list[str] = []

    def node_names(self) -> list[str]:
        return ["node0", "node1"]

    def ranks(self) -> list[int]:
        return [0, 1]

    def node_of_rank(self, rank: int) -> str:
        return f"node{rank}"

    def rank_pid(self, rank: int) -> int:
        return 4242 + rank

    def mark_lost(self, node: str) -> None:
        self.lost.append(node)


def test_inject_writes_the_node_state_and_an_xid_line_undo_clears_the_state(
        tmp_path: Path) -> None:
    ctx = Ctx(tmp_path)
    fault = GpuErrorFault(GpuErrorFault.Params(xid=79, sticky=True))
    details = fault.inject(ctx, Victim("node", 1))  # type: ignore[arg-type]
    paths = state_paths(tmp_path, "node1")
    [entry] = read_state(paths["state"])
    assert entry["xid"] == 79 and entry["sticky"] is True and entry["devices"] is None
    assert details["node"] == "node1" and details["ranks"] == [1]
    assert details["xid_log"] == str(state_paths(tmp_path, "node1")["xid_log"])
    assert XID_RE.search(details["xid_lines"][0])  # the journal keeps the line too
    assert ctx.lost == ["node1"]  # a sticky GPU: the node's exit is expected
    line = paths["xid_log"].read_text()
    assert XID_RE.search(line).group(2) == "79" and "pid=4243" in line  # type: ignore[union-attr]
    assert "GPU has fallen off the bus." in line
    fault.undo(ctx)  # type: ignore[arg-type]
    assert read_state(paths["state"]) == []
    assert XID_RE.search(paths["xid_log"].read_text())  # kept as evidence


def test_two_faults_on_one_node_are_undone_one_by_one(tmp_path: Path) -> None:
    ctx = Ctx(tmp_path)
    slow = GpuSlowFault(GpuSlowFault.Params(factor=2.0))
    ecc = GpuErrorFault(GpuErrorFault.Params(xid=48))
    slow.inject(ctx, Victim("rank", 0))  # type: ignore[arg-type]
    ecc.inject(ctx, Victim("rank", 0))  # type: ignore[arg-type]
    state = state_paths(tmp_path, "node0")["state"]
    assert [e["type"] for e in read_state(state)] == ["gpu_slow", "gpu_error"]
    assert read_state(state)[0]["devices"] == [0]
    slow.undo(ctx)  # type: ignore[arg-type]
    assert [e["type"] for e in read_state(state)] == ["gpu_error"]
    assert ctx.lost == []  # transient: the node's exit code still counts


def test_the_guard_clears_every_state_file_and_keeps_the_xid_logs(tmp_path: Path) -> None:
    ctx = Ctx(tmp_path)
    GpuErrorFault(GpuErrorFault.Params(sticky=True)).inject(ctx, Victim("node", 0))  # type: ignore[arg-type]
    GpuOomFault(GpuOomFault.Params()).inject(ctx, Victim("node", 1))  # type: ignore[arg-type]
    cleared = clear_gpu_state(tmp_path / "gpu")
    assert len(cleared) == 2 and not list((tmp_path / "gpu").glob("*/state.json"))
    assert (tmp_path / "gpu" / "node0" / "xid.log").read_text()


def _run_rank(state: Path, local_rank: int, code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(BOOTSTRAP_DIR), "FAULTLAB_GPU_STATE": str(state),
           "LOCAL_RANK": str(local_rank), "RANK": str(local_rank), "FAULTLAB_GPU_COUNT": "2"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120)


FORWARDS = """\
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))
    for i in range(3):
        try:
            model(torch.randn(2, 8))
            print("ok")
        except Exception as e:
            print(type(e).__name__, repr(str(e).splitlines()[0]))
    """


def test_sticky_error_fails_every_forward_of_every_new_process(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    write_state(state, [gpu_entry("e", "gpu_error", xid=79, sticky=True, devices=[1], t=0.0)])
    for _ in range(2):  # a restarted process meets it again
        out = _run_rank(state, 1, FORWARDS).stdout.splitlines()
        assert out == ["AcceleratorError 'CUDA error: CUDA-capable device(s) is/are busy or "
                       "unavailable'"] * 3
    assert _run_rank(state, 0, FORWARDS).stdout.splitlines() == ["ok"] * 3  # other device


def test_transient_error_strikes_once_per_job_then_oom_once(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    write_state(state, [gpu_entry("e", "gpu_error", xid=94, sticky=False, devices=None, t=0.0)])
    first = _run_rank(state, 0, FORWARDS)
    assert first.stdout.splitlines() == [
        "AcceleratorError 'CUDA error: uncorrectable ECC error encountered'", "ok", "ok"]
    assert "faultlab gpu: rank 0: gpu_error xid 94 on device 0" in first.stderr
    assert _run_rank(state, 0, FORWARDS).stdout.splitlines() == ["ok"] * 3  # a restart
    write_state(state, [gpu_entry("m", "gpu_oom", leave_mib=512, devices=[0])])
    out = _run_rank(state, 0, FORWARDS.replace("str(e).splitlines()[0]",
                                                "str(e)[:120]")).stdout.splitlines()
    assert out[0].startswith("OutOfMemoryError 'CUDA out of memory. Tried to allocate ")
    assert "GPU 0 has a total capacity of 79.65 GiB of which 512.00 MiB is free" in out[0]
    assert out[1:] == ["ok", "ok"]


def test_slow_sleeps_factor_minus_one_times_the_measured_compute(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state.json"
    write_state(state, [gpu_entry("s", "gpu_slow", factor=2.5, devices=[0])])
    gpu = GpuState(state, 0, 0)
    slept: list[float] = []
    clock = iter([100.0, 100.0, 100.2, 100.2])  # refresh, forward start, forward end...
    monkeypatch.setattr("faultlab.runtime.gpu.time.monotonic", lambda: next(clock))
    monkeypatch.setattr("faultlab.runtime.gpu.time.sleep", slept.append)
    top, inner = object(), object()
    gpu.pre_forward(top, ())
    gpu.pre_forward(inner, ())  # nested: not the rank's outermost forward
    gpu.post_forward(inner, (), None)
    gpu.post_forward(top, (), None)
    # the forward's 0.2 s, less the (real, near-zero) time this thread waited for a CPU
    assert slept == [pytest.approx((2.5 - 1) * 0.2, abs=0.01)]


HEALTH_CHECK = Path(__file__).with_name("gpu_health_check.py")


def _health(state: Path | None) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTLAB_")}
    if state is not None:
        env.update(PYTHONPATH=str(BOOTSTRAP_DIR), FAULTLAB_GPU_STATE=str(state),
                   FAULTLAB_GPU_COUNT="3")
    out = subprocess.run([sys.executable, str(HEALTH_CHECK)], env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def test_nvml_view_read_by_a_plain_pynvml_health_check(tmp_path: Path) -> None:
    assert _health(None)["nvml"].startswith("not available")  # no GPU, no overlay
    state = tmp_path / "state.json"
    write_state(state, [])
    healthy = _health(state)
    assert healthy["count"] == 3 and all(d["healthy"] for d in healthy["devices"])
    assert {(d["sm_clock_mhz"], d["sm_max_mhz"], d["temperature_c"])
            for d in healthy["devices"]} == {(1980, 1980, 41)}
    write_state(state, [
        gpu_entry("s", "gpu_slow", factor=2.0, devices=[0]),
        gpu_entry("m", "gpu_oom", leave_mib=512, devices=[0]),
        gpu_entry("e", "gpu_error", xid=48, sticky=False, devices=[1]),
        gpu_entry("l", "gpu_error", xid=79, sticky=True, devices=[2])])
    slow, ecc, lost = _health(state)["devices"]
    assert slow["temperature_c"] == 92 and slow["throttle_reasons"] == "0x68"
    assert slow["sm_clock_mhz"] == 990 and slow["sm_max_mhz"] == 1980  # max / factor 2
    assert slow["free_mib"] == 512 and slow["recovery_action"] == 0
    assert ecc["ecc_uncorrected"] == 1 and ecc["xid_event"] == 48
    assert ecc["recovery_action"] == 1 and not ecc["healthy"]  # GPU_RESET
    assert lost == {"index": 2, "healthy": False, "error": "NVMLError_GpuIsLost: GPU is lost"}


def test_the_xid_table_says_what_each_xid_raises() -> None:
    ecc = {x for x, row in XIDS.items() if row[4]}
    assert ecc == {48, 94, 95}
    assert XIDS[79][3] == 2  # NODE_REBOOT


def _start(t: float, rank: int, node: str, world: int) -> dict[str, Any]:
    return {"t": t, "kind": "start", "rank": rank, "node": node, "world_size": world}


def _step(t: float, rank: int, node: str, step: int) -> dict[str, Any]:
    return {"t": t, "kind": "step", "rank": rank, "node": node, "step": step}


def test_exclusion_metrics_count_the_restarts_until_the_node_is_gone() -> None:
    from faultlab.observe import FaultRecord
    from faultlab.observe.exclusion import faulty_node_excluded, restarts_until_excluded

    lost = FaultRecord(id="g", type="gpu_error", injected_t=10.0,
                       details={"node": "node1", "sticky": True})
    three = [_start(0, r, f"node{r}", 3) for r in range(3)] + \
        [_step(5, r, f"node{r}", 1) for r in range(3)]
    # A job that restarts in place on the bad node twice, then without it.
    in_place = [*three, _start(12, 0, "node0", 3), _start(12.1, 1, "node1", 3),
                _start(20, 0, "node0", 3), _start(20.2, 1, "node1", 3),
                _start(30, 0, "node0", 2), _step(31, 0, "node0", 2), _step(31, 1, "node2", 2)]
    assert restarts_until_excluded(in_place, [lost]) == 3
    assert faulty_node_excluded(in_place, [lost], completes=True) is True
    assert faulty_node_excluded(in_place, [lost], completes=False) is False
    never = [*three, _start(12, 0, "node0", 3), _step(13, 1, "node1", 2)]
    assert restarts_until_excluded(never, [lost]) is None
    assert faulty_node_excluded(never, [lost], completes=True) is False
    transient = FaultRecord(id="t", type="gpu_error", injected_t=10.0,
                            details={"node": "node1", "sticky": False})
    assert restarts_until_excluded(in_place, [transient]) is None
    assert faulty_node_excluded(in_place, [transient], completes=True) is None


def test_compute_straggler_is_named_from_forward_times() -> None:
    from reference_trainer.health import ComputeStragglerDetector

    d = ComputeStragglerDetector(3, ratio=1.5, threshold_s=0.0, num_steps=3, window=3)
    # the window's first steps are warm-up: nothing is judged on them, however slow
    assert d.update([0.1, 0.9, 0.1]) is None and d.update([0.1, 0.9, 0.1]) is None
    for _ in range(3):  # the medians even out: nobody
        assert d.update([0.1, 0.12, 0.11]) is None
    # one slow step of a fault-free rank (a loaded machine) moves no median
    assert d.update([0.1, 0.4, 0.1]) is None
    for _ in range(3):
        assert d.update([0.1, 0.12, 0.1]) is None
    # rank 1 at 3x: its median turns at the second slow step, then 3 steps in a row name it
    named = [d.update([0.1, 0.3, 0.1]) for _ in range(4)]
    assert named[:3] == [None] * 3 and named[3] is not None, named
    assert named[3]["straggler_rank"] == 1 and named[3]["cause"] == "slow_compute"
    assert named[3]["forward_ratio"] == 3.0
    # its score, NVRx's way: the fastest rank's (median) time over its own
    assert named[3]["score"] == 0.333 and named[3]["scores"] == [1.0, 0.333, 1.0]
    assert d.update([0.1, 0.3, 0.1]) is None  # once per episode
    # with no floor (threshold_s 0) 3x of 10 ms is named as 3x of 100 ms is, and the
    # peers' wait for a CPU is kept in the record without taking the slowness away
    # (subtracting it hid a real 3x straggler on a loaded machine)
    fast = ComputeStragglerDetector(2, ratio=1.5, threshold_s=0.0, num_steps=1, window=1)
    named_fast = fast.update([0.03, 0.01], [0.0, 0.09])
    assert named_fast is not None and named_fast["straggler_rank"] == 0
    assert named_fast["peers_cpu_wait_s"] == 0.09
    slight = ComputeStragglerDetector(2, ratio=1.5, threshold_s=0.0, num_steps=1, window=1)
    assert slight.update([0.10, 0.14]) is None  # 1.4x: not slow enough
    assert slight.update([0.10, float("nan")]) is None  # NaN names nobody


def test_the_time_a_rank_waited_for_a_cpu_is_not_its_compute() -> None:
    """``runnable_wait_s``: a thread that shares one CPU with a busy process waits about half
    of the time, by the scheduler's own count, and that wait is what a forward pass timed by the
    wall clock must not take for slow compute (a fault-free rank on a CPU-capped machine was
    named a straggler for it)."""
    from faultlab.runtime.gpu import runnable_wait_s

    code = """\
        import os, time
        from faultlab.runtime.gpu import runnable_wait_s
        os.sched_setaffinity(0, {0})
        t0, w0 = time.monotonic(), runnable_wait_s()
        while time.monotonic() - t0 < 1.0:
            pass
        print(time.monotonic() - t0, runnable_wait_s() - w0)
        """
    hog = subprocess.Popen([sys.executable, "-c", "import os\nos.sched_setaffinity(0, {0})\n"
                            "while True: pass"])
    try:
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                             text=True, check=True, timeout=60).stdout
    finally:
        hog.kill()
        hog.wait()
    wall, waited = map(float, out.split())
    assert waited >= 0.25 * wall, (wall, waited)  # a fair share of one CPU is half
    assert runnable_wait_s() >= 0.0


def test_health_check_of_the_reference_trainer_through_the_overlay(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    write_state(state, [gpu_entry("e", "gpu_error", xid=79, sticky=True, devices=[1]),
                        gpu_entry("s", "gpu_slow", factor=2.0, devices=[0])])
    code = """\
        import json
        from reference_trainer.gpu_health import check_gpu
        print(json.dumps([[check_gpu(d).status, check_gpu(d).reasons] for d in (0, 1)]))
        """
    out = _run_rank(state, 0, code)
    assert json.loads(out.stdout) == [["healthy", []],
                                      ["unhealthy", ["GPU is lost (NVMLError_GpuIsLost)"]]]
    bare = subprocess.run([sys.executable, "-c", "from reference_trainer.gpu_health import "
                           "check_gpu; c = check_gpu(0); print(c.status, c.reasons)"],
                          capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items()
                               if not k.startswith("FAULTLAB_")})
    assert bare.stdout.startswith("not_available ['NVML: NVML Shared Library Not Found']")


def test_the_guard_process_clears_the_gpu_state_when_faultlab_dies(tmp_path: Path) -> None:
    """The real guard (faultlab.reaper) of a 'faultlab' that is SIGKILLed."""
    GpuErrorFault(GpuErrorFault.Params(sticky=True)).inject(Ctx(tmp_path), Victim("node", 1))  # type: ignore[arg-type]
    state = tmp_path / "gpu" / "node1" / "state.json"
    assert read_state(state)
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    pidfile = tmp_path / "pids.json"
    pidfile.write_text("[]")
    guard = subprocess.Popen([sys.executable, "-m", "faultlab.reaper", "--parent",
                              str(engine.pid), "--pidfile", str(pidfile), "--interval-s", "0.05",
                              "--gpu-dir", str(tmp_path / "gpu")], stderr=subprocess.PIPE,
                             text=True)
    engine.kill()
    engine.wait()
    _, err = guard.communicate(timeout=60)
    assert guard.returncode == 0 and "cleared 1 GPU state file(s)" in err
    assert not state.exists() and (tmp_path / "gpu" / "node1" / "xid.log").read_text()


@pytest.mark.parametrize("cls", [GpuErrorFault, GpuOomFault, GpuSlowFault], ids=lambda c: c.type)
def test_a_gpu_fault_names_its_rank_side_action(cls: type[Any]) -> None:
    from faultlab.runtime.hooks import load_action, uses

    assert cls.rank_action is not None
    action = load_action(cls.rank_action)
    assert uses(action, "before_forward") or uses(action, "after_forward")
