"""Open a page in headless Chromium and collect what a person would see go wrong.

A minimal client of the Chrome DevTools Protocol over ``--remote-debugging-pipe`` (stdlib only:
the browser reads NUL-terminated JSON commands on fd 3 and writes its replies and events on
fd 4). It loads one file, records console errors, uncaught exceptions, browser log errors and
every network request the page made, and takes a full-page screenshot.

    page = open_page(Path("report.html"), screenshot=Path("report.png"))
    assert page.errors == [] and page.remote_requests == []
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["BrowserPage", "chromium_binary", "open_page"]

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
INSTALL_HINT = ("headless Chromium is needed for the browser test: install Debian's `chromium` "
                "package (apt-get install -y --no-install-recommends chromium); .ci/run does")


def chromium_binary() -> str | None:
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class BrowserPage:
    url: str
    errors: list[str] = field(default_factory=list)
    """Console errors, uncaught exceptions and browser log entries of level error."""
    requests: list[str] = field(default_factory=list)
    """Every URL the page requested, the page itself included."""
    title: str = ""
    text: str = ""
    """``document.body.innerText`` once loaded."""
    num_svgs: int = 0
    probes: dict[str, Any] = field(default_factory=dict)
    """The value of each expression of ``open_page(probes=...)``, by name, once loaded."""
    stderr: str = ""

    @property
    def remote_requests(self) -> list[str]:
        """Requests that would need a network (anything but file:, data: and about:)."""
        return [u for u in self.requests if not u.startswith(("file:", "data:", "about:"))]


class _Pipe:
    def __init__(self, proc: subprocess.Popen[bytes], to_browser: int, from_browser: int,
                 timeout_s: float) -> None:
        self.proc, self.out, self.inp = proc, to_browser, from_browser
        self.deadline = time.monotonic() + timeout_s
        self.next_id = 0
        self.buffer = b""
        self.events: list[dict[str, Any]] = []

    def _read_message(self) -> dict[str, Any]:
        while b"\0" not in self.buffer:
            if time.monotonic() > self.deadline:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self.inp, 1 << 16)
            if not chunk:
                raise RuntimeError(f"Chromium closed the pipe (exit code {self.proc.poll()})")
            self.buffer += chunk
        raw, self.buffer = self.buffer.split(b"\0", 1)
        message: dict[str, Any] = json.loads(raw)
        return message

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        command: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session:
            command["sessionId"] = session
        os.write(self.out, json.dumps(command).encode() + b"\0")
        while True:
            message = self._read_message()
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            self.events.append(message)

    def wait_for(self, method: str) -> dict[str, Any]:
        for event in self.events:
            if event.get("method") == method:
                return event
        while True:
            message = self._read_message()
            self.events.append(message)
            if message.get("method") == method:
                return message


def _as_fds_3_and_4(commands: int, replies: int) -> None:
    """In the child: put the pipes on fds 3 and 4 (first out of the way, in case either
    already is 3 or 4)."""
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (commands, replies)]
    os.dup2(high[0], 3)
    os.dup2(high[1], 4)


def open_page(path: Path | str, *, screenshot: Path | None = None, width: int = 1280,
              timeout_s: float = 60.0, probes: dict[str, str] | None = None) -> BrowserPage:
    """Load ``path`` (a file, or a URL given as a string) in headless Chromium; raise
    FileNotFoundError if there is no Chromium. ``probes``: JavaScript expressions to evaluate
    once the page loaded (``page.probes``)."""
    binary = chromium_binary()
    if binary is None:
        raise FileNotFoundError(INSTALL_HINT)
    url = path if isinstance(path, str) else path.resolve().as_uri()
    page = BrowserPage(url)
    with tempfile.TemporaryDirectory(prefix="faultlab-chromium-") as profile:
        to_browser_r, to_browser_w = os.pipe()
        from_browser_r, from_browser_w = os.pipe()
        # The browser expects its command pipe on fd 3 and its reply pipe on fd 4.
        proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--mute-audio",
             "--remote-debugging-pipe", f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            pass_fds=(3, 4), preexec_fn=lambda: _as_fds_3_and_4(to_browser_r, from_browser_w))
        os.close(to_browser_r)
        os.close(from_browser_w)
        pipe = _Pipe(proc, to_browser_w, from_browser_r, timeout_s)
        try:
            _drive(pipe, page, url, screenshot, width, probes or {})
        finally:
            try:
                pipe.call("Browser.close")
            except (OSError, RuntimeError, TimeoutError):
                pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            os.close(to_browser_w)
            os.close(from_browser_r)
            page.stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    return page


def _drive(pipe: _Pipe, page: BrowserPage, url: str, screenshot: Path | None,
           width: int, probes: dict[str, str]) -> None:
    target = pipe.call("Target.createTarget", url="about:blank")["targetId"]
    session = pipe.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
    for domain in ("Page", "Runtime", "Log", "Network"):
        pipe.call(f"{domain}.enable", session)
    pipe.call("Emulation.setDeviceMetricsOverride", session, width=width, height=900,
              deviceScaleFactor=1, mobile=False)
    pipe.call("Page.navigate", session, url=url)
    pipe.wait_for("Page.loadEventFired")

    def evaluate(expression: str) -> Any:
        return pipe.call("Runtime.evaluate", session, expression=expression,
                         returnByValue=True)["result"].get("value")

    page.title = evaluate("document.title") or ""
    page.text = evaluate("document.body ? document.body.innerText : ''") or ""
    page.num_svgs = int(evaluate("document.querySelectorAll('svg').length") or 0)
    page.probes = {name: evaluate(expression) for name, expression in probes.items()}
    if screenshot is not None:
        height = int(evaluate("Math.ceil(document.documentElement.scrollHeight)") or 900)
        pipe.call("Emulation.setDeviceMetricsOverride", session, width=width,
                  height=min(max(height, 300), 16000), deviceScaleFactor=1, mobile=False)
        shot = pipe.call("Page.captureScreenshot", session, format="png")
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
    for event in pipe.events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = [a.get("value", a.get("description", "")) for a in params.get("args", [])]
            page.errors.append("console." + params["type"] + ": " + " ".join(map(str, args)))
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            text = details.get("exception", {}).get("description") or details.get("text")
            page.errors.append(f"uncaught exception: {text}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            page.errors.append(f"browser log ({entry.get('source')}): {entry.get('text')} "
                               f"{entry.get('url', '')}".rstrip())
        elif method == "Network.requestWillBeSent":
            page.requests.append(params.get("request", {}).get("url", ""))
