"""The final state of a job read back from its last checkpoint, for jobs that write no digest.

A trainer at integration level 2 (the reference trainer) emits ``final_digest`` itself: the
SHA-256 of every tensor of its full model and optimizer state. A trainer at level 0 or 1 does
not, so faultlab reads the job's *final checkpoint* back after the run — the newest one its
``checkpoint_saved`` records name (the runtime agent sees every DCP or ``torch.save`` save) —
without a process group, as whole logical tensors (``faultlab.runtime.dcp``), and hashes it
tensor by tensor. The result does not depend on the world size that wrote it.

A checkpoint counts as final only if it was saved at or after the job's last step; otherwise
the bitwise verdict is *not measured*, with the reason, never guessed.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["FinalState", "WeightsGap", "final_checkpoint_path", "final_checkpoint_state",
           "first_difference", "weights_distance", "weights_gap"]

NO_FINAL_CHECKPOINT = ("the job saved no final checkpoint; add a save at the end or use level 1 "
                       "(faultlab.runtime.attach)")


@dataclass(slots=True)
class FinalState:
    """The digest of a job's final checkpoint, or why there is none."""

    digest: str | None = None
    """SHA-256 over every tensor's name and hash (None: not measured)."""
    path: str | None = None
    """The checkpoint read back."""
    step: int | None = None
    tensors: dict[str, str] = field(default_factory=dict)
    """Tensor name → SHA-256 of its dtype, shape and bytes."""
    not_measured: str | None = None
    """Why there is no digest."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _relative(obj: Any, prefixes: tuple[str, ...]) -> Any:
    """``obj`` with every string (value or key) that starts with one of ``prefixes`` rewritten
    to start with ``{run_dir}``; the tensors themselves are left alone."""
    if isinstance(obj, str):
        for prefix in prefixes:
            if obj == prefix or obj.startswith(prefix + "/"):
                return "{run_dir}" + obj[len(prefix):]
        return obj
    if isinstance(obj, dict):
        return {_relative(k, prefixes): _relative(v, prefixes) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_relative(v, prefixes) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_relative(v, prefixes) for v in obj)
    return obj


def final_checkpoint_state(events: Iterable[Mapping[str, Any]],
                           run_dir: Path | None = None) -> FinalState:
    """Read back the newest checkpoint the job reported and hash it (see the module doc).

    With ``run_dir``, paths the checkpoint holds under the job's run directory (a framework's
    callback state: Lightning's ``ModelCheckpoint.dirpath``, ``last_model_path``) are hashed
    relative to it, so two runs in two run directories compare by what they trained, not by
    where they ran."""
    from faultlab.runtime.dcp import read_checkpoint, state_digests

    records = [e for e in events if isinstance(e.get("t"), int | float)]
    last_step = max((s for e in records if e.get("kind") == "step"
                     and (s := _int(e.get("step"))) is not None), default=None)
    saves = [e for e in records if e.get("kind") == "checkpoint_saved"
             and isinstance(e.get("path"), str)]
    if not saves:
        return FinalState(not_measured=NO_FINAL_CHECKPOINT)
    newest = max(saves, key=lambda e: (_int(e.get("step")) or -1, float(e["t"])))
    step = _int(newest.get("step"))
    if last_step is not None and step is not None and step < last_step:
        return FinalState(path=newest["path"], step=step,
                          not_measured=f"{NO_FINAL_CHECKPOINT} (its last checkpoint is of "
                                       f"step {step}, its last step {last_step})")
    path = Path(newest["path"])
    try:
        state = read_checkpoint(path)
        if run_dir is not None:
            state = _relative(state, tuple(dict.fromkeys(
                [os.path.abspath(run_dir), os.path.realpath(run_dir)])))
        tensors = state_digests(state)
    except ValueError as e:
        return FinalState(path=str(path), step=step, not_measured=str(e))
    overall = hashlib.sha256("".join(f"{k}={v}\n" for k, v in tensors.items()).encode())
    return FinalState(digest=overall.hexdigest(), path=str(path), step=step, tensors=tensors)


def first_difference(ours: Mapping[str, str], golden: Mapping[str, str]) -> str | None:
    """The first tensor (in name order) whose hash differs, or that only one side has; None if
    the two are equal."""
    for name in sorted(set(ours) | set(golden)):
        if name not in golden:
            return f"{name} (not in the golden run's checkpoint)"
        if name not in ours:
            return f"{name} (missing from this run's checkpoint)"
        if ours[name] != golden[name]:
            return name
    return None


def final_checkpoint_path(events: Iterable[Mapping[str, Any]]) -> str | None:
    """The newest checkpoint the job reported saving (``checkpoint_saved``), or None."""
    saves = [e for e in events if e.get("kind") == "checkpoint_saved"
             and isinstance(e.get("path"), str) and isinstance(e.get("t"), int | float)]
    if not saves:
        return None
    return str(max(saves, key=lambda e: (_int(e.get("step")) or -1, float(e["t"])))["path"])


@dataclass(frozen=True, slots=True)
class WeightsGap:
    """How far one final checkpoint's weights are from a reference checkpoint's
    (:func:`weights_gap`)."""

    distance: float | None = None
    """``||ours - reference|| / ||reference||`` over every floating-point tensor of the
    reference (None: not measured, or ``problem``)."""
    problem: str = ""
    """Why ours cannot match the reference, the tensor named: one of the reference's is
    missing from ours or of another shape, or one of ours holds NaN or Inf ('' if none)."""
    not_measured: str = ""
    """Why there is no distance and no problem: a checkpoint missing or unreadable, or the
    reference's own weights not finite ('' if measured)."""


def weights_gap(ours: str | None, reference: str | None, *,
                ref: str = "the reference") -> WeightsGap:
    """``ours`` against ``reference`` (called ``ref`` in the texts), every floating-point
    tensor of the reference read whole (without a process group). A tensor the reference has
    and ours lacks, or holds in another shape, and a NaN or Inf in ours are each a
    ``problem`` ("lacks tensor w, which the reference holds"): never skipped, never a distance
    that hides them. Tensors only ours holds are not compared."""
    if not reference:
        return WeightsGap(not_measured=f"{ref} is missing")
    if not ours:
        return WeightsGap(not_measured="there is no final checkpoint")
    import torch

    from faultlab.runtime.dcp import read_checkpoint

    read: list[dict[str, Any]] = []
    for which, path in ((ref, reference), ("the final checkpoint", ours)):
        try:
            read.append(_tensors(read_checkpoint(Path(path))))
        except (ValueError, OSError) as e:
            return WeightsGap(not_measured=f"{which} ({path}) cannot be read: {e}")
    b, a = read
    bad_ref = next((n for n in sorted(b) if not bool(torch.isfinite(b[n]).all())), None)
    if bad_ref is not None:
        return WeightsGap(not_measured=f"{ref} holds NaN or Inf in tensor {bad_ref}")
    num = den = 0.0
    for name in sorted(b):
        if name not in a:
            return WeightsGap(problem=f"lacks tensor {name}, which {ref} holds")
        x, y = a[name], b[name]
        if x.shape != y.shape:
            return WeightsGap(problem=f"holds tensor {name} in shape {tuple(x.shape)}, "
                                      f"{ref} in {tuple(y.shape)}")
        if not bool(torch.isfinite(x).all()):
            return WeightsGap(problem=f"holds {'NaN' if bool(torch.isnan(x).any()) else 'Inf'}"
                                      f" in tensor {name}")
        num += float(torch.sum((x.double() - y.double()) ** 2))
        den += float(torch.sum(y.double() ** 2))
    if not den > 0:
        return WeightsGap(not_measured=f"{ref} holds no nonzero floating-point tensor")
    return WeightsGap(distance=math.sqrt(num / den))


def weights_distance(ours: str | None, reference: str | None) -> float | None:
    """``weights_gap(ours, reference).distance``: None if either is unreadable, or they do
    not hold the same tensors in the same shapes, or ours is not finite."""
    return weights_gap(ours, reference).distance


def _tensors(state: Any, prefix: str = "") -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {}
    if isinstance(state, torch.Tensor):
        if state.is_floating_point():
            out[prefix] = state.detach().cpu()
    elif isinstance(state, Mapping):
        for k, v in state.items():
            out.update(_tensors(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(state, list | tuple):
        for i, v in enumerate(state):
            out.update(_tensors(v, f"{prefix}.{i}"))
    return out
