"""Whatever mapping a user writes, validation either succeeds or says where the problem is.

The generated documents mix the schema's real keys (so validation goes deep: faults, their
triggers and params) with arbitrary text keys, and arbitrary values at every level. Each is
checked as Python data and again as YAML text through the text loader.
"""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from faultlab.errors import InvalidExperimentError
from faultlab.faults import fault_types
from faultlab.spec import (
    AfterEvent,
    Every,
    Expect,
    Experiment,
    FaultSpec,
    RunSpec,
    Selector,
    Suite,
    TargetSpec,
    Topology,
    Trigger,
    experiment_from_dict,
    parse_document,
)

SCHEMA_KEYS = sorted(
    {k for m in (Experiment, Suite, TargetSpec, Topology, RunSpec, FaultSpec, Trigger,
                 AfterEvent, Every, Expect) for k in m.model_fields}
    | set(Selector.valid_keys())
    | {k for f in fault_types().values() for k in f.Params.model_fields}
    | {"global_batch", "lr", "async_checkpoint", "inject_nonfinite", "steps"})
SCHEMA_WORDS = ["random", "all", "reaction", "reference", "tiny", "gloo", "KILL", "step",
                "checkpoint_saved", *fault_types()]

# Mostly text keys; YAML also allows a few others (`1:`, `null:`), so do they.
keys = st.one_of(st.sampled_from(SCHEMA_KEYS), st.text(max_size=12),
                 st.integers(-2, 3), st.none(), st.booleans())
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
    st.sampled_from(SCHEMA_WORDS), st.integers(min_value=0, max_value=50))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(keys, inner, max_size=5)),
    max_leaves=25)
documents = st.dictionaries(keys, values, max_size=8)

# Nearly valid documents: real structure, with any part replaced by anything.
faults = st.fixed_dictionaries(
    {"type": st.one_of(st.sampled_from(sorted(fault_types())), values)},
    optional={
        "target": st.one_of(st.sampled_from(["random", "all"]),
                            st.fixed_dictionaries({"rank": st.integers(-1, 5)}),
                            st.fixed_dictionaries({"node": st.integers(-1, 3)}), values),
        "trigger": st.one_of(st.fixed_dictionaries({"at_step": st.integers(-1, 50)}),
                             st.fixed_dictionaries({"every": st.fixed_dictionaries(
                                 {"mtbf_s": st.floats(-1, 100)})}),
                             st.dictionaries(keys, values, max_size=2)),
        "params": st.one_of(st.dictionaries(st.sampled_from(["signal", "x"]), values),
                            values),
        "duration_s": values, "until": st.one_of(st.just("reaction"), values),
        "id": values,
    })
shaped = st.fixed_dictionaries(
    {"name": st.one_of(st.just("exp"), values)},
    optional={"seed": values,
              "topology": st.one_of(st.fixed_dictionaries(
                  {"nodes": st.integers(0, 3), "procs_per_node": st.integers(0, 3)}), values),
              "run": st.one_of(st.fixed_dictionaries({"steps": st.integers(0, 60)}), values),
              "target": st.one_of(st.dictionaries(st.sampled_from(
                  ["trainer", "preset", "overrides", "command"]), values), values),
              "faults": st.one_of(st.lists(faults, max_size=3), values),
              "expect": st.one_of(st.dictionaries(st.sampled_from(list(Expect.model_fields)),
                                                  scalars), values),
              })

FAST = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def check_dict(data: dict[Any, Any]) -> None:
    try:
        experiment_from_dict(data)
    except InvalidExperimentError as e:
        assert e.problems
        for p in e.problems:
            assert p.path or p.line is not None, p
            assert p.message and "\n" not in p.message, p


def check_text(data: dict[Any, Any]) -> None:
    text = yaml.safe_dump(data, sort_keys=False)
    try:
        parse_document(text, "generated.yaml")
    except InvalidExperimentError as e:
        assert e.problems
        for p in e.problems:
            assert p.line is not None, p  # from text, every problem has a line
            assert str(p).startswith("generated.yaml:")


@FAST
@given(documents)
def test_any_mapping_validates_or_says_where(data: dict[Any, Any]) -> None:
    check_dict(data)
    check_text(data)


@FAST
@given(shaped)
def test_any_nearly_valid_document_validates_or_says_where(data: dict[Any, Any]) -> None:
    check_dict(data)
    check_text(data)
