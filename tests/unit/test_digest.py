"""reference_trainer.digest: per-tensor hashes and the digest of the full training state."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from fsdp_helpers import TINY_MODEL, train_step

from reference_trainer.digest import state_digest, tensor_sha256
from reference_trainer.model import GPT


def test_equal_tensors_hash_equal() -> None:
    a = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert tensor_sha256(a) == tensor_sha256(a.clone())
    # Layout does not matter, only dtype, shape and values: a transposed view of the transpose.
    b = a.t().contiguous().t()
    assert not b.is_contiguous()
    assert tensor_sha256(a) == tensor_sha256(b)
    assert tensor_sha256(a.requires_grad_()) == tensor_sha256(a.detach())
    h = tensor_sha256(a)
    assert len(h) == 64 and int(h, 16) >= 0


@pytest.mark.parametrize("other", [
    pytest.param(lambda a: a.to(torch.int32), id="dtype-same-values"),
    pytest.param(lambda a: a.view(torch.int32), id="dtype-same-bytes"),
    pytest.param(lambda a: a.reshape(4, 3), id="shape-3x4-vs-4x3"),
    pytest.param(lambda a: a.reshape(12), id="shape-flat"),
    pytest.param(lambda a: a.reshape(1, 3, 4), id="shape-extra-dim"),
    pytest.param(lambda a: a.index_put((torch.tensor(1), torch.tensor(2)), torch.tensor(7.5)),
                 id="one-value"),
    pytest.param(lambda a: a.neg().neg().where(a != 0, -0.0), id="minus-zero"),
])
def test_different_dtype_shape_or_values_hash_differently(other: Any) -> None:
    a = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert tensor_sha256(a) != tensor_sha256(other(a))


def test_hashes_dtypes_numpy_lacks() -> None:
    a = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16)
    assert tensor_sha256(a) != tensor_sha256(a.to(torch.float16))
    assert tensor_sha256(torch.tensor([True, False])) != tensor_sha256(torch.tensor([1, 0],
                                                                                   dtype=torch.uint8))
    assert tensor_sha256(torch.tensor(3.0)) != tensor_sha256(torch.tensor([3.0]))  # 0-d vs 1-d


def test_state_digest_is_stable_and_follows_the_optimizer(fsdp: Any) -> None:
    model, optimizer = fsdp()
    first = state_digest(model, optimizer, rank=0)
    assert first is not None
    assert state_digest(model, optimizer, rank=0) == first  # hashing changes nothing
    names = set(first["tensors"])
    assert {f"model.{n}" for n, _ in model.named_parameters()} <= names

    train_step(model, optimizer, seed=1)
    after = state_digest(model, optimizer, rank=0)
    assert after is not None and after["digest"] != first["digest"]
    changed = {k for k in after["tensors"] if after["tensors"][k] != first["tensors"].get(k)}
    assert "model.head.weight" in changed
    assert any(k.startswith("optim.state.") for k in after["tensors"])  # AdamW moments
    assert state_digest(model, optimizer, rank=0) == after


def test_state_digest_does_not_depend_on_the_objects(fsdp: Any) -> None:
    """Two runs with the same seed and the same steps reach the same digest."""
    a, b = fsdp(seed=0), fsdp(seed=0)
    for model, optimizer in (a, b):
        train_step(model, optimizer, seed=1)
    assert state_digest(*a, rank=0) == state_digest(*b, rank=0)
    c = fsdp(seed=1)  # another init
    train_step(*c, seed=1)
    assert state_digest(*c, rank=0)["digest"] != state_digest(*a, rank=0)["digest"]


def test_state_digest_of_sharded_and_unsharded_state_agree(fsdp: Any) -> None:
    """The state is gathered unsharded first: FSDP or not, the same weights hash the same."""
    sharded = fsdp(seed=0)
    torch.manual_seed(0)
    plain_model = GPT(TINY_MODEL)
    plain = (plain_model, torch.optim.AdamW(plain_model.parameters(), lr=1e-2,
                                            betas=(0.9, 0.95), weight_decay=0.1))
    assert state_digest(*sharded, rank=0) == state_digest(*plain, rank=0)
    for model, optimizer in (sharded, plain):
        train_step(model, optimizer, seed=4)
    assert state_digest(*sharded, rank=0) == state_digest(*plain, rank=0)


def test_only_rank_zero_gets_the_digest(fsdp: Any) -> None:
    model, optimizer = fsdp()
    assert state_digest(model, optimizer, rank=1) is None
