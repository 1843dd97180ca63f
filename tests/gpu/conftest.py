"""The tests/gpu suite needs a CUDA GPU: without one every test here is skipped, saying why.
Run it where there is one: ``python -m pytest tests/gpu -v`` (not run yet: no GPU was lent to the
session that wrote it, so its run time is unmeasured)."""

from __future__ import annotations

import pytest

REASON = ("tests/gpu needs a CUDA GPU (torch.cuda.is_available() is False here): the real "
          "CUDA mechanisms of the gpu faults (poisoned context, memory hog, spin kernel, the "
          "NVML overlay on a real device) and the NCCL runs cannot be exercised on CPU")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.skip(reason=REASON))
