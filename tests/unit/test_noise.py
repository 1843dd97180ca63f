"""Reproducibility and the noise verdict (faultlab.judge.noise), judged from two fault-free runs.

The end-to-end proof is tests/examples' ``nondeterministic`` pair: a correct resume of a
trainer with noise in every update passes ``matches_golden_within_noise`` and a resume that
forgets its LR schedule fails it, named by step. These tests pin the logic: the envelope, the
step named, what "not measured" means, and the spec's key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from faultlab.engine.golden import GoldenRun, golden_key
from faultlab.errors import InvalidExperimentError
from faultlab.judge import judge
from faultlab.judge.noise import CAUSES, reproducibility, resolution, run_losses, within_noise
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


def test_judge_never_fails_bitwise_on_an_unreproducible_trainer_and_judges_the_noise() -> None:
    exp = exp_with(KILL, "  completes: true\n  bitwise_equal_to_golden: true\n"
                         "  matches_golden_within_noise: 3\n")
    events = _run_events("zzz")  # its losses are all 1.0
    g = golden({"digest": "xyz", "losses": B})
    slas = {s.name: s for s in judge(exp, compute_metrics(events, INJECTED), g,
                                      timed_out=False, faults=INJECTED, events=events,
                                      losses={1: 2.0, 2: 1.5, 3: 1.2, 4: 1.0})}
    bitwise = slas["bitwise_equal_to_golden"]
    assert bitwise.passed and bitwise.measured is None
    assert bitwise.note.startswith("not measured: two fault-free runs differ from step 2")
    noise = slas["matches_golden_within_noise"]
    assert noise.passed and noise.measured == 0.0 and noise.bound == 3.0
    # the same run against a reproducible trainer's golden run: bitwise is judged and fails
    same = golden({"digest": "abc", "losses": A})
    slas = {s.name: s for s in judge(exp, compute_metrics(events, INJECTED), same,
                                      timed_out=False, faults=INJECTED, events=events)}
    assert slas["bitwise_equal_to_golden"].measured is False
    assert not slas["bitwise_equal_to_golden"].passed
    # losses from the run's own step records when none are given: 1.0 at step 1 is off by 1
    assert not slas["matches_golden_within_noise"].passed


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
