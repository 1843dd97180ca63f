"""The HTML report in a real browser: headless Chromium renders it with no console error,
requests nothing from a network, and a screenshot is kept as a test artifact.

The screenshot goes to the test's tmp dir and is copied to ``$FAULTLAB_ARTIFACTS_DIR``
(default ``reports/artifacts/``) as ``prelaunch-report.png``. Without Chromium these tests
FAIL, they do not skip: install Debian's ``chromium`` package (``.ci/run`` does).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from headless_chromium import INSTALL_HINT, chromium_binary, open_page
from synthetic import write_suite

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("FAULTLAB_ARTIFACTS_DIR", REPO / "reports" / "artifacts"))
SCREENSHOT = "prelaunch-report.png"


def require_chromium() -> None:
    if chromium_binary() is None:
        pytest.fail(INSTALL_HINT, pytrace=False)


def test_the_report_renders_without_errors(tmp_path: Path) -> None:
    require_chromium()
    folder = tmp_path / "prelaunch-20261121-120000"
    write_suite(folder, [("rank_kill", "rank_kill", True), ("ckpt_bitflip", "ckpt_bitflip", True),
                         ("rank_hang", "rank_hang", False)], not_run=("node_loss_elastic",))
    shot = tmp_path / SCREENSHOT
    page = open_page(folder / "report.html", screenshot=shot)

    assert page.errors == [], page.stderr[-2000:]
    assert page.remote_requests == []
    assert page.requests == [page.url]  # the page itself and nothing else
    assert page.title == "Pre-launch report: prelaunch (FAIL)"
    for text in ("Scorecard", "Projection to the planned run", "Recovery time, phase by phase",
                 "Checkpoint cost", "rank_kill", "ckpt_bitflip", "NOT RUN", "Environment"):
        assert text in page.text, text
    assert page.num_svgs == 7
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, ARTIFACTS / SCREENSHOT)


def test_the_checker_sees_console_errors_and_network_requests(tmp_path: Path) -> None:
    require_chromium()
    # The same client against a page that is broken on purpose: it must not pass silently.
    bad = tmp_path / "bad.html"
    bad.write_text("<!doctype html><title>bad</title><p>x</p>"
                   "<script>console.error('boom'); undefined_function();</script>"
                   "<img src='http://192.0.2.1/pixel.png'>")
    page = open_page(bad)
    assert any("console.error: boom" in e for e in page.errors)
    assert any("undefined_function" in e for e in page.errors)
    assert page.remote_requests == ["http://192.0.2.1/pixel.png"]
