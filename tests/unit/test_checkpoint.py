"""reference_trainer.checkpoint: real DCP checkpoints of a tiny FSDP2 model on one CPU rank.

A checkpoint is saved through ``CheckpointManager`` (the trainer's own commit path) and then
damaged by hand: every damage must be found by ``verify_checkpoint`` and make ``load_latest``
fall back, quarantine, or refuse, as the module documents.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from fsdp_helpers import Recorder, build_fsdp, full_params, train_step
from torch.distributed.device_mesh import DeviceMesh

from faultlab.runtime.manifest import MANIFEST
from reference_trainer.checkpoint import (
    CheckpointError,
    CheckpointManager,
    capture_rng,
    list_checkpoints,
    read_manifest,
    restore_rng,
    seed_rank_rng,
    verify_checkpoint,
)
from reference_trainer.config import TrainConfig
from reference_trainer.digest import state_digest
from reference_trainer.plugin import preflight

#: The documented layout of a checkpoint written by one rank.
FILES = {"__0_0.distcp", ".metadata", "trainer_state.json", "rng/rank0.json", MANIFEST}
DATA_FILES = sorted(FILES - {MANIFEST})


def trainer_state(step: int) -> dict[str, Any]:
    return {"step": step, "sampler": {"consumed": 12 * step, "global_batch": 12},
            "config": {"seed": 0, "preset": "tiny"}, "note": "written by the unit tests"}


def manager(root: Path, rec: Recorder, *, keep: int = 3,
            async_save: bool = False) -> CheckpointManager:
    return CheckpointManager(root, keep=keep, async_save=async_save, rank=0, world_size=1,
                             process_group=dist.group.WORLD, emit=rec.emit, beat=rec.beat)


def files_of(ckpt_dir: Path) -> set[str]:
    return {str(p.relative_to(ckpt_dir)) for p in ckpt_dir.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def template(mesh: DeviceMesh, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One committed checkpoint of step 10, saved once; tests damage copies of it."""
    root = tmp_path_factory.mktemp("template") / "checkpoints"
    model, optimizer = build_fsdp(mesh)
    train_step(model, optimizer, seed=1)
    manager(root, Recorder()).save(10, model, optimizer, trainer_state(10))
    return root / "step_00000010"


@pytest.fixture
def ckpt(template: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "checkpoints" / template.name
    shutil.copytree(template, dest)
    assert verify_checkpoint(dest) is None
    return dest


def flip_bit(path: Path, offset: int, bit: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))


def positions(size: int, count: int = 24) -> list[int]:
    """The first and last byte and ``count`` offsets spread over the file."""
    return sorted({0, size - 1, *np.linspace(0, size - 1, count).astype(int).tolist()})


# --- saving ----------------------------------------------------------------------------------


def test_save_commits_the_documented_layout(fsdp: Any, tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"  # not created beforehand: save makes it
    model, optimizer = fsdp()
    train_step(model, optimizer, seed=1)
    rec = Recorder()
    rng_at_save = json.loads(json.dumps(capture_rng()))
    manager(root, rec).save(10, model, optimizer, trainer_state(10))

    final = root / "step_00000010"
    assert files_of(final) == FILES
    assert verify_checkpoint(final) is None
    assert (root / "latest").read_text().strip() == final.name
    assert not list(root.glob(".tmp-*")), "the temporary directory was renamed, not copied"
    assert json.loads((final / "trainer_state.json").read_text()) == trainer_state(10)
    assert json.loads((final / "rng" / "rank0.json").read_text()) == rng_at_save

    manifest = read_manifest(final)
    assert manifest["step"] == 10 and manifest["world_size"] == 1
    assert set(manifest["files"]) == set(DATA_FILES)
    for name, entry in manifest["files"].items():
        assert entry["size"] == (final / name).stat().st_size

    [saved] = rec.of("checkpoint_saved")
    assert saved["step"] == 10 and saved["path"] == str(final) and saved["async"] is False
    assert saved["bytes"] == sum((final / n).stat().st_size for n in DATA_FILES)
    assert saved["seconds"] >= saved["stall_s"] >= 0
    assert rec.beats >= 1
    assert len(rec.events) == 1


def test_async_save_commits_only_when_collected(fsdp: Any, tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    model, optimizer = fsdp()
    train_step(model, optimizer, seed=1)
    rec = Recorder()
    mgr = manager(root, rec, async_save=True)
    mgr.save(5, model, optimizer, trainer_state(5))
    assert list_checkpoints(root) == []  # the commit happens in poll() or wait()
    mgr.save(6, model, optimizer, trainer_state(6))  # first waits for the save in flight
    assert [s for s, _ in list_checkpoints(root)] == [5]
    mgr.wait()
    assert [s for s, _ in list_checkpoints(root)] == [6, 5]
    for _step, path in list_checkpoints(root):
        assert verify_checkpoint(path) is None
    assert [(e["step"], e["async"]) for e in rec.of("checkpoint_saved")] == [(5, True), (6, True)]
    mgr.save(7, model, optimizer, trainer_state(7), force_sync=True)
    assert [s for s, _ in list_checkpoints(root)] == [7, 6, 5]
    assert rec.of("checkpoint_saved", step=7)[0]["async"] is False
    mgr.poll()
    mgr.wait()  # nothing in flight: no-ops
    assert len(rec.of("checkpoint_saved")) == 3


def test_keep_prunes_old_checkpoints_and_stale_temporaries(fsdp: Any, tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    stale = root / ".tmp-step_00000099-deadbeef0000"
    (stale / "rng").mkdir(parents=True)
    (root / "corrupt" / "step_00000001-0badf00d").mkdir(parents=True)
    model, optimizer = fsdp()
    rec = Recorder()
    mgr = manager(root, rec, keep=2)
    for step in (1, 2, 3, 4):
        train_step(model, optimizer, seed=step)
        mgr.save(step, model, optimizer, trainer_state(step))
        assert [s for s, _ in list_checkpoints(root)] == list(range(step, max(0, step - 2), -1))
    assert not stale.exists()
    assert (root / "corrupt" / "step_00000001-0badf00d").is_dir()  # quarantine is kept
    assert (root / "latest").read_text().strip() == "step_00000004"


def test_saving_over_an_invalid_checkpoint_quarantines_it(fsdp: Any, tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    broken = root / "step_00000010"
    broken.mkdir(parents=True)
    (broken / "__0_0.distcp").write_bytes(b"half a shard")
    model, optimizer = fsdp()
    manager(root, Recorder()).save(10, model, optimizer, trainer_state(10))
    assert verify_checkpoint(broken) is None  # a fresh, complete one
    [moved] = list((root / "corrupt").iterdir())
    assert moved.name.startswith("step_00000010-")
    assert (moved / "__0_0.distcp").read_bytes() == b"half a shard"
    assert "replaced" in (moved / "WHY").read_text()


# --- verifying -------------------------------------------------------------------------------


def test_the_checkpoint_has_the_documented_files(ckpt: Path) -> None:
    assert files_of(ckpt) == FILES


@pytest.mark.parametrize("name", DATA_FILES)
def test_a_flipped_bit_in_a_data_file_is_found(ckpt: Path, name: str) -> None:
    path = ckpt / name
    for i, offset in enumerate(positions(path.stat().st_size)):
        bit = i % 8
        flip_bit(path, offset, bit)
        reason = verify_checkpoint(ckpt)
        assert reason is not None, f"bit {bit} of byte {offset} of {name} flipped unnoticed"
        assert name in reason and ckpt.name in reason
        # With the hashing shared between two ranks, one of them finds it.
        shared = [verify_checkpoint(ckpt, shard=r, num_shards=2) for r in (0, 1)]
        assert any(r is not None for r in shared)
        flip_bit(path, offset, bit)  # undo
    assert verify_checkpoint(ckpt) is None


def test_a_flipped_bit_in_the_manifest_is_found(ckpt: Path) -> None:
    path = ckpt / MANIFEST
    original = path.read_bytes()
    for i, offset in enumerate(positions(len(original), count=120)):
        bit = i % 8
        flip_bit(path, offset, bit)
        reason = verify_checkpoint(ckpt)
        # The manifest must be byte-for-byte its canonical form, so even a flip that parses
        # to the same content (whitespace, a float digit beyond double precision) is found.
        assert reason is not None and MANIFEST in reason, (offset, bit)
        path.write_bytes(original)


def test_a_manifest_with_the_same_content_in_other_bytes_is_refused(ckpt: Path) -> None:
    path = ckpt / MANIFEST
    path.write_text(json.dumps(json.loads(path.read_text())))  # same content, no indentation
    assert MANIFEST in (verify_checkpoint(ckpt) or "")


def test_a_changed_hash_in_the_manifest_is_found(ckpt: Path) -> None:
    path = ckpt / MANIFEST
    manifest = json.loads(path.read_text())
    sha = manifest["files"]["trainer_state.json"]["sha256"]
    manifest["files"]["trainer_state.json"]["sha256"] = ("0" if sha[0] != "0" else "1") + sha[1:]
    path.write_text(json.dumps(manifest))
    assert "checksum" in (verify_checkpoint(ckpt) or "")


@pytest.mark.parametrize("name", sorted(FILES))
def test_a_deleted_file_is_found(ckpt: Path, name: str) -> None:
    (ckpt / name).unlink()
    reason = verify_checkpoint(ckpt)
    assert reason is not None and name in reason
    if name != MANIFEST:  # the file list is checked by every rank, whatever share it hashes
        for r in (0, 1, 2):
            assert verify_checkpoint(ckpt, shard=r, num_shards=3) == reason


@pytest.mark.parametrize("name", sorted(FILES))
@pytest.mark.parametrize("how", ["truncate", "empty", "append"])
def test_a_file_of_the_wrong_length_is_found(ckpt: Path, name: str, how: str) -> None:
    path = ckpt / name
    data = path.read_bytes()
    changed = {"truncate": data[:-1], "empty": b"", "append": data + b"x"}[how]
    path.write_bytes(changed)
    reason = verify_checkpoint(ckpt)
    assert reason is not None and name in reason  # a size mismatch, or a corrupt manifest


@pytest.mark.parametrize("extra", ["extra.bin", "rng/rank1.json", "notes/readme.txt",
                                   ".metadata.bak"])
def test_an_unexpected_file_is_found(ckpt: Path, extra: str) -> None:
    path = ckpt / extra
    path.parent.mkdir(exist_ok=True)
    path.write_text("{}")
    reason = verify_checkpoint(ckpt)
    assert reason is not None and "unexpected" in reason and extra in reason


def test_list_checkpoints_sees_only_committed_names(ckpt: Path) -> None:
    root = ckpt.parent
    assert list_checkpoints(root / "nope") == []
    (root / ".tmp-step_00000030-abc").mkdir()
    (root / "corrupt" / "step_00000040-1234abcd").mkdir(parents=True)
    (root / "step_00000050.old").mkdir()
    (root / "step_0000060").mkdir()  # seven digits
    (root / "step_00000070").write_text("a file, not a directory")
    (root / "step_00000005").mkdir()
    (root / "step_00000020").mkdir()  # committed-looking; verification is another matter
    assert list_checkpoints(root) == [(20, root / "step_00000020"), (10, ckpt),
                                      (5, root / "step_00000005")]


def test_preflight_accepts_a_run_dir_with_a_valid_checkpoint(ckpt: Path) -> None:
    run_dir = ckpt.parent.parent
    (ckpt.parent / "step_00000020").mkdir()  # a newer one that never committed
    preflight(TrainConfig(run_dir=run_dir, on_no_valid_checkpoint="fail"))


# --- loading ---------------------------------------------------------------------------------


def test_load_latest_falls_back_past_a_corrupt_checkpoint(fsdp: Any, tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    model, optimizer = fsdp()
    rec = Recorder()
    mgr = manager(root, rec)
    train_step(model, optimizer, seed=1)
    mgr.save(10, model, optimizer, trainer_state(10))
    at_10 = state_digest(model, optimizer, rank=0)
    params_10 = full_params(model)
    train_step(model, optimizer, seed=2)
    mgr.save(20, model, optimizer, trainer_state(20))
    assert state_digest(model, optimizer, rank=0) != at_10
    flip_bit(root / "step_00000020" / "__0_0.distcp", 1000, 3)

    rec.events.clear()
    loaded = mgr.load_latest(model, optimizer, on_none_valid="fail")
    assert loaded is not None
    result, state = loaded
    assert result.step == 10 and result.path == root / "step_00000010"
    assert state == trainer_state(10)
    assert len(result.fell_back_from) == 1 and "step_00000020" in result.fell_back_from[0]
    assert result.rng == "restored" and result.world_size_saved == 1
    # The model and the optimizer hold step 10's state again.
    assert state_digest(model, optimizer, rank=0) == at_10
    for name, p in full_params(model).items():
        assert torch.equal(p, params_10[name]), name
    # The corrupt one is out of the way, with the reason next to it.
    assert [s for s, _ in list_checkpoints(root)] == [10]
    [moved] = list((root / "corrupt").iterdir())
    assert moved.name.startswith("step_00000020-")
    assert "SHA-256" in (moved / "WHY").read_text()
    # Reported: the anomaly first, then the load.
    assert [e["kind"] for e in rec.events] == ["anomaly", "checkpoint_loaded"]
    anomaly, done = rec.events
    assert anomaly["what"] == "checkpoint_invalid" and anomaly["action"] == "fall_back"
    assert anomaly["step"] == 20 and anomaly["reason"] == result.fell_back_from[0]
    assert done["step"] == 10 and done["fell_back_from"] == result.fell_back_from
    assert done["latest_pointer"] == "step_00000020"  # the hint was stale; the scan decided
    assert rec.beats >= 2


def test_load_restores_the_rng_state_of_the_save(fsdp: Any, tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    model, optimizer = fsdp()
    mgr = manager(root, Recorder())
    seed_rank_rng(0, 10, 0)
    at_save = capture_rng()
    mgr.save(10, model, optimizer, trainer_state(10))
    restore_rng(at_save)
    expected = (random.random(), np.random.rand(), torch.rand(3))
    seed_rank_rng(123, 4, 0)  # anything else
    loaded = mgr.load_latest(model, optimizer, on_none_valid="fail")
    assert loaded is not None and loaded[0].rng == "restored"
    got = (random.random(), np.random.rand(), torch.rand(3))
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])


def _corrupt_everything(root: Path) -> None:
    for _step, path in list_checkpoints(root):
        flip_bit(path / "trainer_state.json", 2, 0)


def _two_corrupt_checkpoints(fsdp: Any, tmp_path: Path) -> tuple[Path, Any, Any]:
    root = tmp_path / "checkpoints"
    model, optimizer = fsdp()
    mgr = manager(root, Recorder())
    mgr.save(10, model, optimizer, trainer_state(10))
    mgr.save(20, model, optimizer, trainer_state(20))
    _corrupt_everything(root)
    return root, model, optimizer


def test_no_valid_checkpoint_with_fail_raises(fsdp: Any, tmp_path: Path) -> None:
    root, model, optimizer = _two_corrupt_checkpoints(fsdp, tmp_path)
    rec = Recorder()
    with pytest.raises(CheckpointError) as info:
        manager(root, rec).load_latest(model, optimizer, on_none_valid="fail")
    msg = str(info.value)
    assert "step_00000020" in msg and "step_00000010" in msg
    assert "--on-no-valid-checkpoint scratch" in msg
    assert [e["step"] for e in rec.of("anomaly", what="checkpoint_invalid")] == [20, 10]
    assert not rec.of("checkpoint_loaded")


def test_no_valid_checkpoint_with_scratch_returns_none(fsdp: Any, tmp_path: Path) -> None:
    root, model, optimizer = _two_corrupt_checkpoints(fsdp, tmp_path)
    rec = Recorder()
    assert manager(root, rec).load_latest(model, optimizer, on_none_valid="scratch") is None
    [gave_up] = rec.of("anomaly", what="no_valid_checkpoint")
    assert gave_up["action"] == "start_from_scratch"
    assert "step_00000020" in gave_up["reason"] and "step_00000010" in gave_up["reason"]
    assert len(list((root / "corrupt").iterdir())) == 2


def test_fail_policy_still_refuses_after_a_restart(fsdp: Any, tmp_path: Path) -> None:
    """``--on-no-valid-checkpoint fail`` must hold for the restarted worker too.

    The trainer exits with code 6 after the CheckpointError and torchrun restarts the worker
    group; the restarted rank calls load_latest again on the same run directory. It must not
    find "no checkpoint at all" and silently train from step 0.
    """
    root, model, optimizer = _two_corrupt_checkpoints(fsdp, tmp_path)
    with pytest.raises(CheckpointError):
        manager(root, Recorder()).load_latest(model, optimizer, on_none_valid="fail")
    with pytest.raises(CheckpointError):  # the restarted worker
        manager(root, Recorder()).load_latest(model, optimizer, on_none_valid="fail")


def test_nothing_to_resume_from(fsdp: Any, tmp_path: Path) -> None:
    model, optimizer = fsdp()
    for policy in ("fail", "scratch"):
        rec = Recorder()
        root = tmp_path / policy
        (root / ".tmp-step_00000010-abc").mkdir(parents=True)  # a save that never committed
        assert manager(root, rec).load_latest(model, optimizer, on_none_valid=policy) is None
        assert rec.events == []
        assert rec.beats >= 1


# --- RNG state -------------------------------------------------------------------------------


def _draws() -> tuple[Any, ...]:
    return (random.random(), random.gauss(0.0, 1.0), random.getrandbits(70),
            np.random.rand(4).tolist(), np.random.standard_normal(3).tolist(),
            torch.rand(5), torch.randn(2, 2), torch.randint(0, 10**6, (4,)))


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
               for x, y in zip(a, b, strict=True))


def test_capture_and_restore_rng_round_trip_through_json() -> None:
    seed_rank_rng(7, 3, 1)
    random.gauss(0.0, 1.0)  # leaves a cached gaussian in python's state
    np.random.standard_normal()  # and one in numpy's legacy state
    state = json.loads(json.dumps(capture_rng()))  # what a checkpoint stores
    first = _draws()
    assert not _same(first, _draws())  # the generators did move on
    restore_rng(state)
    assert _same(_draws(), first)


def test_seed_rank_rng_is_deterministic_and_per_rank() -> None:
    seed_rank_rng(0, 10, 0)
    a = _draws()
    seed_rank_rng(0, 10, 0)
    assert _same(_draws(), a)
    for other in ((0, 10, 1), (0, 11, 0), (1, 10, 0)):
        seed_rank_rng(*other)
        assert not _same(_draws(), a), other
