"""The storage faults on a real committed checkpoint, and the SLA that no damaged one loads."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fsdp_helpers import save_checkpoints
from torch.distributed.device_mesh import DeviceMesh

from faultlab.errors import FaultError
from faultlab.faults.storage import (
    CkptBitflipFault,
    CkptDeleteShardFault,
    CkptStalePointerFault,
    CkptTornWriteFault,
    CkptTruncateFault,
    CkptZeroRangeFault,
)
from faultlab.observe import FaultRecord, compute_metrics
from faultlab.runtime.manifest import list_checkpoints, verify_checkpoint

ALL = type("V", (), {"kind": "all", "value": None})()


@dataclass
class Ctx:
    run_dir: Path
    seed: int = 0
    pid: int = 0

    def rng(self, key: str) -> random.Random:
        return random.Random(f"{self.seed}/{key}")

    def rank_pid(self, rank: int) -> int:
        return self.pid

    def assert_owned(self, pid: int) -> None:
        if pid != self.pid:
            raise FaultError(f"process {pid} is not part of the job")

    def signal(self, pid: int, sig: int) -> bool:
        self.assert_owned(pid)
        os.kill(pid, sig)
        return True

    def host_path(self, path: Path, node: str | None = None) -> Path:
        return path

    def checkpoints(self) -> list[tuple[int | None, Path]]:
        return [(s, p) for s, p in reversed(list_checkpoints(self.run_dir / "checkpoints"))]


@pytest.fixture(scope="module")
def template(mesh: DeviceMesh, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("run")
    save_checkpoints(mesh, run_dir / "checkpoints", (10, 20))
    return run_dir


@pytest.fixture
def run_dir(template: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "run"
    shutil.copytree(template, dest)
    return dest


def snapshot(ckpt: Path) -> dict[str, bytes]:
    return {str(p.relative_to(ckpt)): p.read_bytes() for p in ckpt.rglob("*") if p.is_file()}


def bit_differences(a: bytes, b: bytes) -> int:
    return sum(bin(x ^ y).count("1") for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("region", ["tensor_data", "metadata", "manifest", "any"])
def test_bitflip_flips_exactly_num_bits_in_the_region_of_the_latest(run_dir: Path,
                                                                    region: str) -> None:
    newest, older = run_dir / "checkpoints/step_00000020", run_dir / "checkpoints/step_00000010"
    before, older_before = snapshot(newest), snapshot(older)
    fault = CkptBitflipFault(CkptBitflipFault.Params(region=region, num_bits=3))
    details = fault.inject(Ctx(run_dir), ALL)
    after = snapshot(newest)
    flipped = sum(bit_differences(before[k], after[k]) for k in before)
    assert 1 <= flipped <= 3 and len(details["flips"]) == 3  # two flips may cancel out
    changed = {k for k in before if before[k] != after[k]}
    if region == "tensor_data":
        assert all(k.endswith(".distcp") for k in changed)
    if region == "manifest":
        assert changed <= {"MANIFEST.json"}
    assert snapshot(older) == older_before  # only the latest
    assert details["checkpoints"] == [str(newest)]
    if flipped:
        assert verify_checkpoint(newest) is not None


@pytest.mark.parametrize("region", ["tensor_data", "metadata"])
def test_bitflip_in_a_torch_save_file_hits_only_its_region(tmp_path: Path, region: str) -> None:
    """A single-file checkpoint: tensor_data is the archive's tensor storages, so the file still
    loads and only tensor bytes change (what silent rot does to a Lightning checkpoint);
    metadata is the pickle and the other small entries."""
    import io
    import zipfile

    import torch

    state = {"model": {"fc.weight": torch.randn(64, 64)}, "epoch": 3}
    ckpt = tmp_path / "last.ckpt"
    torch.save(state, ckpt)
    before = ckpt.read_bytes()
    ctx = Ctx(tmp_path)
    ctx.checkpoints = lambda: [(8, ckpt)]  # type: ignore[method-assign]
    details = CkptBitflipFault(CkptBitflipFault.Params(region=region, num_bits=4)).inject(ctx, ALL)
    after = ckpt.read_bytes()
    changed = [i for i, (x, y) in enumerate(zip(before, after, strict=True)) if x != y]
    assert changed and {f["offset"] for f in details["flips"]} >= set(changed)
    with zipfile.ZipFile(io.BytesIO(before)) as archive:  # where each storage's bytes are
        storages = [archive.read(i) for i in archive.infolist()
                    if "/data/" in i.filename and not i.filename.endswith(".pkl")]
    spans = [(before.index(blob), len(blob)) for blob in storages]
    in_storage = [any(o0 <= o < o0 + n for o0, n in spans) for o in changed]
    if region == "tensor_data":
        assert all(in_storage)
        loaded = torch.load(ckpt)  # the archive is intact: the damage is silent
        assert loaded["epoch"] == 3 and not torch.equal(loaded["model"]["fc.weight"],
                                                        state["model"]["fc.weight"])
    else:
        assert not any(in_storage)


def test_bitflip_offsets_come_from_the_seed(run_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(run_dir, other)
    params = CkptBitflipFault.Params(num_bits=5)
    a = CkptBitflipFault(params).inject(Ctx(run_dir, seed=7), ALL)["flips"]
    b = CkptBitflipFault(params).inject(Ctx(other, seed=7), ALL)["flips"]
    c = CkptBitflipFault(params).inject(Ctx(other, seed=8), ALL)["flips"]
    assert a == b and a != c


def test_all_and_step_select_checkpoints(run_dir: Path) -> None:
    d = CkptZeroRangeFault(CkptZeroRangeFault.Params(checkpoint="all")).inject(Ctx(run_dir), ALL)
    assert len(d["checkpoints"]) == 2
    assert all(verify_checkpoint(Path(c)) is not None for c in d["checkpoints"])
    with pytest.raises(FaultError, match="no checkpoint 30"):
        CkptTruncateFault(CkptTruncateFault.Params(checkpoint=30)).inject(Ctx(run_dir), ALL)


def test_truncate_delete_and_zero_are_each_detected(run_dir: Path) -> None:
    newest = run_dir / "checkpoints/step_00000020"
    for fault in (CkptTruncateFault(CkptTruncateFault.Params()),
                  CkptDeleteShardFault(CkptDeleteShardFault.Params()),
                  CkptZeroRangeFault(CkptZeroRangeFault.Params(length_bytes=64))):
        backup = snapshot(newest)
        details = fault.inject(Ctx(run_dir), ALL)
        assert verify_checkpoint(newest) is not None, (fault.type, details)
        for name, data in backup.items():  # restore for the next one
            (newest / name).write_bytes(data)
        assert verify_checkpoint(newest) is None


def test_stale_pointer_names_a_partial_checkpoint_that_the_scan_refuses(run_dir: Path) -> None:
    details = CkptStalePointerFault(CkptStalePointerFault.Params()).inject(Ctx(run_dir), ALL)
    root = run_dir / "checkpoints"
    assert (root / "latest").read_text().strip() == "step_00000021" == details["latest_points_to"]
    [(step, newest), *_] = list_checkpoints(root)
    assert step == 21 and "no MANIFEST.json" in (verify_checkpoint(newest) or "")
    assert verify_checkpoint(root / "step_00000020") is None  # the real newest is intact


def test_torn_write_kills_the_saving_rank_once_a_save_starts(run_dir: Path) -> None:
    saver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        ctx = Ctx(run_dir, pid=saver.pid)
        root = run_dir / "checkpoints"
        threading.Timer(0.3, lambda: (root / ".tmp-step_00000030-abc").mkdir()).start()
        t0 = time.time()
        details = CkptTornWriteFault(CkptTornWriteFault.Params(wait_s=10)).inject(ctx, ALL)
        assert saver.wait(timeout=10) == -signal.SIGKILL
        assert details["at_t"] >= t0 + 0.25 and details["step_dir"] == "step_00000030"
        assert details["checkpoints"] == [str(root / ".tmp-step_00000030-abc")]
    finally:
        saver.kill()
        saver.wait()


def test_torn_write_without_a_save_is_a_clear_error(run_dir: Path) -> None:
    saver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        with pytest.raises(FaultError, match="no checkpoint save started within 0.2 s"):
            CkptTornWriteFault(CkptTornWriteFault.Params(wait_s=0.2)).inject(
                Ctx(run_dir, pid=saver.pid), ALL)
        assert saver.poll() is None  # nobody was killed
    finally:
        saver.kill()
        saver.wait()


# --- the SLA --------------------------------------------------------------------------------


def _ev(kind: str, t: float, **kw: Any) -> dict[str, Any]:
    return {"kind": kind, "t": t, "rank": 0, "world_size": 1, "pid": 1, "restart": 0,
            "node": "n", **kw}


def test_corrupt_checkpoint_never_loaded_is_measured_from_the_loads() -> None:
    bad = "/run/checkpoints/step_00000020"
    flip = FaultRecord(id="f", type="ckpt_bitflip", injected_t=10.0,
                       details={"checkpoints": [bad]})
    good_load = [_ev("checkpoint_loaded", 12.0, path="/run/checkpoints/step_00000010")]
    assert compute_metrics(good_load, [flip]).corrupt_checkpoint_never_loaded is True
    assert compute_metrics([_ev("checkpoint_loaded", 12.0, path=bad)],
                           [flip]).corrupt_checkpoint_never_loaded is False
    # loaded before the damage, or after the job wrote a fresh checkpoint there: not corrupt
    rewritten = [_ev("checkpoint_saved", 11.0, path=bad), _ev("checkpoint_loaded", 12.0,
                                                              path=bad)]
    assert compute_metrics(rewritten, [flip]).corrupt_checkpoint_never_loaded is True
    assert compute_metrics([_ev("checkpoint_loaded", 9.0, path=bad), *good_load],
                           [flip]).corrupt_checkpoint_never_loaded is True
    assert compute_metrics(good_load, []).corrupt_checkpoint_never_loaded is None
    # loaded only before the damage, and the job never loaded (or started) again, nor
    # finished: nothing shows it would not have loaded the damaged one
    assert compute_metrics([_ev("checkpoint_loaded", 9.0, path=bad)],
                           [flip]).corrupt_checkpoint_never_loaded is None
