"""Tests of the docker target need a Docker engine: they skip with the reason where none can
be reached, and fail instead where ``FAULTLAB_REQUIRE_DOCKER=1`` (``make test`` sets it in CI,
after installing and starting the engine)."""

from __future__ import annotations

from typing import Any

import pytest

from faultlab.targets.docker.engine import connect
from faultlab.testing import require_docker_engine


@pytest.fixture(scope="session")
def docker_client() -> Any:
    require_docker_engine()
    return connect()
