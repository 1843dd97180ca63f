"""A team's package as pip would install it, for the plugin tests: a module and its
``.dist-info`` with ``entry_points.txt`` in a temporary site directory, and faultlab run in a
subprocess with that directory on its path (entry points are read once per process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def team_package(site: Path, module: str, source: str, group: str, entries: str) -> Path:
    """Write ``module.py`` and its distribution's metadata registering ``entries`` (lines
    ``name = module:object``) under ``group`` into ``site``; returns ``site``."""
    (site / f"{module}.py").write_text(source)
    info = site / f"{module}-0.1.dist-info"
    info.mkdir()
    name = module.replace("_", "-")
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{entries}\n")
    return site


def run_with(site: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in ``site`` with the team's package importable."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(site), os.environ.get("PYTHONPATH")])), "COLUMNS": "200"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          check=check, cwd=site, timeout=120)
