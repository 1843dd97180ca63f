"""What the tests of the local Slurm test cluster share."""

from __future__ import annotations

import os

import pytest

from faultlab.testing import require_docker_engine


@pytest.fixture(scope="session")
def slurm_host() -> None:
    """Skip (fail under ``FAULTLAB_REQUIRE_DOCKER=1``, as in CI) unless this host can run the
    local Slurm test cluster: a Docker engine and root."""
    require_docker_engine()
    if os.geteuid() != 0:
        if os.environ.get("FAULTLAB_REQUIRE_DOCKER") == "1":
            pytest.fail("FAULTLAB_REQUIRE_DOCKER=1 but the Slurm test cluster needs root",
                        pytrace=False)
        pytest.skip("the Slurm test cluster needs root (daemons, munge key, containers)")
