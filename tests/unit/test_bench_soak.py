"""The soak (``benchmarks/bench_soak.py``) covers every experiment CI runs and judges each
against the outcome CI asserts: an experiment left out, or an expectation that drifted from the
tests', would make its table claim a stability nobody measured."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _bench_soak():
    spec = importlib.util.spec_from_file_location("_bench_soak_under_test",
                                                  REPO / "benchmarks" / "bench_soak.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_soak_runs_every_shipped_experiment_file() -> None:
    soak = _bench_soak()
    soaked = {p.resolve() for p in soak.shipped_experiments()}
    shipped = {p.resolve() for p in (REPO / "experiments").glob("*.yaml")
               if p.name != "prelaunch.yaml"}  # a suite of experiments soaked one by one
    shipped |= {p.resolve() for p in (REPO / "examples").glob("*/experiments/*.yaml")}
    assert shipped - soaked == set(), "experiments CI runs that the soak leaves out"
    assert soaked - shipped == set(), "soaked files that are not shipped experiments"


def test_the_soak_expects_what_ci_asserts() -> None:
    soak = _bench_soak()
    expected = soak.expectations()
    examples = {f"examples/{p.parent.parent.name}/experiments/{p.name}"
                for p in (REPO / "examples").glob("*/experiments/*.yaml")}
    assert examples <= set(expected)
    assert expected["examples/fsdp2_dcp/experiments/rank_kill.yaml"] == ("pass", ())
    assert expected["examples/fsdp2_dcp/experiments/campaign.yaml"] == ("fail",
                                                                        ("detection_rate",))
    # the one experiments/*.yaml that CI runs expecting a failure
    verdict, failing = expected["experiments/rank_hang_default_timeouts.yaml"]
    assert verdict == "fail" and "completes" in failing
    assert {k for k, (v, _) in expected.items() if v == "fail"
            and k.startswith("experiments/")} == {"experiments/rank_hang_default_timeouts.yaml"}
