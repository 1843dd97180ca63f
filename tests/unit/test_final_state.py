"""Reading a job's final checkpoint back without a process group (faultlab.observe.final_state)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from faultlab.observe.final_state import (
    NO_FINAL_CHECKPOINT,
    WeightsGap,
    final_checkpoint_state,
    first_difference,
    weights_distance,
    weights_gap,
)


def _state(seed: int = 0) -> dict[str, object]:
    g = torch.Generator().manual_seed(seed)
    return {"model": {"w": torch.randn(4, 3, generator=g), "b": torch.zeros(3)},
            "optim": {"state": {"0": {"step": torch.tensor(7.0)}},
                      "param_groups": [{"lr": 0.1, "params": ["w", "b"]}]}}


def _events(path: Path, step: int, last_step: int) -> list[dict[str, object]]:
    steps = range(1, last_step + 1)
    return [*({"t": float(s), "kind": "step", "step": s, "rank": 0} for s in steps),
            {"t": 100.0, "kind": "checkpoint_saved", "step": step, "path": str(path), "rank": 0}]


def test_a_dcp_directory_and_a_torch_save_file_hash_alike(tmp_path: Path) -> None:
    with warnings.catch_warnings():  # without a process group DCP warns it saves alone
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(_state(), checkpoint_id=str(tmp_path / "dcp"))
    torch.save(_state(), tmp_path / "final.pt")
    a = final_checkpoint_state(_events(tmp_path / "dcp", 10, 10))
    b = final_checkpoint_state(_events(tmp_path / "final.pt", 10, 10))
    assert a.digest is not None and a.not_measured is None and a.step == 10
    assert "model.w" in a.tensors and "optim.param_groups.0.lr" in a.tensors
    assert a.tensors["model.w"] == b.tensors["model.w"]


def test_the_first_differing_tensor_is_named(tmp_path: Path) -> None:
    torch.save(_state(0), tmp_path / "a.pt")
    other = _state(0)
    other["model"]["b"] = torch.ones(3)  # type: ignore[index]
    torch.save(other, tmp_path / "b.pt")
    a = final_checkpoint_state(_events(tmp_path / "a.pt", 5, 5))
    b = final_checkpoint_state(_events(tmp_path / "b.pt", 5, 5))
    assert a.digest != b.digest
    assert first_difference(a.tensors, b.tensors) == "model.b"
    assert first_difference(a.tensors, dict(a.tensors)) is None


def test_no_final_checkpoint_is_not_measured_with_the_reason(tmp_path: Path) -> None:
    torch.save(_state(), tmp_path / "mid.pt")
    early = final_checkpoint_state(_events(tmp_path / "mid.pt", 5, 9))
    assert early.digest is None and early.not_measured is not None
    assert early.not_measured.startswith(NO_FINAL_CHECKPOINT)
    assert "step 5" in early.not_measured and "last step 9" in early.not_measured
    none = final_checkpoint_state([{"t": 1.0, "kind": "step", "step": 1}])
    assert none.not_measured == NO_FINAL_CHECKPOINT


def test_a_damaged_checkpoint_is_an_answer_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    state = final_checkpoint_state(_events(tmp_path / "bad.pt", 3, 3))
    assert state.digest is None and "cannot read it" in (state.not_measured or "")


def test_a_committed_dcp_checkpoint_missing_a_shard_is_an_answer_not_a_crash(
        tmp_path: Path) -> None:
    """examples/fsdp2_dcp split by a stale NFS listing committed step_20 without rank 1's
    shard: DCP's reader raised CheckpointException (a BaseException), which crashed the
    engine's judge."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(_state(), checkpoint_id=str(tmp_path / "step_20"))
    for shard in (tmp_path / "step_20").glob("*.distcp"):
        shard.unlink()
    state = final_checkpoint_state(_events(tmp_path / "step_20", 20, 20))
    assert state.digest is None
    assert "cannot read the DCP checkpoint: CheckpointException" in (state.not_measured or "")
    assert "No such file or directory" in (state.not_measured or "")


def test_paths_under_the_run_directory_compare_relative_to_it(tmp_path: Path) -> None:
    """Lightning keeps ModelCheckpoint's dirpath and last_model_path in every checkpoint: two
    runs in two run directories must still compare by what they trained."""
    states = {}
    for name in ("golden", "faulted"):
        run_dir = tmp_path / name
        run_dir.mkdir()
        state = _state()
        state["callbacks"] = {"dirpath": f"{run_dir}/ckpt", f"{run_dir}/ckpt/a.ckpt": 1.0,
                              "elsewhere": f"{tmp_path}/{name}-data"}
        torch.save(state, run_dir / "last.ckpt")
        states[name] = final_checkpoint_state(_events(run_dir / "last.ckpt", 5, 5), run_dir)
    golden, faulted = states["golden"], states["faulted"]
    assert golden.tensors["callbacks.dirpath"] == faulted.tensors["callbacks.dirpath"]
    assert "callbacks.{run_dir}/ckpt/a.ckpt" in golden.tensors
    assert first_difference(faulted.tensors, golden.tensors) == "callbacks.elsewhere"


def test_weights_gap_names_a_missing_tensor_another_shape_and_a_nan(tmp_path: Path) -> None:
    """Issue 53: a tensor missing from the run's final checkpoint was skipped, and one of
    another shape or holding NaN dropped the distance; each is a named problem now."""
    ref = tmp_path / "ref.pt"
    torch.save(_state(0), ref)

    def gap(edit: Any) -> WeightsGap:
        state = _state(0)
        edit(state["model"])
        torch.save(state, tmp_path / "ours.pt")
        return weights_gap(str(tmp_path / "ours.pt"), str(ref), ref="the golden run's")

    same = gap(lambda m: None)
    assert (same.distance, same.problem, same.not_measured) == (0.0, "", "")
    near = gap(lambda m: m.update(w=m["w"] * 1.01))
    w = float(_state(0)["model"]["w"].norm())  # type: ignore[index]
    # every floating-point tensor of the reference: w, b (zeros) and the optimizer's step 7.0
    assert near.distance == pytest.approx(0.01 * w / (w ** 2 + 7.0 ** 2) ** 0.5, rel=1e-6)
    assert gap(lambda m: m.pop("b")).problem == \
        "lacks tensor model.b, which the golden run's holds"
    assert gap(lambda m: m.update(b=torch.zeros(4))).problem == \
        "holds tensor model.b in shape (4,), the golden run's in (3,)"
    assert gap(lambda m: m["w"].__setitem__((0, 0), float("nan"))).problem == \
        "holds NaN in tensor model.w"
    assert gap(lambda m: m["b"].__setitem__(1, float("inf"))).problem == \
        "holds Inf in tensor model.b"
    # the reference's own NaN, or a checkpoint that cannot be read: no distance, no problem
    torch.save({"model": {"w": torch.full((2,), float("nan"))}}, tmp_path / "nan.pt")
    assert weights_gap(str(ref), str(tmp_path / "nan.pt")).not_measured == \
        "the reference holds NaN or Inf in tensor model.w"
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    unreadable = weights_gap(str(tmp_path / "bad.pt"), str(ref))
    assert unreadable.distance is None and unreadable.problem == ""
    assert unreadable.not_measured.startswith("the final checkpoint (")
    assert weights_gap(None, str(ref)).not_measured == "there is no final checkpoint"
    assert weights_distance(str(tmp_path / "ours.pt"), str(ref)) is None  # the Inf above
