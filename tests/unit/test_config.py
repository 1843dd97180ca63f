"""reference_trainer.config: validation, presets, and the argv the launcher forwards."""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_trainer.config import PRESETS, ConfigError, ModelConfig, TrainConfig, train_argv
from reference_trainer.data import MarkovTokens
from reference_trainer.model import GPT
from reference_trainer.train import parse_config

NAN = float("nan")

# (field overrides, the flag the error must name, the offending value).
BAD_FIELDS: list[tuple[dict[str, Any], str, Any]] = [
    ({"preset": "huge"}, "--preset", "huge"),
    ({"steps": 0}, "--steps", 0),
    ({"steps": -5}, "--steps", -5),
    ({"stop_after": 0}, "--stop-after", 0),
    ({"steps": 10, "stop_after": 50}, "--stop-after", 50),
    ({"global_batch": 0}, "--global-batch", 0),
    ({"lr": 0.0}, "--lr", 0.0),
    ({"lr": -0.001}, "--lr", -0.001),
    ({"lr": NAN}, "--lr", NAN),
    ({"min_lr_ratio": -0.25}, "--min-lr-ratio", -0.25),
    ({"min_lr_ratio": 1.5}, "--min-lr-ratio", 1.5),
    ({"min_lr_ratio": NAN}, "--min-lr-ratio", NAN),
    ({"warmup_steps": -1}, "--warmup-steps", -1),
    ({"weight_decay": -0.125}, "--weight-decay", -0.125),
    ({"grad_clip": -1.0}, "--grad-clip", -1.0),
    ({"checkpoint_every": 0}, "--checkpoint-every", 0),
    ({"keep_checkpoints": 0}, "--keep-checkpoints", 0),
    ({"on_no_valid_checkpoint": "guess"}, "--on-no-valid-checkpoint", "guess"),
    ({"nonfinite_policy": "ignore"}, "--nonfinite-policy", "ignore"),
    ({"max_rollbacks": -1}, "--max-rollbacks", -1),
    ({"watchdog_s": 0.0}, "--watchdog-s", 0.0),
    ({"watchdog_s": -3.0}, "--watchdog-s", -3.0),
    ({"pg_timeout_s": 0.0}, "--pg-timeout-s", 0.0),
    ({"device": "tpu"}, "--device", "tpu"),
    ({"min_step_time_s": -0.5}, "--min-step-time-s", -0.5),
    ({"inject_nonfinite": ((0, None),)}, "--inject-nonfinite", 0),
    ({"steps": 20, "inject_nonfinite": ((5, 0), (21, 1))}, "--inject-nonfinite", 21),
]


def _case_id(case: tuple[dict[str, Any], str, Any]) -> str:
    return f"{case[1]}={case[2]!r}"


@pytest.mark.parametrize("overrides,flag,value", BAD_FIELDS, ids=map(_case_id, BAD_FIELDS))
def test_invalid_field_raises_config_error_naming_flag_and_value(
        overrides: dict[str, Any], flag: str, value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        TrainConfig(run_dir=Path("run"), **overrides)
    err = info.value
    assert err.flag == flag
    assert str(err).startswith(f"{flag}: ")
    assert repr(value) in str(err)
    assert isinstance(err, ValueError)  # callers that only know ValueError still catch it


@pytest.mark.parametrize("overrides,flag,value", BAD_FIELDS, ids=map(_case_id, BAD_FIELDS))
def test_invalid_flag_on_the_command_line_is_one_usage_line(
        overrides: dict[str, Any], flag: str, value: Any,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The flag named by the ConfigError is the one that sets the field (same table)."""
    argv = ["--run-dir", "run"]
    for name, v in overrides.items():
        cli = "--" + name.replace("_", "-")
        if name == "inject_nonfinite":
            for step, rank in v:
                argv += [cli, f"{step}" if rank is None else f"{step}:{rank}"]
        else:
            argv += [cli, str(v)]
    with pytest.raises(SystemExit) as info:
        parse_config(argv)
    assert info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert f"argument {flag}: " in lines[0]
    assert repr(value) in lines[0]


def test_defaults_are_valid_and_run_dir_becomes_a_path() -> None:
    cfg = TrainConfig(run_dir="some/where")  # type: ignore[arg-type]
    assert cfg.run_dir == Path("some/where")
    assert cfg.model is PRESETS["tiny"]
    assert cfg.stop_after is None


def test_edge_values_that_are_allowed() -> None:
    cfg = TrainConfig(run_dir=Path("r"), steps=1, stop_after=1, global_batch=1,
                      min_lr_ratio=0.0, warmup_steps=0, weight_decay=0.0, grad_clip=0.0,
                      max_rollbacks=0, inject_nonfinite=((1, None), (1, 0)))
    assert cfg.stop_after == cfg.steps == 1
    TrainConfig(run_dir=Path("r"), min_lr_ratio=1.0, stop_after=100)


# --- values that pass validation but that the trainer cannot use ------------------------------
# Every ConfigError-free config is forwarded to every rank; a value the trainer then chokes on
# becomes a crash loop under torchrun (exit 1, restart, exit 1, ...) instead of a usage error.


@pytest.mark.parametrize("field,flag", [("weight_decay", "--weight-decay"),
                                        ("grad_clip", "--grad-clip")])
def test_nan_is_rejected(field: str, flag: str) -> None:
    # NaN < 0 is False, so `_at_least` lets NaN through: a NaN weight decay turns every weight
    # into NaN at the first optimizer step, a NaN clip silently disables clipping
    # (`max_norm > 0` is False).
    with pytest.raises(ConfigError) as info:
        TrainConfig(run_dir=Path("r"), **{field: NAN})
    assert info.value.flag == flag


def test_accepted_seed_builds_the_data_source() -> None:
    # The trainer builds MarkovTokens(seed=cfg.seed); numpy refuses negative seeds.
    try:
        cfg = TrainConfig(run_dir=Path("r"), seed=-1)
    except ConfigError as e:
        assert e.flag == "--seed"
        return
    MarkovTokens(vocab_size=8, seq_len=4, seed=cfg.seed)


def test_accepted_pg_timeout_is_a_usable_timedelta() -> None:
    # The trainer calls init_process_group(timeout=timedelta(seconds=cfg.pg_timeout_s)).
    try:
        cfg = TrainConfig(run_dir=Path("r"), pg_timeout_s=math.inf)
    except ConfigError as e:
        assert e.flag == "--pg-timeout-s"
        return
    timedelta(seconds=cfg.pg_timeout_s)


# --- model configs and presets ---------------------------------------------------------------


def _count(cfg: ModelConfig) -> int:
    return sum(p.numel() for p in GPT(cfg).parameters())


@pytest.mark.parametrize("name,low,high", [("tiny", 0.4e6, 1e6), ("small", 20e6, 50e6)])
def test_preset_parameter_count_matches_the_built_model(name: str, low: float,
                                                         high: float) -> None:
    cfg = PRESETS[name]
    real = _count(cfg)
    assert cfg.num_params() == real
    assert low <= real <= high


def test_big_presets_are_in_their_documented_range() -> None:
    # Too big to build in a unit test; the formula is checked against real models below.
    assert 0.3e9 <= PRESETS["medium"].num_params() <= 0.5e9
    assert 1.2e9 <= PRESETS["large"].num_params() <= 1.6e9


@settings(max_examples=25, deadline=None)
@given(vocab=st.integers(1, 64), seq=st.integers(1, 16), heads=st.integers(1, 4),
       head_dim=st.integers(1, 8), layers=st.integers(1, 3))
def test_num_params_formula_matches_any_model(vocab: int, seq: int, heads: int, head_dim: int,
                                              layers: int) -> None:
    cfg = ModelConfig(vocab_size=vocab, seq_len=seq, d_model=heads * head_dim,
                      num_layers=layers, num_heads=heads)
    assert cfg.num_params() == _count(cfg)


@pytest.mark.parametrize("kwargs,needle", [
    ({"vocab_size": 0}, "vocab_size"),
    ({"seq_len": 0}, "seq_len"),
    ({"d_model": 0}, "d_model"),
    ({"num_layers": 0}, "num_layers"),
    ({"num_heads": 0}, "num_heads"),
    ({"num_heads": 3}, "num_heads=3"),
    ({"dropout": 1.0}, "dropout"),
    ({"dropout": -0.1}, "dropout"),
])
def test_model_config_validation(kwargs: dict[str, Any], needle: str) -> None:
    base = {"vocab_size": 32, "seq_len": 8, "d_model": 16, "num_layers": 2, "num_heads": 2}
    with pytest.raises(ValueError, match=needle):
        ModelConfig(**{**base, **kwargs})


def test_model_forward_returns_summed_token_loss() -> None:
    import torch

    cfg = ModelConfig(vocab_size=32, seq_len=8, d_model=16, num_layers=1, num_heads=2)
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    x = torch.randint(0, 32, (3, 8))
    y = torch.randint(0, 32, (3, 8))
    with torch.no_grad():
        total = model(x, y)
        # Summing per-sample sums gives the same value: the reduction is a sum, not a mean.
        parts = sum(model(x[i:i + 1], y[i:i + 1]) for i in range(3))
    assert total.shape == ()
    assert torch.allclose(total, parts, rtol=1e-5)
    # At init the logits are close to uniform: the mean token loss is about log(vocab).
    assert abs(float(total) / (3 * 8) - math.log(32)) < 0.5


# --- argv round trip -------------------------------------------------------------------------


@st.composite
def train_configs(draw: st.DrawFn) -> TrainConfig:
    steps = draw(st.integers(1, 10**6))
    pos = st.floats(min_value=1e-9, max_value=1e6, allow_nan=False, allow_infinity=False)
    nonneg = st.floats(min_value=0.0, max_value=1e3, allow_nan=False, allow_infinity=False)
    injections = st.lists(st.tuples(st.integers(1, steps),
                                    st.one_of(st.none(), st.integers(0, 63))), max_size=3)
    return TrainConfig(
        run_dir=Path(draw(st.sampled_from(["run", "runs/a b", "/tmp/x-1"]))),
        preset=draw(st.sampled_from(sorted(PRESETS))),
        steps=steps,
        stop_after=draw(st.one_of(st.none(), st.integers(1, steps))),
        global_batch=draw(st.integers(1, 4096)),
        lr=draw(pos),
        min_lr_ratio=draw(st.floats(0.0, 1.0)),
        warmup_steps=draw(st.integers(0, 1000)),
        weight_decay=draw(nonneg),
        grad_clip=draw(nonneg),
        seed=draw(st.integers(0, 2**32 - 1)),
        checkpoint_every=draw(st.integers(1, 1000)),
        keep_checkpoints=draw(st.integers(1, 10)),
        async_checkpoint=draw(st.booleans()),
        on_no_valid_checkpoint=draw(st.sampled_from(["fail", "scratch"])),
        nonfinite_policy=draw(st.sampled_from(["rollback", "skip", "abort"])),
        max_rollbacks=draw(st.integers(0, 10)),
        watchdog_s=draw(pos),
        pg_timeout_s=draw(pos),
        deterministic=draw(st.booleans()),
        device=draw(st.sampled_from(["auto", "cpu", "cuda"])),
        min_step_time_s=draw(nonneg),
        inject_nonfinite=tuple(draw(injections)),
    )


@settings(max_examples=100, deadline=None)
@given(cfg=train_configs())
def test_train_argv_round_trips_through_parse_config(cfg: TrainConfig) -> None:
    argv = train_argv(cfg)
    assert argv[:2] == ["--run-dir", str(cfg.run_dir)]
    assert parse_config(argv) == cfg
    assert parse_config(argv).to_json() == cfg.to_json()


def test_train_argv_of_the_defaults_is_only_the_run_dir() -> None:
    assert train_argv(TrainConfig(run_dir=Path("r"))) == ["--run-dir", "r"]


def test_train_argv_spells_booleans_and_injections_as_the_parser_reads_them() -> None:
    cfg = TrainConfig(run_dir=Path("r"), deterministic=False, async_checkpoint=True,
                      inject_nonfinite=((3, None), (4, 1)))
    argv = train_argv(cfg)
    assert argv[argv.index("--deterministic") + 1] == "false"
    assert argv[argv.index("--async-checkpoint") + 1] == "true"
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--inject-nonfinite"] == ["3", "4:1"]
    assert parse_config(argv) == cfg


def test_to_json_is_plain_json() -> None:
    import json

    cfg = TrainConfig(run_dir=Path("r"), stop_after=7, inject_nonfinite=((2, 0),))
    out = json.loads(json.dumps(cfg.to_json()))
    assert out["run_dir"] == "r"
    assert out["inject_nonfinite"] == [[2, 0]]
    assert out["stop_after"] == 7
    assert set(out) == set(TrainConfig.__dataclass_fields__)
