"""Shared fixtures of the unit tests: a one-rank CPU process group and tiny FSDP2 models.

The process group lives in this process (gloo over an in-memory ``HashStore``: no port, so
pytest-xdist workers cannot collide) and is shared by every test of the session that needs
one: checkpointing and the state digest are collectives, even on one rank.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
import torch.distributed as dist
from fsdp_helpers import build_fsdp
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


@pytest.fixture(scope="session")
def mesh() -> Iterator[DeviceMesh]:
    """A one-rank gloo process group and its CPU device mesh (destroyed at the end)."""
    assert not dist.is_initialized(), "another test left a process group behind"
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


@pytest.fixture
def fsdp(mesh: DeviceMesh) -> Callable[..., tuple[torch.nn.Module, torch.optim.Optimizer]]:
    """Factory of tiny FSDP2 models with their AdamW optimizer."""
    return lambda **kw: build_fsdp(mesh, **kw)
