"""Reproducibility and the noise verdict (faultlab.judge.noise), judged from two fault-free runs.

The end-to-end proof is tests/examples' ``nondeterministic`` pair: a correct resume of a
trainer with noise in every update passes ``matches_golden_within_noise`` and a resume that
forgets its LR schedule fails it, named by step. These tests pin the logic: the envelope, the
step named, what "not measured" means, and the spec's key.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from faultlab.engine.golden import GoldenRun, golden_key
from faultlab.errors import InvalidExperimentError
from faultlab.judge import judge
from faultlab.judge.noise import (
    ADD_NOISE_SLA,
    CAUSES,
    reproducibility,
    resolution,
    run_losses,
    within_noise,
)
from faultlab.judge.verdict import verdict_of
from faultlab.observe import compute_metrics
from faultlab.spec import experiment_from_dict, parse_experiment
from tests.unit.test_engine import BASE, INJECTED, KILL, _run_events, exp_with

A = {1: 2.0, 2: 1.5, 3: 1.2, 4: 1.0, 5: 0.9}
B = {1: 2.0, 2: 1.5001, 3: 1.1998, 4: 1.0003, 5: 0.9002}  # spread 0, 1e-4, 2e-4, 3e-4, 2e-4


def golden(second: dict[str, Any] | None, digest: str = "abc") -> GoldenRun:
    return GoldenRun(key="k", digest=digest, losses=A, wall_s=1.0, run_dir="", cached=True,
                     second=second)


def test_two_runs_with_one_digest_are_reproducible_and_two_that_differ_name_the_step() -> None:
    assert reproducibility(golden(None)) is None  # one run says nothing
    same = reproducibility(golden({"digest": "abc", "losses": A}))
    assert same is not None and same.reproducible
    differ = reproducibility(golden({"digest": "xyz", "losses": B}))
    assert differ is not None and not differ.reproducible
    assert differ.first_step == 2 and differ.max_loss_diff == pytest.approx(3e-4)
    assert differ.note().startswith("not measured: two fault-free runs differ from step 2")
    assert CAUSES in differ.note() and "CUBLAS_WORKSPACE_CONFIG=:4096:8" in CAUSES
    # a level-0 job has no digest event: its checkpoint tensors decide
    tensors = GoldenRun(key="k", digest=None, losses=A, wall_s=1.0, run_dir="", cached=True,
                        tensors={"w": "1"}, second={"tensors": {"w": "2"}, "losses": A})
    repro = reproducibility(tensors)
    assert repro is not None and not repro.reproducible and repro.first_step is None
    assert "in their final state only" in repro.note()


def test_a_run_within_the_envelope_passes_and_one_that_leaves_it_is_named_by_step() -> None:
    g = golden({"digest": "xyz", "losses": B})
    # the envelope is the running maximum of |A - B|: 0, 1e-4, 2e-4, 3e-4, 3e-4
    close = within_noise(g, {1: 2.0, 2: 1.5002, 3: 1.2003, 4: 1.0, 5: 0.90075}, None, 3.0)
    assert close.passed and close.measured == pytest.approx(2.5)
    assert close.note.startswith("within 2.50 times the noise at every step")
    off = within_noise(g, {1: 2.0, 2: 1.5, 3: 1.2, 4: 1.01, 5: 0.95}, None, 3.0)
    assert not off.passed and off.measured == pytest.approx(0.05 / 3e-4, abs=1e-3)  # step 5
    assert off.note.startswith("left the noise envelope at step 4: loss 0.01 from the golden "
                               "run's, 33.33 times")
    # where the two fault-free runs agreed, the noise is the loss's own resolution (4 float32
    # ulps of 2.0: 9.5e-07): a run a digit off is within it, one 0.1 off is far outside
    ulp_off = within_noise(g, {1: 2.0 + 2.4e-7, 2: 1.5}, None, 3.0)
    assert ulp_off.passed and ulp_off.measured == pytest.approx(0.25, abs=0.01)
    first = within_noise(g, {1: 2.1, 2: 1.5}, None, 3.0)
    assert not first.passed and first.measured == pytest.approx(0.1 / 9.5367e-07, rel=1e-3)
    assert "at step 1" in first.note


def test_the_noise_is_never_below_the_losses_resolution() -> None:
    """Seen in CI: both fault-free runs recorded the same loss at step 2 (the noise still under
    float32's last digit) and the correct resume's was one ulp off: infinitely many times a
    noise of 0, a verdict that flipped with the draw. The floor is 4 float32 ulps."""
    assert resolution(2.0) == 4 * 2.0 ** -22 and resolution(-3.0) == resolution(3.0)
    assert resolution(0.0) > 0
    same = GoldenRun(key="k", digest="abc", losses={1: 6.0, 2: 5.0, 3: 4.0}, wall_s=1.0,
                     run_dir="", cached=True, second={"losses": {1: 6.0, 2: 5.0, 3: 4.0}})
    one_ulp = 2.0 ** -21  # float32's spacing at 5.0
    assert within_noise(same, {1: 6.0, 2: 5.0 + one_ulp, 3: 4.0}, None, 10).passed


def test_without_a_second_run_or_a_shared_step_it_is_not_measured() -> None:
    assert within_noise(golden(None), A, None, 10).measured is None
    assert "golden: {runs: 2}" in within_noise(golden(None), A, None, 10).note
    none = within_noise(golden({"losses": B}), {9: 1.0}, None, 10)
    assert none.measured is None and "share no step" in none.note


def test_a_replayed_step_counts_as_its_last_run() -> None:
    events = [{"kind": "step", "rank": 0, "step": 9, "loss": 1.0, "t": 1.0},
              {"kind": "step", "rank": 1, "step": 9, "loss": 7.0, "t": 1.5},
              {"kind": "step", "rank": 0, "step": 9, "loss": 2.0, "t": 3.0},
              {"kind": "step", "rank": 0, "step": 10, "loss": 1.5, "t": 2.0}]
    assert run_losses(events) == {9: 2.0, 10: 1.5}


def test_on_an_unreproducible_trainer_bitwise_is_covered_by_a_measured_noise_verdict() -> None:
    exp = exp_with(KILL, "  bitwise_equal_to_golden: true\n  matches_golden_within_noise: 3\n")
    events = _run_events("zzz")  # its losses are all 1.0
    g = golden({"digest": "xyz", "losses": B})
    results = judge(exp, compute_metrics(events, INJECTED), g, timed_out=False,
                    faults=INJECTED, events=events, losses={1: 2.0, 2: 1.5, 3: 1.2, 4: 1.0})
    slas = {s.name: s for s in results}
    bitwise = slas["bitwise_equal_to_golden"]
    # not measured is never passed: the noise verdict judges in its place
    assert not bitwise.passed and bitwise.measured is None
    assert (bitwise.result, bitwise.covered_by) == ("covered", "matches_golden_within_noise")
    assert bitwise.note.startswith("not measured: two fault-free runs differ from step 2")
    assert bitwise.note.endswith("judged by matches_golden_within_noise instead (pass)")
    assert ADD_NOISE_SLA not in bitwise.note  # it is there already
    noise = slas["matches_golden_within_noise"]
    assert noise.passed and noise.measured == 0.0 and noise.bound == 3.0
    assert verdict_of(results) == "pass"
    # the same run against a reproducible trainer's golden run: bitwise is judged and fails
    same = golden({"digest": "abc", "losses": A})
    slas = {s.name: s for s in judge(exp, compute_metrics(events, INJECTED), same,
                                      timed_out=False, faults=INJECTED, events=events)}
    assert slas["bitwise_equal_to_golden"].measured is False
    assert not slas["bitwise_equal_to_golden"].passed
    # losses from the run's own step records when none are given: 1.0 at step 1 is off by 1
    assert not slas["matches_golden_within_noise"].passed


def test_bitwise_alone_on_an_unreproducible_trainer_is_inconclusive_and_says_what_to_add(
        ) -> None:
    """Issue 53: "not measured" counted as passed, so bitwise alone passed whatever the resume
    did. It is inconclusive now: never a pass, never a fail; its note says what to add."""
    exp = exp_with(KILL, "  bitwise_equal_to_golden: true\n")
    events = _run_events("zzz")
    results = judge(exp, compute_metrics(events, INJECTED), golden({"digest": "xyz",
                                                                      "losses": B}),
                    timed_out=False, faults=INJECTED, events=events)
    bitwise = next(s for s in results if s.name == "bitwise_equal_to_golden")
    assert (bitwise.measured, bitwise.passed, bitwise.result) == (None, False, "inconclusive")
    assert bitwise.note.endswith(ADD_NOISE_SLA) and "golden: {runs: 2}" in ADD_NOISE_SLA
    assert verdict_of(results) == "inconclusive"
    # a failed SLA beside it still fails the run
    slow = exp_with(KILL, "  bitwise_equal_to_golden: true\n  goodput: 0.99\n")
    assert verdict_of(judge(slow, compute_metrics(events, INJECTED), golden(
        {"digest": "xyz", "losses": B}), timed_out=False, faults=INJECTED,
        events=events)) == "fail"
    # on a run that did not complete it fails, like every SLA (the run ended early)
    stopped = judge(exp, compute_metrics(events[:3], INJECTED), golden(
        {"digest": "xyz", "losses": B}), timed_out=True, faults=INJECTED, events=events[:3])
    assert next(s for s in stopped if s.name == "bitwise_equal_to_golden").result == "fail"


def test_a_nan_loss_fails_at_its_first_step_and_a_nan_reference_is_inconclusive() -> None:
    """Issue 53: |nan - a| is NaN, and ``units > worst`` is False for NaN: the run passed at
    "0.00 times the noise" (end to end: the nondeterministic rank_kill plus a grad_nan after
    its restart printed loss nan at steps 13 to 16 and passed)."""
    g = golden({"digest": "xyz", "losses": B})
    nan = float("nan")
    run = within_noise(g, {1: 2.0, 2: 1.5, 3: nan, 4: nan, 5: 0.9}, None, 10)
    assert (run.measured, run.passed, run.inconclusive) == (math.inf, False, False)
    assert run.note.startswith("this run's loss is nan at step 3, where both fault-free runs "
                               "stayed finite")
    inf = within_noise(g, {1: 2.0, 2: 1.5, 3: 1.2, 4: math.inf}, None, 10)
    assert not inf.passed and "loss is inf at step 4" in inf.note
    # a NaN in either fault-free run: no noise to measure, and no verdict either way
    for second in ({**B, 4: nan}, B):
        ref = GoldenRun(key="k", digest="abc", losses={**A, 2: nan} if second is B else A,
                        wall_s=1.0, run_dir="/golden", cached=True,
                        second={"digest": "xyz", "losses": second})
        out = within_noise(ref, A, None, 10)
        assert (out.measured, out.passed, out.inconclusive) == (None, False, True)
        assert "golden run's loss is nan at step" in out.note
        assert "the fault-free reference diverged itself" in out.note
    # the golden runs' NaN wins over the run's: the run's NaN is then no finding of the fault
    both = GoldenRun(key="k", digest="abc", losses={**A, 5: nan}, wall_s=1.0, run_dir="",
                     cached=True, second={"losses": B})
    assert within_noise(both, {**A, 5: nan}, None, 10).inconclusive


def test_final_weights_that_lack_a_tensor_or_hold_a_nan_fail_and_are_named(
        tmp_path: Path) -> None:
    """Issue 53: a NaN weight distance was dropped (``max(worst, w_units or 0.0)``) and a tensor
    missing from the run's final checkpoint skipped."""
    import torch

    def save(name: str, **model: Any) -> str:
        torch.save({"model": model}, tmp_path / name)
        return str(tmp_path / name)

    w = torch.arange(1.0, 7.0).reshape(2, 3)
    a, b = save("a.pt", w=w, b=torch.ones(3)), save("b.pt", w=w * 1.001, b=torch.ones(3))
    g = GoldenRun(key="k", digest="abc", losses=A, wall_s=1.0, run_dir="", cached=True,
                  final_checkpoint=a, second={"losses": B, "final_checkpoint": b})
    close = within_noise(g, A, save("ok.pt", w=w * 1.0005, b=torch.ones(3)), 10)
    assert close.passed and 0 < close.measured < 1 and "final weights 0.50 times" in close.note
    lacking = within_noise(g, A, save("lacks.pt", w=w), 10)
    assert (lacking.measured, lacking.passed) == (math.inf, False)
    assert "this run's final checkpoint lacks tensor model.b, which the golden run's final " \
           "checkpoint holds" in lacking.note
    nan = within_noise(g, A, save("nan.pt", w=w * float("nan"), b=torch.ones(3)), 10)
    assert not nan.passed and "this run's final checkpoint holds NaN in tensor model.w" in \
        nan.note
    gone = within_noise(g, A, str(tmp_path / "never-saved.pt"), 10)
    assert not gone.passed and "cannot be compared, where the golden runs' could" in gone.note
    # the golden runs' own weights that cannot be compared: inconclusive, unless the losses
    # failed already
    broken = GoldenRun(key="k", digest="abc", losses=A, wall_s=1.0, run_dir="", cached=True,
                       final_checkpoint=a, second={"losses": B, "final_checkpoint": str(
                           tmp_path / "gone.pt")})
    out = within_noise(broken, A, a, 10)
    assert (out.measured, out.inconclusive) == (None, True)
    assert out.note.startswith("not measured: within 0.00 times the noise at every step; "
                               "final weights not measured: their spread between the golden "
                               "runs is unknown")
    off = within_noise(broken, {**A, 5: 2.0}, a, 10)
    assert not off.passed and not off.inconclusive and "left the noise envelope at step 5" in \
        off.note


def test_no_shared_step_or_no_second_run_is_inconclusive_on_a_finished_run() -> None:
    exp = exp_with(KILL, "  matches_golden_within_noise: 3\n")
    events = _run_events("zzz")
    results = judge(exp, compute_metrics(events, INJECTED), golden({"losses": B}),
                    timed_out=False, faults=INJECTED, events=events, losses={9: 1.0})
    noise = next(s for s in results if s.name == "matches_golden_within_noise")
    assert (noise.measured, noise.result) == (None, "inconclusive")
    assert "share no step" in noise.note and "observe.log_pattern" in noise.note
    assert verdict_of(results) == "inconclusive"


def test_the_key_takes_true_for_the_default_k_and_asks_for_two_runs() -> None:
    exp = exp_with(KILL, "  matches_golden_within_noise: true\n")
    assert exp.expect.matches_golden_within_noise == 10.0 and exp.golden_runs == 2
    assert exp_with(KILL, "  bitwise_equal_to_golden: true\n").golden_runs == 1
    assert exp_with(KILL, "  completes: true\n").golden_runs == 0  # no golden run at all
    with pytest.raises(InvalidExperimentError, match="matches_golden_within_noise"):
        exp_with(KILL, "  matches_golden_within_noise: false\n")
    with pytest.raises(InvalidExperimentError, match="golden.runs"):
        parse_experiment(BASE + "golden: {runs: 3}\n")


def test_a_golden_run_is_of_one_target() -> None:
    local = parse_experiment(BASE)
    docker = parse_experiment(BASE.replace("procs_per_node: 1}",
                                           "procs_per_node: 1, launcher: docker}"))
    assert golden_key(local) != golden_key(docker)


def test_validate_refuses_the_noise_verdict_without_the_losses_it_reads(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    doc = {"name": "nolog", "target": {"command": ["python", str(tmp_path / "train.py")]},
           "expect": {"matches_golden_within_noise": 5}}
    with pytest.raises(InvalidExperimentError, match="set observe.log_pattern"):
        experiment_from_dict(doc)
    doc["observe"] = {"log_pattern": r"step (?P<step>\d+) loss (?P<loss>\S+)"}
    assert experiment_from_dict(doc).golden_runs == 2


def test_a_teams_batch_script_is_part_of_its_golden_runs_key(tmp_path: Path,
                                                              monkeypatch: Any) -> None:
    monkeypatch.setenv("FAULTLAB_SLURM_SHARED", str(tmp_path))
    monkeypatch.setattr("faultlab.targets.slurm.SlurmTarget.reference_site",
                        classmethod(lambda cls, exp: {"cluster": "test"}))
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\nsrun python train.py\n")
    exp = experiment_from_dict({"name": "s", "topology": {
        "nodes": 2, "launcher": "slurm", "slurm": {"script": str(script)}}})
    before = golden_key(exp)
    script.write_text("#!/bin/bash\nsrun python train.py --lr 0.1\n")
    assert golden_key(exp) != before
