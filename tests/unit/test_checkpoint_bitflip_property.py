"""Property: flipping any single bit at any offset of any file of a checkpoint is detected on
load — the loader falls back to the previous checkpoint and never loads the damaged one."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import torch.distributed as dist  # noqa: I001
from fsdp_helpers import Recorder, build_fsdp, save_checkpoints
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.distributed.device_mesh import DeviceMesh

from reference_trainer.checkpoint import CheckpointManager


@pytest.fixture(scope="module")
def two_checkpoints(mesh: DeviceMesh, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("two") / "checkpoints"
    save_checkpoints(mesh, root, (10, 20))
    return root


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_single_bit_flip_in_the_newest_checkpoint_is_detected_on_load(
        two_checkpoints: Path, mesh: DeviceMesh, data: st.DataObject) -> None:
    newest = two_checkpoints / "step_00000020"
    files = sorted(p.relative_to(newest) for p in newest.rglob("*") if p.is_file())
    name = data.draw(st.sampled_from(files), label="file")
    size = (newest / name).stat().st_size
    offset = data.draw(st.integers(0, size - 1), label="offset")
    bit = data.draw(st.integers(0, 7), label="bit")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "checkpoints"
        shutil.copytree(two_checkpoints, root)
        path = root / "step_00000020" / name
        raw = bytearray(path.read_bytes())
        raw[offset] ^= 1 << bit
        path.write_bytes(bytes(raw))
        rec = Recorder()
        mgr = CheckpointManager(root, keep=3, async_save=False, rank=0, world_size=1,
                                process_group=dist.group.WORLD, emit=rec.emit,
                                beat=lambda: None)
        model, optimizer = build_fsdp(mesh)
        loaded = mgr.load_latest(model, optimizer, on_none_valid="fail")
        assert loaded is not None
        result, _state_loaded = loaded
        assert result.step == 10, f"bit {bit} of byte {offset} of {name} went unnoticed"
        assert any("step_00000020" in reason for reason in result.fell_back_from)
        assert [e["step"] for e in rec.of("checkpoint_loaded")] == [10]
        assert [e["step"] for e in rec.of("anomaly", what="checkpoint_invalid")] == [20]


class _Boom:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("a pickled global ran",))


def test_dcp_metadata_is_read_without_running_foreign_globals(two_checkpoints: Path,
                                                              mesh: DeviceMesh,
                                                              tmp_path: Path) -> None:
    """Even a .metadata whose manifest was rewritten to match is never unpickled freely."""
    import pickle

    from faultlab.runtime.dcp import SafeReader as _SafeReader

    ckpt = tmp_path / "step_00000020"
    shutil.copytree(two_checkpoints / "step_00000020", ckpt)
    (ckpt / ".metadata").write_bytes(pickle.dumps(_Boom(), protocol=4))
    with pytest.raises(pickle.UnpicklingError, match="builtins.print is not allowed"):
        _SafeReader(str(ckpt)).read_metadata()
    # and the genuine file still reads
    meta = _SafeReader(str(two_checkpoints / "step_00000020")).read_metadata()
    assert any(k.startswith("model.") for k in meta.state_dict_metadata)
    assert any(k.startswith("optim.") for k in meta.state_dict_metadata)
