"""Numeric faults inside a rank: non-finite gradients, loss spikes, flipped weight bits.

The rank-side actions (``faultlab.runtime.hooks``) of ``faultlab.faults.numeric``.

``grad_nan`` / ``grad_inf``
    The **whole local gradient shard** of each chosen parameter is filled with NaN (or +Inf).
    The mechanism is a post-accumulate-grad hook on the *sharded* parameter: FSDP2 (torch 2.13,
    ``_fsdp_collectives.foreach_reduce``) calls ``param._post_accumulate_grad_hooks`` itself,
    right after the reduce-scatter has produced the local gradient shard, still inside
    ``backward()``; for a plain module (or DDP) autograd calls the same hooks after
    accumulation. Either way the corruption lands before the trainer computes the gradient norm
    or steps the optimizer, and on the victim rank only — the non-finite value reaches the other
    ranks only through the trainer's own collectives (the norm), as a real one would.
    Hooks are registered only on the chosen parameters of an armed step (``grads_to_watch``)
    and removed at the next ``Agent.step``: with nothing armed, backward pays nothing.
``loss_spike``
    ``on_loss``: ``Agent.loss(loss)`` returns ``loss * scale`` on the victim ranks at the armed
    step.
``weight_bitflip``
    ``on_step_start``: flips bits of the local shard (``DTensor._local_tensor``) in memory through a
    byte view: silent data corruption. Every flip is reported: parameter, flat element index in
    the local shard, bit index within the element (0 = least significant), old and new value.

Parameters are chosen with ``random.Random(f"{seed}/{fault id}")`` among those whose name
matches ``param_glob`` (fnmatch on the FQN) and whose local shard is not empty on this rank, in
name order: the same plan makes the same choice again.
"""

from __future__ import annotations

import fnmatch
import math
import random
from typing import Any, ClassVar

import torch

from faultlab.errors import NoParameterError
from faultlab.runtime.hooks import RankAction

__all__ = ["GradCorruption", "GradInf", "GradNan", "LossSpike", "NoParameterError",
           "WeightBitflip", "choose_params", "flip_bits", "local_shard"]



def local_shard(t: torch.Tensor) -> torch.Tensor:
    """The rank-local tensor behind a DTensor (FSDP2), or the tensor itself."""
    local = getattr(t, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else t


def choose_params(model: torch.nn.Module, glob: str, fraction: float,
                  rng: random.Random) -> list[tuple[str, torch.nn.Parameter]]:
    named = [(n, p) for n, p in sorted(model.named_parameters(), key=lambda x: x[0])
             if fnmatch.fnmatchcase(n, glob) and local_shard(p).numel() > 0]
    if not named:
        sample = ", ".join(n for n, _ in list(model.named_parameters())[:8])
        raise NoParameterError(f"param_glob {glob!r} matches no parameter with a non-empty "
                               f"local shard on this rank (parameters: {sample}, ...)")
    k = max(1, min(len(named), round(fraction * len(named))))
    chosen = sorted(rng.sample(range(len(named)), k))
    return [named[i] for i in chosen]


class GradCorruption(RankAction):
    """Fill the whole local gradient shard of the chosen parameters with ``value``, as soon as
    it is final in the armed step's backward."""

    needs_model = True
    value: ClassVar[float]

    def grads_to_watch(self) -> list[tuple[str, Any]]:
        p = self.params
        self.chosen = choose_params(self.rank.model, p["param_glob"], p["fraction"],
                                    random.Random(f"{p['seed']}/{self.entry.id}"))
        return self.chosen

    def on_grads_ready(self, name: str, param: Any) -> None:
        if param.grad is None or self.released.is_set():
            return
        with torch.no_grad():
            local_shard(param.grad).fill_(self.value)
        self.rank.struck(params=[n for n, _ in self.chosen], value=str(self.value),
                         what="whole local gradient shard")


class GradNan(GradCorruption):
    """``grad_nan``."""

    value = math.nan


class GradInf(GradCorruption):
    """``grad_inf``."""

    value = math.inf


class LossSpike(RankAction):
    """``loss_spike``: the loss times ``scale`` for the armed step."""

    def on_loss(self, loss: Any) -> Any:
        if self.released.is_set():
            return loss
        self.rank.struck(scale=self.params["scale"])
        return loss * self.params["scale"]


class WeightBitflip(RankAction):
    """``weight_bitflip``: seeded bits of the local weight shards, at step start."""

    needs_model = True

    def on_step_start(self, step: int) -> None:
        self.rank.struck(flips=flip_bits(self.rank.model, self.params, self.entry.id,
                                         self.rank.rank, step))


def flip_bits(model: torch.nn.Module, p: dict[str, Any], fault_id: str, rank: int,
              step: int) -> list[dict[str, Any]]:
    """Flip ``num_bits`` seeded bits in the local shards of parameters matching the glob."""
    rng = random.Random(f"{p['seed']}/{fault_id}/{rank}/{step}")
    candidates = choose_params(model, p["param_glob"], 1.0, rng)
    flips = []
    with torch.no_grad():
        for _ in range(p["num_bits"]):
            name, param = rng.choice(candidates)
            local = local_shard(param.data)
            bits = local.element_size() * 8
            index = rng.randrange(local.numel())
            bit = p.get("bit_index")
            bit = bit if bit is not None else rng.randrange(bits)
            if bit >= bits:
                raise NoParameterError(f"bit_index {bit} is outside the {bits}-bit elements "
                                       f"of {name} ({local.dtype})")
            flat = local.view(-1)  # FSDP2 local shards are contiguous; view() fails otherwise
            old = flat[index].item()
            as_bytes = flat.view(torch.uint8)
            byte = index * local.element_size() + bit // 8  # little-endian element layout
            as_bytes[byte] ^= 1 << (bit % 8)
            flips.append({"param": name, "index": index, "bit": bit, "dtype": str(local.dtype),
                          "old": _json_num(old), "new": _json_num(flat[index].item())})
    return flips


def _json_num(x: float | int | bool) -> float | int | str:
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x
