"""The tests/gpu suite needs a CUDA GPU: without one every test here is skipped, saying why.
Run it where there is one: ``python -m pytest tests/gpu -v``.

What ran (docs/guides/running-on-gpu.md): on one H200 (torch 2.11.0+cu130, NCCL 2.28.9, Python
3.12), faultlab 5b55671, 2026-11-28: 8 passed, 1 failed, in 261 s. The failure was the spin-kernel
test's own stale import (``faultlab.runtime.gpu._spin``, moved to ``faultlab.runtime.actions.gpu``);
fixed, and rerun there with the other mechanism tests: 4 passed. ``rank_kill`` at world size 1,
which failed on an H100 on 2026-11-26 (detection 8.46 s from the restarted rank's own record),
passed with detection 0.53 s from the launcher creating the new worker (``launcher_respawn``)."""

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
