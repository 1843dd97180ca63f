"""After a run: read back every checkpoint the job left and look for non-finite values.

A NaN that slipped past the trainer's checks is worst when it is *saved*: every later resume
starts from poisoned state. ``scan_checkpoints`` reads each committed ``step_*`` checkpoint
(DCP, read whole without a process group by ``faultlab.runtime.dcp.read_checkpoint``) and
checks every floating-point tensor and float of the model and optimizer state. A checkpoint is
read only after its manifest verified (the same check the trainer makes), and DCP's pickled
metadata only through the allow-listed unpickler; one that does not verify, or cannot be read,
is listed as not read. Experiments that assert ``checkpoints_all_finite`` keep
every checkpoint (``keep_checkpoints``), so "every checkpoint" means every one ever saved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CheckpointScan", "scan_checkpoints"]


@dataclass
class CheckpointScan:
    checked: list[str] = field(default_factory=list)
    nonfinite: dict[str, list[str]] = field(default_factory=dict)
    """Checkpoint path → the state keys holding a NaN or an infinity (first 20)."""
    not_read: dict[str, str] = field(default_factory=dict)
    """Checkpoint path → why it was not read (its manifest did not verify)."""

    @property
    def all_finite(self) -> bool | None:
        """None if no checkpoint could be read; else True iff none holds a non-finite value."""
        return None if not self.checked else not self.nonfinite

    def to_dict(self) -> dict[str, Any]:
        return {"checked": self.checked, "nonfinite": self.nonfinite, "not_read": self.not_read,
                "all_finite": self.all_finite}


def scan_checkpoints(root: Path) -> CheckpointScan:
    import torch

    from faultlab.runtime.dcp import read_checkpoint
    from faultlab.runtime.manifest import list_checkpoints, verify_checkpoint

    scan = CheckpointScan()
    for _step, path in sorted(list_checkpoints(root)):
        reason = verify_checkpoint(path)
        if reason is not None:
            scan.not_read[str(path)] = reason
            continue
        try:
            state = read_checkpoint(path)
        except ValueError as e:
            scan.not_read[str(path)] = str(e)
            continue
        bad: list[str] = []
        _walk(state, "", bad, torch)
        scan.checked.append(str(path))
        if bad:
            scan.nonfinite[str(path)] = bad[:20]
    return scan


def _walk(obj: Any, key: str, bad: list[str], torch: Any) -> None:
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() and not bool(torch.isfinite(obj).all()):
            bad.append(key)
    elif isinstance(obj, float):
        if not math.isfinite(obj):
            bad.append(key)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _walk(v, f"{key}.{k}" if key else str(k), bad, torch)
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            _walk(v, f"{key}[{i}]", bad, torch)
