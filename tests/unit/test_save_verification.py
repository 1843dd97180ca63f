"""``verify_dcp_save``: a DCP save that returned is checked against its files.

Real saves, real file-system errors. The lost-error case is pytorch issue 191391, reproduced
as it happens: with ``FileSystemWriter(thread_count=2)`` the helper thread takes the first
file; here that name is a directory, so its ``open`` fails with EISDIR, the thread dies, and
``dcp.save`` returns normally with a ``.metadata`` that lacks every item of that file.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from faultlab.runtime.dcp import verify_dcp_save


def _state() -> dict[str, torch.Tensor]:
    return {f"w{i}": torch.full((64, 64), float(i)) for i in range(6)}


def _save(path: Path, thread_count: int = 1) -> None:
    dcp.save(_state(), storage_writer=dcp.FileSystemWriter(str(path), thread_count=thread_count),
             no_dist=True)


def test_a_complete_save_verifies(tmp_path: Path) -> None:
    _save(tmp_path / "ok", thread_count=2)
    assert verify_dcp_save(tmp_path / "ok") is None


# The helper thread's IsADirectoryError reaches only threading's excepthook: that is the bug.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_writer_thread_error_that_dcp_swallowed_is_found(tmp_path: Path) -> None:
    # Which thread takes which file is a race the helper wins at once here (it starts first);
    # when the main thread wins, its own EISDIR is raised, which is not the case under test.
    for attempt in range(5):
        path = tmp_path / f"lost{attempt}"
        (path / "__0_0.distcp").mkdir(parents=True)  # the helper's file cannot be opened
        try:
            _save(path, thread_count=2)  # returns: the helper's IsADirectoryError went nowhere
        except CheckpointException:
            continue
        break
    else:
        raise AssertionError("the main thread took the broken file in all 5 attempts")
    assert (path / ".metadata").is_file()
    problem = verify_dcp_save(path)
    assert problem is not None
    assert "is in .metadata but was never written" in problem


def test_a_missing_or_short_shard_and_a_missing_index_are_found(tmp_path: Path) -> None:
    _save(tmp_path / "a")
    shard = next((tmp_path / "a").glob("*.distcp"))
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(size - 1)
    assert verify_dcp_save(tmp_path / "a") == (
        f"a: {shard.name} has {size - 1} bytes, .metadata needs {size}")
    shard.unlink()
    assert verify_dcp_save(tmp_path / "a") == f"a: {shard.name} is missing"
    (tmp_path / "a" / ".metadata").unlink()
    assert "no .metadata" in (verify_dcp_save(tmp_path / "a") or "")
