"""``final_digest``: per-tensor SHA-256 of the full, unsharded model and optimizer state.

The state is gathered unsharded (``full_state_dict``) before hashing, so the digest does not
depend on how many ranks held the shards: two runs that reach the same weights and optimizer
moments at different world sizes hash the same.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

from faultlab.runtime.dcp import flatten_state, tensor_sha256

__all__ = ["state_digest", "tensor_sha256"]


def state_digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 rank: int) -> dict[str, Any] | None:
    """Collective: every rank must call it. Rank 0 gets ``{"digest", "tensors"}``, others None."""
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=opts)
    if rank != 0:
        return None
    flat: dict[str, Any] = {}
    flatten_state("model", model_sd, flat)
    flatten_state("optim", optim_sd, flat)
    tensors: dict[str, str] = {}
    for name, value in flat.items():
        if isinstance(value, torch.Tensor):
            tensors[name] = tensor_sha256(value)
        else:  # hyper-parameters in param_groups: lr, betas, weight_decay, ...
            tensors[name] = hashlib.sha256(json.dumps(value).encode()).hexdigest()
    overall = hashlib.sha256("".join(f"{k}={v}\n" for k, v in tensors.items()).encode())
    return {"digest": overall.hexdigest(), "tensors": tensors}
