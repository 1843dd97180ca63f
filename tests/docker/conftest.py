"""Tests of the docker target need a Docker engine: they skip with the reason where none can
be reached, and fail instead where ``FAULTLAB_REQUIRE_DOCKER=1`` (``make test`` sets it in CI,
after installing and starting the engine)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from faultlab.targets.docker.engine import connect, engine_problem


@pytest.fixture(scope="session")
def docker_client() -> Any:
    problem = engine_problem()
    if problem is not None:
        if os.environ.get("FAULTLAB_REQUIRE_DOCKER") == "1":
            pytest.fail(f"FAULTLAB_REQUIRE_DOCKER=1 but {problem}")
        pytest.skip(f"no Docker engine: {problem}")
    return connect()
