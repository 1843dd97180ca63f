"""The suite's own plugin (tests/resources.py): a failure the machine caused says which resource
it lacked in its first line, at the session's start and in a failed test's report; a failure
the code caused is left as it is. Run through ``pytester`` in subprocesses, the plugin loaded
with ``-p`` as the suite's conftest loads it; a disk "fills" by raising the free space the
plugin asks for (``FAULTLAB_TEST_MIN_FREE_GIB``) above what the machine has."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

TESTS = str(Path(__file__).resolve().parents[1])

FAILS_ON_ENOSPC = """
import errno, os

def test_writes_a_checkpoint():
    if os.environ.get("FILL_DISK_NOW"):
        os.environ["FAULTLAB_TEST_MIN_FREE_GIB"] = "1e12"  # the disk is full from here on
    raise OSError(errno.ENOSPC, "No space left on device", "step_20/__0_0.distcp")
"""


def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, **env: str
        ) -> pytest.RunResult:
    monkeypatch.setenv("PYTHONPATH", TESTS)
    monkeypatch.delenv("FAULTLAB_REQUIRE_DOCKER", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    pytester.makepyfile(test_save=FAILS_ON_ENOSPC)
    return pytester.runpytest_subprocess("-p", "resources", "-p", "no:cacheprovider")


def test_a_full_disk_at_the_start_stops_the_run_before_any_test(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result = run(pytester, monkeypatch, FAULTLAB_TEST_MIN_FREE_GIB="1e12")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stdout.fnmatch_lines(["*resource: disk full: * GiB free, the suite needs 1e+12 GiB*"])
    result.stdout.no_fnmatch_line("*test_writes_a_checkpoint*")


def test_a_disk_that_filled_during_a_test_is_named_first_in_its_failure(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result = run(pytester, monkeypatch, FILL_DISK_NOW="1")
    result.assert_outcomes(failed=1)
    out = result.stdout.lines
    first = out[out.index(next(line for line in out if "test_writes_a_checkpoint __" in line)) + 1]
    assert first.startswith("resource: disk full: ") and "GiB free" in first, out


def test_enospc_with_room_on_the_disk_is_the_codes_failure(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result = run(pytester, monkeypatch)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*No space left on device*"])
    result.stdout.no_fnmatch_line("*resource:*")
