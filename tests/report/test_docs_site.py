"""The documentation site as a person sees it: built with ``--strict`` (what ``make docs``
runs), served over HTTP on loopback as any static host would, then three pages opened in
headless Chromium — the home page, a guide and the generated fault reference — each with its
navigation and its content, no console error, nothing fetched from anywhere but the site
itself (no web fonts, no CDN: it reads offline). Screenshots go to ``$FAULTLAB_ARTIFACTS_DIR``
(default ``reports/artifacts/``) as ``docs-*.png``.

Without Chromium this FAILS, it does not skip (``make test`` installs Debian's package).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from headless_chromium import INSTALL_HINT, chromium_binary, open_page

from faultlab.faults import fault_types

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("FAULTLAB_ARTIFACTS_DIR", REPO / "reports" / "artifacts"))

PROBES = {
    "nav_links": "document.querySelectorAll('nav.md-nav--primary a.md-nav__link').length",
    "content": "(document.querySelector('article.md-content__inner') || {}).innerText || ''",
    "h1": "(document.querySelector('article h1') || {}).innerText || ''",
}


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The built site's base URL, served from loopback for the module's tests."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                           "-d", str(out)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-4000:]}"
    server = ThreadingHTTPServer(("127.0.0.1", 0),
                                 functools.partial(_Quiet, directory=str(out)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("page", "heading", "must_show"), [
    ("index.html", "faultlab", ["Getting started", "make demo"]),
    ("guides/slurm.html", "Slurm", ["topology", "launcher: slurm"]),
    ("reference/faults.html", "Faults", list(fault_types())),
])
def test_a_page_renders_with_navigation_and_content(site: str, tmp_path: Path, page: str,
                                                    heading: str, must_show: list[str]) -> None:
    if chromium_binary() is None:
        pytest.fail(INSTALL_HINT, pytrace=False)
    name = "docs-" + page.replace("/", "-").replace(".html", ".png")
    shot = tmp_path / name
    seen = open_page(site + page, screenshot=shot, probes=PROBES)

    assert seen.errors == [], seen.errors
    assert [url for url in seen.requests if not url.startswith((site, "data:"))] == []
    assert seen.probes["nav_links"] >= 20, "the page renders without its navigation"
    assert heading.lower() in seen.probes["h1"].lower()
    assert len(seen.probes["content"]) > 500, "the page renders (nearly) empty"
    missing = [text for text in must_show if text not in seen.probes["content"]]
    assert missing == []
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, ARTIFACTS / name)
