"""Atomic, verified, sharded checkpoints of the full training state.

Layout of ``RUN_DIR/checkpoints``::

    step_00000040/           a committed checkpoint (only these are ever considered)
      __0_0.distcp ...       DCP shards: model and optimizer (sharded, reshardable)
      .metadata              DCP's index
      trainer_state.json     step, sampler position, LR scheduler, config, torch version
      rng/rank0.json ...     every rank's python, numpy, torch CPU and CUDA RNG states
      MANIFEST.json          size + SHA-256 of every file above, and of itself; written last
    .tmp-step_00000050-<id>  a save in progress: never considered, removed once stale
    corrupt/                 checkpoints found invalid, moved aside for inspection
    latest                   name of the newest committed checkpoint (a hint; see below)

Commit protocol: every rank writes into the temporary directory; after DCP's coordinator has
written ``.metadata`` (which it does only once every rank's shards are written), rank 0 hashes
every file, writes the manifest (temp file, fsync, rename), renames the directory to its final
name and fsyncs the parent. A save killed at any point leaves a ``.tmp-*`` directory or
nothing, never a ``step_*`` directory without a complete manifest.

Why not let DCP pickle the small state: DCP loads non-tensor entries with
``torch.load(weights_only=False)``, which executes whatever a tampered file says. Everything
that is not a tensor is JSON here; DCP's own pickled ``.metadata`` is read by an unpickler that
resolves only DCP's metadata classes (``faultlab.runtime.dcp.SafeReader``); and nothing of a
checkpoint is parsed before the manifest has vouched for every byte (DCP itself stores no
content hash, so a flipped bit would otherwise load silently).

On load, candidates are tried newest first; each rank hashes a share of the files and the
verdict is all-reduced, so every rank picks the same checkpoint. ``latest`` is only reported
against: the scan, not the pointer, decides.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import shutil
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from faultlab.runtime.dcp import SafeReader
from faultlab.runtime.manifest import (
    CheckpointError,
    fsync_dir,
    list_checkpoints,
    read_manifest,
    verify_checkpoint,
    write_json_atomic,
    write_manifest,
)

__all__ = [
    "CheckpointError",
    "CheckpointManager",
    "LoadResult",
    "list_checkpoints",
    "read_manifest",
    "verify_checkpoint",
]



@dataclass(frozen=True, slots=True)
class LoadResult:
    step: int
    path: Path
    fell_back_from: list[str]
    """Newer checkpoints that were found invalid, newest first, with the reason."""
    rng: str
    """``restored`` or ``reseeded`` (the world size changed, so rank RNGs are re-derived)."""
    world_size_saved: int


# ---------------------------------------------------------------------------------------------
# RNG state as JSON (no pickle)


def capture_rng() -> dict[str, Any]:
    np_state = np.random.get_state()
    out: dict[str, Any] = {
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
        "numpy": [np_state[0], np_state[1].tolist(), *map(_jsonable, np_state[2:])],
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
    }
    if torch.cuda.is_available():
        out["cuda"] = [base64.b64encode(s.numpy().tobytes()).decode()
                       for s in torch.cuda.get_rng_state_all()]
    return out


def _jsonable(x: Any) -> Any:
    return x.item() if hasattr(x, "item") else x


def restore_rng(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_bytes_tensor(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_bytes_tensor(s) for s in state["cuda"]])


def _bytes_tensor(b64: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(b64)), dtype=torch.uint8)


def seed_rank_rng(seed: int, step: int, rank: int) -> None:
    """Deterministic per-rank RNG state, used at a fresh start and when the world size changed."""
    mixed = int.from_bytes(hashlib.sha256(f"{seed}/{step}/{rank}".encode()).digest()[:4], "big")
    random.seed(mixed)
    np.random.seed(mixed)
    torch.manual_seed(mixed)


# ---------------------------------------------------------------------------------------------
# the manager


class CheckpointManager:
    """Saves and loads checkpoints for one rank; every rank constructs one.

    ``process_group`` is a dedicated gloo group: DCP's planning and the async writer's
    collectives run on it, never on the training group, so a background save cannot interleave
    its collectives with the training step's.
    """

    def __init__(self, root: Path, *, keep: int, async_save: bool, rank: int, world_size: int,
                 process_group: dist.ProcessGroup, emit: Any, beat: Any) -> None:
        self.root = root
        self.keep = keep
        self.async_save = async_save
        self.rank = rank
        self.world_size = world_size
        self.pg = process_group
        self.emit = emit
        self.beat = beat
        self._pending: threading.Thread | None = None
        self._pending_error: BaseException | None = None

    # -- saving ---------------------------------------------------------------------------

    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             trainer_state: dict[str, Any], *, force_sync: bool = False,
             rng: dict[str, Any] | None = None, emergency: bool = False) -> None:
        """Write a checkpoint of ``step``. Async unless configured otherwise or ``force_sync``.

        Returns after the training state has been captured; an async save is written and
        committed by a background thread; ``wait()`` joins it. ``rng``: the RNG state to store
        (default: the current one) — a save made mid-step stores the state from the step's
        start. ``emergency`` marks a save made because the node is being preempted.
        """
        self.wait()  # one save in flight at a time
        t0 = time.monotonic()
        token = [uuid.uuid4().hex[:12] if self.rank == 0 else None]
        dist.broadcast_object_list(token, src=0, group=self.pg)
        tmp = self.root / f".tmp-step_{step:08d}-{token[0]}"
        (tmp / "rng").mkdir(parents=True, exist_ok=True)
        # Small state first: by the time DCP's coordinator finishes, these files are written.
        write_json_atomic(tmp / "rng" / f"rank{self.rank}.json", rng or capture_rng())
        if self.rank == 0:
            write_json_atomic(tmp / "trainer_state.json", trainer_state)
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        writer = dcp.FileSystemWriter(str(tmp), sync_files=True)
        if self.async_save and not force_sync:
            resp = dcp.async_save(state, storage_writer=writer, process_group=self.pg)
            future = resp.upload_completion if hasattr(resp, "upload_completion") else resp
            stall = time.monotonic() - t0
            # The commit (hashing every file, manifest, rename, pruning) waits for the write
            # and runs in this thread too: in the training loop it would block the step for
            # as long as hashing takes, which is most of what async saving is meant to hide.
            self._pending = threading.Thread(
                target=self._commit_when_written, args=(future, step, tmp, t0, stall),
                name=f"checkpoint-commit-{step}", daemon=True)
            self._pending.start()
            return
        dcp.save(state, storage_writer=writer, process_group=self.pg)
        self._commit(step, tmp, t0, None, is_async=False, emergency=emergency)
        self.beat()

    def poll(self) -> None:
        """Re-raise a failed background save, once it has ended (cheap; called every step)."""
        if self._pending is not None and not self._pending.is_alive():
            self.wait()

    def wait(self) -> None:
        """Block until the save in flight, if any, is committed; re-raise its failure."""
        if self._pending is not None:
            self._pending.join()
            self._pending = None
            error, self._pending_error = self._pending_error, None
            if error is not None:
                raise CheckpointError(f"background checkpoint save failed: "
                                      f"{type(error).__name__}: {error}") from error

    def _commit_when_written(self, future: Future[Any], step: int, tmp: Path, t0: float,
                             stall_s: float) -> None:
        try:
            future.result()
            self._commit(step, tmp, t0, stall_s, is_async=True)
        except BaseException as e:  # handed to the training thread by wait()
            self._pending_error = e

    def _commit(self, step: int, tmp: Path, t0: float, stall_s: float | None, *,
                is_async: bool, emergency: bool = False) -> None:
        """Rank 0 makes the written checkpoint visible. ``stall_s`` None: the whole save
        blocked training (a synchronous save), so the stall is the full duration."""
        if self.rank != 0:
            return
        files = write_manifest(tmp, step=step, world_size=self.world_size)["files"]
        final = self.root / f"step_{step:08d}"
        if final.exists():  # an invalid one that this run is now replacing
            self._quarantine(final, "replaced by a fresh save of the same step")
        os.rename(tmp, final)
        fsync_dir(self.root)
        _write_latest(self.root, final.name)
        seconds = time.monotonic() - t0
        self.emit("checkpoint_saved", step=step, path=str(final), seconds=round(seconds, 4),
                  stall_s=round(seconds if stall_s is None else stall_s, 4),
                  bytes=sum(f["size"] for f in files.values()),
                  **{"async": is_async}, **({"emergency": True} if emergency else {}))
        self._prune(keep_tmp=None)

    def _prune(self, keep_tmp: Path | None) -> None:
        for _step, path in list_checkpoints(self.root)[self.keep:]:
            shutil.rmtree(path, ignore_errors=True)
        for path in self.root.glob(".tmp-step_*"):
            if path != keep_tmp:  # leftovers of saves killed mid-write
                shutil.rmtree(path, ignore_errors=True)

    def _quarantine(self, path: Path, reason: str) -> None:
        dest = self.root / "corrupt" / f"{path.name}-{uuid.uuid4().hex[:8]}"
        dest.parent.mkdir(exist_ok=True)
        os.rename(path, dest)
        (dest / "WHY").write_text(reason + "\n")

    # -- loading --------------------------------------------------------------------------

    def load_latest(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    *, on_none_valid: str) -> tuple[LoadResult, dict[str, Any]] | None:
        """Load the newest valid checkpoint into ``model``/``optimizer``.

        Returns ``(result, trainer_state)``, or ``None`` when there is nothing to resume from
        (no checkpoint at all, or none valid and ``on_none_valid == "scratch"``).
        """
        self.wait()
        self.beat()
        fell_back: list[str] = []
        candidates = list_checkpoints(self.root)
        latest_hint = _read_latest(self.root)
        invalid: list[tuple[Path, str]] = []
        for step, path in candidates:
            reason = self._agreed_verdict(path)
            self.beat()
            if reason is None:
                self._set_aside(invalid)
                return self._load(step, path, model, optimizer, fell_back, latest_hint)
            fell_back.append(reason)
            invalid.append((path, reason))
            self.emit("anomaly", what="checkpoint_invalid", step=step, path=str(path),
                      reason=reason, action="fall_back")
        if not candidates:
            return None
        message = f"no valid checkpoint in {self.root}: " + "; ".join(fell_back)
        if on_none_valid == "scratch":
            self.emit("anomaly", what="no_valid_checkpoint", reason=message,
                      action="start_from_scratch")
            self._set_aside(invalid)
            return None
        # Leave them where they are: a restarted rank, or the next launch, must refuse too.
        raise CheckpointError(message + "; refusing to start from scratch "
                              "(--on-no-valid-checkpoint scratch allows it)")

    def _set_aside(self, invalid: list[tuple[Path, str]]) -> None:
        """Move invalid checkpoints to corrupt/ once every rank has stopped reading them."""
        if not invalid:
            return
        dist.barrier(group=self.pg)
        if self.rank == 0:
            for path, reason in invalid:
                self._quarantine(path, reason)

    def _agreed_verdict(self, path: Path) -> str | None:
        reason = verify_checkpoint(path, shard=self.rank, num_shards=self.world_size)
        reasons: list[str | None] = [None] * self.world_size
        dist.all_gather_object(reasons, reason, group=self.pg)
        return next((r for r in reasons if r is not None), None)

    def _load(self, step: int, path: Path, model: torch.nn.Module,
              optimizer: torch.optim.Optimizer,
              fell_back: list[str],
              latest_hint: str | None) -> tuple[LoadResult, dict[str, Any]]:
        t0 = time.monotonic()
        manifest = read_manifest(path)
        trainer_state = json.loads((path / "trainer_state.json").read_text())
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, storage_reader=SafeReader(path), process_group=self.pg)
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        saved_ws = int(manifest["world_size"])
        rng_file = path / "rng" / f"rank{self.rank}.json"
        if saved_ws == self.world_size and rng_file.exists():
            restore_rng(json.loads(rng_file.read_text()))
            rng = "restored"
        else:
            seed_rank_rng(int(trainer_state["config"]["seed"]), step, self.rank)
            rng = "reseeded"
        result = LoadResult(step=step, path=path, fell_back_from=fell_back, rng=rng,
                            world_size_saved=saved_ws)
        self.emit("checkpoint_loaded", step=step, path=str(path), fell_back_from=fell_back,
                  rng=rng, world_size_saved=saved_ws, latest_pointer=latest_hint,
                  seconds=round(time.monotonic() - t0, 4))
        return result, trainer_state


def _write_latest(root: Path, name: str) -> None:
    tmp = root / f".latest.{uuid.uuid4().hex[:8]}"
    tmp.write_text(name + "\n")
    os.replace(tmp, root / "latest")


def _read_latest(root: Path) -> str | None:
    try:
        return (root / "latest").read_text().strip() or None
    except OSError:
        return None
