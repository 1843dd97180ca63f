"""Fixtures shared by every test folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def session_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This test session's temporary folder, the same for every xdist worker (each worker's
    basetemp is <session>/popen-gwN): for runs that the workers share."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def golden_cache(session_tmp: Path) -> Path:
    """faultlab's golden-run cache for this test session, shared by the xdist workers: the CLI
    tests, the suite test and the trainer's integration tests (tests/integration/conftest.py)
    compare against the same fault-free runs, so each of those runs once per session."""
    return session_tmp / "golden-cache"
