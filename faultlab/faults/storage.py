"""Storage faults: rot, truncate, zero, delete or tear the job's checkpoints on disk.

They act on the checkpoints the job reported (the paths of its ``checkpoint_saved`` records,
whatever the trainer: a DCP directory or a ``torch.save`` file), else on the ``step_N``
directories of ``RUN_DIR/checkpoints`` (``FaultContext.checkpoints``). Which checkpoint:
``latest`` (the newest committed one), a step number, or ``all``: as of the step the trigger
saw, for the engine fires these faults only once every rank that saves has reported that step
(its save records arrive before it, through its own relay), or after a 2 s grace. Which files
(``region``):
``tensor_data`` (the DCP shards, ``*.distcp``; in a ``torch.save`` file, its tensor storages),
``metadata`` (everything else but the manifest: DCP's ``.metadata``, trainer state, RNG state;
a ``torch.save`` file's pickle), ``manifest`` (``MANIFEST.json``) or ``any``. Every random
choice — file, offset, bit — comes from the experiment seed, so a run corrupts the same bytes
again.

A corrupted checkpoint matters only when it is read: pair these faults with one that makes the
job restart (a ``rank_kill`` a few steps later), as the shipped experiments do. Each fault's
details list the checkpoint directories it touched (``checkpoints``), which is how the
``corrupt_checkpoint_never_loaded`` SLA knows what must never be loaded.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import struct
import time
import zipfile
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

from faultlab.errors import FaultError
from faultlab.fault_api import Fault, FaultContext, FaultParams, Victim

__all__ = [
    "CkptBitflipFault",
    "CkptDeleteShardFault",
    "CkptStalePointerFault",
    "CkptTornWriteFault",
    "CkptTruncateFault",
    "CkptZeroRangeFault",
]

Region = Literal["tensor_data", "metadata", "manifest", "any"]
_STEP_DIR = re.compile(r"^step_(\d+)$")
_MANIFEST = "MANIFEST.json"


class _Which(FaultParams):
    checkpoint: Literal["latest", "all"] | int = Field(
        "latest", description="which checkpoint: latest, all, or a step number")
    region: Region = Field("tensor_data", description="which files: tensor_data (DCP shards), "
                                                      "metadata, manifest or any")


def _checkpoints(ctx: FaultContext, which: Literal["latest", "all"] | int) -> list[Path]:
    found = ctx.checkpoints()
    if which == "latest":
        chosen = [p for _s, p in found[-1:]]
    elif which == "all":
        chosen = [p for _s, p in found]
    else:
        chosen = [p for s, p in found if s == which]
    if not chosen:
        have = ", ".join(p.name for _s, p in found) or "none"
        raise FaultError(f"no checkpoint {which!r} of the job in {ctx.run_dir} to corrupt "
                         f"(found: {have}); trigger the fault after the first checkpoint_saved "
                         f"event")
    return chosen


def _files(ckpt: Path, region: Region) -> list[Path]:
    if ckpt.is_file():  # a torch.save checkpoint: tensors and metadata in one archive
        if region == "manifest" or ckpt.stat().st_size == 0:
            raise FaultError(f"{ckpt.name} is a single file and has no {region} to corrupt")
        return [ckpt]
    files = sorted(p for p in ckpt.rglob("*") if p.is_file() and p.stat().st_size > 0)
    if region == "tensor_data":
        files = [p for p in files if p.suffix == ".distcp"]
    elif region == "manifest":
        files = [p for p in files if p.name == _MANIFEST and p.parent == ckpt]
    elif region == "metadata":
        files = [p for p in files if p.suffix != ".distcp" and
                 not (p.name == _MANIFEST and p.parent == ckpt)]
    if not files:
        raise FaultError(f"{ckpt.name} has no non-empty {region} file to corrupt")
    return files


_ZIP_DATA = re.compile(r"(^|/)data/\d+$")  # torch.save's tensor storages: archive/data/0 ...


def _spans(ckpt: Path, path: Path, region: Region) -> list[tuple[int, int]]:
    """The ``(offset, length)`` byte ranges of ``path`` (a file of checkpoint ``ckpt``) that
    belong to ``region``.

    A file of a DCP directory is wholly its region (``_files`` chose it by region). A
    single-file checkpoint written by ``torch.save`` is a zip archive whose entries are stored
    uncompressed: ``tensor_data`` is its tensor storages (``*/data/N``), ``metadata`` the other
    entries (the pickle, the version, the byte order). A file that is not a zip archive
    (torch's legacy format, another framework's) cannot be told apart: all of it is the
    region."""
    size = path.stat().st_size
    if not ckpt.is_file() or region == "any" or not zipfile.is_zipfile(path):
        return [(0, size)]
    spans = []
    with open(path, "rb") as f, zipfile.ZipFile(f) as archive:
        for info in archive.infolist():
            is_data = bool(_ZIP_DATA.search(info.filename))
            if info.compress_size == 0 or is_data != (region == "tensor_data"):
                continue
            f.seek(info.header_offset + 26)  # the local header's name and extra lengths
            name_len, extra_len = struct.unpack("<HH", f.read(4))
            spans.append((info.header_offset + 30 + name_len + extra_len, info.compress_size))
    return spans or [(0, size)]


def _seeded_offset(rng: random.Random, spans: list[tuple[int, int]]) -> int:
    """A seeded byte offset, uniform over the bytes of ``spans``."""
    at = rng.randrange(sum(length for _o, length in spans))
    for offset, length in spans:
        if at < length:
            return offset + at
        at -= length
    raise AssertionError("unreachable: at < the spans' total length")


def _overwrite(path: Path, offset: int, data: bytes) -> None:
    """Write ``data`` at ``offset`` in place and make it durable (the damage must stick)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _rng(ctx: FaultContext, victim: Victim, what: str) -> random.Random:
    return ctx.rng(f"{what}/{victim.kind}/{victim.value}")


def _one_file_each(ctx: FaultContext, victim: Victim, fault_type: str,
                   which: Literal["latest", "all"] | int,
                   region: Region) -> tuple[list[Path], random.Random, list[Path]]:
    """The chosen checkpoints, the fault's seeded generator, and one seeded file of each."""
    rng = _rng(ctx, victim, fault_type)
    ckpts = _checkpoints(ctx, which)
    return ckpts, rng, [rng.choice(_files(c, region)) for c in ckpts]


def _rel(ctx: FaultContext, path: Path) -> str:
    """The path relative to the run directory where it lies inside it, else absolute (a user's
    trainer may checkpoint anywhere)."""
    try:
        return str(path.relative_to(ctx.run_dir))
    except ValueError:
        return str(path)


class _StorageFault(Fault):
    family = "storage"
    targets: ClassVar[tuple[str, ...]] = ("all",)
    """``target: all``: the job's checkpoint directory (storage faults hit no process)."""
    reads_saved_checkpoints: ClassVar[bool] = True
    """It picks its checkpoints from the job's ``checkpoint_saved`` records: the engine fires
    it once every rank that saves has reported the step the trigger saw (``_await_saves``)."""


class CkptBitflipFault(_StorageFault):
    """Flip bits at seeded offsets of checkpoint files (silent corruption on disk)."""

    type = "ckpt_bitflip"

    class Params(_Which):
        num_bits: int = Field(1, ge=1, le=4096, description="bits to flip, each in a seeded "
                                                            "file and offset of the region")

    def inject(self, ctx: FaultContext, victim: Victim) -> dict[str, Any]:
        p: Any = self.params
        rng = _rng(ctx, victim, self.type)
        ckpts = _checkpoints(ctx, p.checkpoint)
        flips = []
        for ckpt in ckpts:
            files = _files(ckpt, p.region)
            spans = {path: _spans(ckpt, path, p.region) for path in files}
            for _ in range(p.num_bits):
                path = rng.choice(files)
                offset, bit = _seeded_offset(rng, spans[path]), rng.randrange(8)
                with open(path, "rb") as f:
                    f.seek(offset)
                    byte = f.read(1)[0]
                _overwrite(path, offset, bytes([byte ^ (1 << bit)]))
                flips.append({"file": _rel(ctx, path), "offset": offset, "bit": bit})
        return {"checkpoints": [str(c) for c in ckpts], "flips": flips}


class CkptTruncateFault(_StorageFault):
    """Cut one seeded file of the checkpoint short (a write that never finished)."""

    type = "ckpt_truncate"

    class Params(_Which):
        keep_fraction: float = Field(0.5, ge=0.0, lt=1.0,
                                     description="fraction of the file's bytes to keep")

    def inject(self, ctx: FaultContext, victim: Victim) -> dict[str, Any]:
        p: Any = self.params
        ckpts, _, paths = _one_file_each(ctx, victim, self.type, p.checkpoint, p.region)
        done = []
        for path in paths:
            size = path.stat().st_size
            keep = int(size * p.keep_fraction)
            os.truncate(path, keep)
            done.append({"file": _rel(ctx, path), "from_bytes": size, "to_bytes": keep})
        return {"checkpoints": [str(c) for c in ckpts], "truncated": done}


class CkptZeroRangeFault(_StorageFault):
    """Overwrite a seeded byte range of one file with zeros (a lost block, a bad sector)."""

    type = "ckpt_zero_range"

    class Params(_Which):
        length_bytes: int = Field(4096, ge=1, description="bytes to zero")

    def inject(self, ctx: FaultContext, victim: Victim) -> dict[str, Any]:
        p: Any = self.params
        ckpts, rng, paths = _one_file_each(ctx, victim, self.type, p.checkpoint, p.region)
        done = []
        for path in paths:
            size = path.stat().st_size
            length = min(p.length_bytes, size)
            offset = rng.randrange(size - length + 1)
            _overwrite(path, offset, b"\0" * length)
            done.append({"file": _rel(ctx, path), "offset": offset, "length": length})
        return {"checkpoints": [str(c) for c in ckpts], "zeroed": done}


class CkptDeleteShardFault(_StorageFault):
    """Delete one seeded shard file (``*.distcp``) of the checkpoint (a lost object)."""

    type = "ckpt_delete_shard"

    class Params(FaultParams):
        checkpoint: Literal["latest", "all"] | int = Field(
            "latest", description="which checkpoint: latest, all, or a step number")

    def inject(self, ctx: FaultContext, victim: Victim) -> dict[str, Any]:
        p: Any = self.params
        rng = _rng(ctx, victim, self.type)
        ckpts, deleted = _checkpoints(ctx, p.checkpoint), []
        for ckpt in ckpts:
            path = rng.choice(_files(ckpt, "tensor_data"))
            path.unlink()
            deleted.append(_rel(ctx, path))
        return {"checkpoints": [str(c) for c in ckpts], "deleted": deleted}


class CkptStalePointerFault(_StorageFault):
    """Leave a partial checkpoint that looks newest, and point ``latest`` at it.

    A copy of the newest checkpoint without its manifest and with its shards cut in half is
    placed under the next step's name — what a crash between writing and committing leaves in
    stores that mark "latest" before the data is complete.
    """

    type = "ckpt_stale_pointer"

    def inject(self, ctx: FaultContext, victim: Victim) -> dict[str, Any]:
        [newest] = _checkpoints(ctx, "latest")
        named = _STEP_DIR.match(newest.name)
        if named is None:  # a single-file checkpoint, or the job's own naming
            raise FaultError(f"{newest}: ckpt_stale_pointer places a copy under the next "
                             f"step's name and needs step_N checkpoint directories; use "
                             f"ckpt_truncate or ckpt_bitflip, which corrupt it in place")
        step = int(named.group(1))
        partial = newest.with_name(f"step_{step + 1:08d}")
        shutil.copytree(newest, partial)
        (partial / _MANIFEST).unlink(missing_ok=True)
        for shard in partial.glob("*.distcp"):
            os.truncate(shard, shard.stat().st_size // 2)
        pointer = newest.parent / "latest"
        tmp = pointer.with_name(".latest.faultlab")
        tmp.write_text(partial.name + "\n")
        os.replace(tmp, pointer)
        return {"checkpoints": [str(partial)], "partial": _rel(ctx, partial),
                "latest_points_to": partial.name}


class CkptTornWriteFault(_StorageFault):
    """Kill the saving rank in the middle of a checkpoint save (a torn write).

    Fire it a step before a save (e.g. ``at_step: 19`` for the save at step 20): it waits for
    the save's temporary directory to appear and SIGKILLs rank 0 — the rank that commits —
    while the files are being written. It blocks the engine for at most ``wait_s``. It is
    the one fault triggered by step that is not held at the step gate (``step_gated``): it
    lands during the next save, which the job must be free to start.
    """

    type = "ckpt_torn_write"
    step_gated = False

    class Params(FaultParams):
        wait_s: float = Field(60.0, gt=0, description="how long to wait for a save to start")
        rank: int = Field(0, ge=0, description="the rank to kill mid-save (0 commits)")

    def inject(self, ctx: FaultContext, victim: Victim) -> dict[str, Any]:
        p: Any = self.params
        root = ctx.host_path(ctx.run_dir / "checkpoints")
        committed = {d.name for d in root.glob("step_*")} if root.is_dir() else set()
        pid = ctx.rank_pid(p.rank)
        ctx.assert_owned(pid)
        deadline = time.monotonic() + p.wait_s
        while time.monotonic() < deadline:  # a save lasts ~0.1 s for tiny: poll tightly
            for tmp in root.glob(".tmp-step_*"):
                final = tmp.name.split("-")[1]  # .tmp-step_00000020-<id> -> step_00000020
                ctx.signal(pid, signal.SIGKILL)
                return {"checkpoints": [str(tmp)], "at_t": time.time(), "killed_pid": pid,
                        "rank": p.rank, "torn": tmp.name, "step_dir": final,
                        "committed_before": sorted(committed)}
            time.sleep(0.001)
        raise FaultError(f"no checkpoint save started within {p.wait_s:g} s; fire "
                         f"ckpt_torn_write shortly before a checkpoint step")
