"""Checkpoint manifests: make a checkpoint directory verifiable byte for byte, and verify it.

A checkpoint directory is *committed* once its ``MANIFEST.json`` exists: the size and SHA-256
of every other file in it, and a checksum of the manifest itself, written last (temp file,
fsync, rename). ``verify_checkpoint`` answers ``None`` for an intact checkpoint and otherwise the
first reason it is not (a missing, extra, resized or altered file, a damaged manifest). DCP
stores no content hash, so without such a manifest a flipped bit loads silently.

This is in-rank code: a trainer writes the manifest when it commits a checkpoint (the reference
trainer does, through this module), and faultlab verifies the same manifests after a run and
from its probes. Checkpoints live as ``step_NNNNNNNN`` directories under one root
(``list_checkpoints``). It imports nothing of faultlab outside ``faultlab.runtime`` but its
errors.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

from faultlab.errors import CheckpointError

__all__ = [
    "FORMAT",
    "MANIFEST",
    "CheckpointError",
    "canonical_json",
    "data_files",
    "fsync_dir",
    "list_checkpoints",
    "manifest_checksum",
    "read_manifest",
    "sha256_file",
    "verify_checkpoint",
    "write_json_atomic",
    "write_manifest",
]

FORMAT = "faultlab-reference-trainer-checkpoint/1"
"""The manifest's format tag (unchanged since the reference trainer introduced it, so that
checkpoints written before the manifest moved here still verify)."""
MANIFEST = "MANIFEST.json"
_STEP_DIR = re.compile(r"^step_(\d{8})$")
_CHUNK = 1 << 20




def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def canonical_json(obj: object) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode()


def write_json_atomic(path: Path, obj: object) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "wb") as f:
        f.write(canonical_json(obj))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def manifest_checksum(body: dict[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def data_files(ckpt_dir: Path) -> list[str]:
    """Every file of a checkpoint but its top-level manifest, as relative paths."""
    names = (str(p.relative_to(ckpt_dir)) for p in ckpt_dir.rglob("*") if p.is_file())
    return sorted(n for n in names if n != MANIFEST)


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Committed-looking checkpoint directories, newest first (not yet verified)."""
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir():
            found.append((int(m.group(1)), p))
    return sorted(found, reverse=True)


def read_manifest(ckpt_dir: Path) -> dict[str, Any]:
    """Parse and self-check a manifest; raises ``CheckpointError`` with the reason."""
    path = ckpt_dir / MANIFEST
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{ckpt_dir.name}: no {MANIFEST} (save never committed)") from None
    try:
        manifest = json.loads(raw)
        body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
        # The checksum covers the content; the byte comparison catches a flip that parses to
        # the same content (whitespace, an escaped character): every byte is accounted for.
        ok = manifest.get("format") == FORMAT and \
            manifest.get("manifest_sha256") == manifest_checksum(body) and \
            raw == canonical_json(manifest)
    except (ValueError, AttributeError, UnicodeDecodeError):
        ok = False
    if not ok:
        raise CheckpointError(f"{ckpt_dir.name}: {MANIFEST} is corrupt "
                              "(checksum or canonical-form mismatch)")
    return manifest


def verify_checkpoint(ckpt_dir: Path, *, shard: int = 0, num_shards: int = 1) -> str | None:
    """``None`` if the checkpoint is intact, else the first reason it is not.

    With ``num_shards > 1`` only every ``num_shards``-th file (from ``shard``) is hashed, so
    the ranks can share the work; the manifest and the file list are checked by every caller.
    """
    try:
        manifest = read_manifest(ckpt_dir)
    except CheckpointError as e:
        return str(e)
    files: dict[str, dict[str, Any]] = manifest["files"]
    present = set(data_files(ckpt_dir))
    missing = sorted(set(files) - present)
    if missing:
        return f"{ckpt_dir.name}: missing file {missing[0]}"
    extra = sorted(present - set(files))
    if extra:
        return f"{ckpt_dir.name}: unexpected file {extra[0]} (not in the manifest)"
    for i, name in enumerate(sorted(files)):
        path = ckpt_dir / name
        if path.stat().st_size != files[name]["size"]:
            return f"{ckpt_dir.name}: {name} has {path.stat().st_size} bytes, " \
                   f"manifest says {files[name]['size']}"
        if i % num_shards == shard and sha256_file(path) != files[name]["sha256"]:
            return f"{ckpt_dir.name}: {name} fails its SHA-256 check"
    return None


def write_manifest(ckpt_dir: Path, *, step: int, world_size: int,
                   extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Hash every file of ``ckpt_dir`` and write its manifest atomically (call it after every
    rank's files are written and before the directory is renamed to its final name)."""
    import torch  # the manifest records the torch version that wrote the checkpoint

    files = {}
    for name in data_files(ckpt_dir):
        p = ckpt_dir / name
        files[name] = {"size": p.stat().st_size, "sha256": sha256_file(p)}
    body = {"format": FORMAT, "step": step, "world_size": world_size,
            "torch_version": torch.__version__, "created_t": time.time(), "files": files,
            **(extra or {})}
    manifest = {**body, "manifest_sha256": manifest_checksum(body)}
    write_json_atomic(ckpt_dir / MANIFEST, manifest)
    fsync_dir(ckpt_dir)
    return manifest
