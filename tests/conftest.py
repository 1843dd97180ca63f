"""Fixtures shared by every test folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def golden_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """faultlab's golden-run cache for this test session, shared by the xdist workers: the CLI
    tests, the suite test and the trainer's integration tests (tests/integration/conftest.py)
    compare against the same fault-free runs, so each of those runs once per session."""
    base = tmp_path_factory.getbasetemp()
    # Under xdist each worker's basetemp is <session>/popen-gwN: share the session's folder.
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "golden-cache"
