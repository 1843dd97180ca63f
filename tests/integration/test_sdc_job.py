"""``sdc`` in a real job through ``faultlab run``: the reference trainer (FSDP2, level 2) with a
mercurial rank 1 on ``update`` and an intermittent rank 0 on ``gradient``. What no in-process
test shows: the launch plan reaches the ranks, a sharded (DTensor) parameter is hit in its
local shard, the gradient of FSDP2 parameters is hit in the reduce-scatter's input through the
collective interposer, every step from the trigger on has its ``fault_struck`` record, and the
corruption carries to the final weights (the golden comparison fails). 40 steps with a
checkpoint every 10, as experiments/rank_kill.yaml: the suite computes that golden run anyway,
and one of 16 steps of its own cost more than the 24 steps more here."""

from __future__ import annotations

from pathlib import Path

import pytest

from faultlab.observe.stream import EventStream
from tests.integration.test_faultlab_run import Cli, journal, sla

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

SDC = """\
name: sdc_update_and_gradient
seed: 0
target: {trainer: reference, preset: tiny}
topology: {nodes: 2, procs_per_node: 1}
run: {steps: 40, checkpoint_every: 10, timeout_s: 240}
faults:
  - id: upd
    type: sdc
    target: {rank: 1}
    trigger: {at_step: 6}
    params: {surface: update, op: scale, magnitude: 0.01, num_elements: 4}
  - id: grad
    type: sdc
    target: {rank: 0}
    trigger: {at_step: 10}
    params: {surface: gradient, op: noise, magnitude: 0.5, num_elements: 16,
             persistence: intermittent, probability: 0.5}
expect:
  completes: true
  bitwise_equal_to_golden: true
"""


def test_a_mercurial_rank_strikes_every_step_and_its_model_leaves_the_golden_run(
        tmp_path: Path, golden_cache: Path, cli: Cli) -> None:
    exp = tmp_path / "sdc.yaml"
    exp.write_text(SDC)
    rc, out = cli("run", exp, "--report-dir", tmp_path / "reports",
                  "--golden-cache", golden_cache)
    assert rc == 1, out  # only the golden comparison fails: the corruption carried
    j = journal(tmp_path / "reports")
    assert sla(j, "completes")["passed"] is True
    golden = sla(j, "bitwise_equal_to_golden")
    assert golden["passed"] is False and golden["measured"] is False, golden
    assert {f["id"]: f["capabilities"] for f in j["faults"]} == {
        "upd": ["corrupts_silently"], "grad": ["corrupts_silently"]}
    [run_dir] = (tmp_path / "reports").glob("*/job")
    struck = [e for e in EventStream(run_dir).poll() if e["kind"] == "fault_struck"]
    upd = [e for e in struck if e["fault_id"] == "upd"]
    assert [e["step"] for e in upd] == list(range(6, 41))  # every step, the last one too
    assert {e["rank"] for e in upd} == {1} and all(e["changed"] for e in upd)
    assert all(e["num_elements"] == 4 * len(e["where"]) for e in upd)
    grad = [e for e in struck if e["fault_id"] == "grad"]
    assert grad and {e["rank"] for e in grad} == {0}
    assert all(e["step"] >= 10 and e["where"] == ["reduce_scatter_single"] for e in grad)
    assert len({e["step"] for e in grad}) == len(grad)  # one record per step
