"""The package's public names are exactly its ``__all__``, and each resolves."""

from __future__ import annotations

import subprocess
import sys

import faultlab


def test_every_name_in_all_resolves() -> None:
    for name in faultlab.__all__:
        assert getattr(faultlab, name) is not None, name
    assert sorted(dir(faultlab)) == sorted(faultlab.__all__)


def test_importing_faultlab_does_not_import_torch() -> None:
    # `faultlab validate` must stay fast: torch is imported only when a run needs it.
    code = "import sys, faultlab, faultlab.spec, faultlab.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"
