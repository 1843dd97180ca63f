"""The preemption watcher: polls the cloud's metadata endpoint for a spot/preemption notice.

Spot capacity is reclaimed with a short notice (AWS: 2 minutes, announced at
``/latest/meta-data/spot/instance-action``; GCE: about 30 s, ``instance/preempted``; Azure: a
``Preempt`` scheduled event, at least 30 s). A trainer that notices can commit an emergency
checkpoint and leave cleanly instead of losing everything since its last periodic save.

Each rank runs one watcher thread that polls its node's endpoint every ``poll_s`` (at most a
second). The endpoint comes from the same variables the clouds' own SDKs honour, so a fake
endpoint (``faultlab metadata serve``) is used exactly like a real one:

=========  ==========================================  ======================================
provider   variable                                    default endpoint
=========  ==========================================  ======================================
aws        ``AWS_EC2_METADATA_SERVICE_ENDPOINT``        ``http://169.254.169.254/`` (IMDSv2)
gce        ``GCE_METADATA_HOST`` (host:port)           ``metadata.google.internal``
azure      ``FAULTLAB_AZURE_METADATA_ENDPOINT``        ``http://169.254.169.254``
=========  ==========================================  ======================================

``auto`` (the default) watches the provider whose variable is set and nothing otherwise: a
laptop or CI machine never polls 169.254.169.254. Name the provider to use the default
endpoint on a real cloud. Only the standard library is used (urllib), no SDK.
"""

from __future__ import annotations

import calendar
import email.utils
import json
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PROVIDERS", "Notice", "PreemptedMidStep", "PreemptionWatcher", "install_block_checks",
           "resolve_endpoint"]

PROVIDERS = ("auto", "none", "aws", "gce", "azure", "slurm")
SLURM_SIGNALS = ("TERM", "USR1")
"""Slurm's notices: SIGTERM is what preemption (and scancel) sends every process of the job;
SIGUSR1 is what ``#SBATCH --signal=USR1@SECONDS`` sends before the time limit."""

_ENV = {"aws": "AWS_EC2_METADATA_SERVICE_ENDPOINT", "gce": "GCE_METADATA_HOST",
        "azure": "FAULTLAB_AZURE_METADATA_ENDPOINT"}
_DEFAULT = {"aws": "http://169.254.169.254/", "gce": "metadata.google.internal",
            "azure": "http://169.254.169.254"}
GCE_NOTICE_S = 30.0
"""GCE does not publish the deadline; a preempted VM gets about 30 s (documented by Google)."""
_TIMEOUT_S = 0.5
# Metadata endpoints are link-local: never through an HTTP proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True, slots=True)
class Notice:
    provider: str
    seen_t: float
    """Wall clock when this watcher first saw the notice."""
    deadline_t: float | None
    """When the cloud will terminate the node (wall clock); None if the provider did not say."""
    detail: dict[str, Any] = field(default_factory=dict)


def resolve_endpoint(provider: str, environ: Mapping[str, str]) -> tuple[str, str] | None:
    """``(provider, base URL)`` to watch, or None when there is nothing to watch."""
    if provider == "none":
        return None
    if provider == "auto":
        found = [p for p, var in _ENV.items() if environ.get(var)]
        if not found:
            return ("slurm", "signals:" + ",".join(SLURM_SIGNALS)) \
                if environ.get("SLURM_JOB_ID") else None
        provider = found[0]
    if provider == "slurm":
        return "slurm", "signals:" + ",".join(SLURM_SIGNALS)
    if provider not in _ENV:
        raise ValueError(f"unknown preemption provider {provider!r}; choose from "
                         f"{', '.join(PROVIDERS)}")
    raw = environ.get(_ENV[provider]) or _DEFAULT[provider]
    if provider == "gce" and "://" not in raw:
        raw = f"http://{raw}"  # GCE_METADATA_HOST is host[:port], as google-auth reads it
    return provider, raw.rstrip("/")


class PreemptionWatcher:
    """A daemon thread that polls for a notice and calls ``on_notice`` once when it appears."""

    def __init__(self, provider: str, base_url: str, *, poll_s: float,
                 on_notice: Callable[[Notice], None],
                 on_error: Callable[[str], None] | None = None) -> None:
        self.provider, self.base_url, self.poll_s = provider, base_url, poll_s
        self._on_notice, self._on_error = on_notice, on_error
        self._stop = threading.Event()
        self._seen = threading.Event()
        self.notice: Notice | None = None
        self.num_polls = 0
        self._token: str | None = None
        self._token_expires = 0.0
        self._event_ids: list[str] = []
        self._thread = threading.Thread(target=self._run, name="preemption-watcher", daemon=True)

    @property
    def noticed(self) -> bool:
        return self._seen.is_set()

    def start(self) -> PreemptionWatcher:
        if self.provider == "slurm":  # a signal is the notice: nothing to poll
            for name in self.base_url.removeprefix("signals:").split(","):
                signal.signal(signal.Signals[f"SIG{name}"], self._on_signal)
            return self
        self._thread.start()
        return self

    def _on_signal(self, signum: int, _frame: object) -> None:
        """Slurm's notice (main thread, between two bytecodes): record it, and report it from
        a thread of its own (the interrupted code may be writing an event itself)."""
        if self._seen.is_set():
            return
        self.notice = Notice("slurm", time.time(), None,
                             {"signal": signal.Signals(signum).name})
        self._seen.set()
        threading.Thread(target=self._on_notice, args=(self.notice,), daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def acknowledge(self) -> None:
        """Tell the cloud the node is ready to go (Azure ``StartRequests``; others: nothing)."""
        if self.provider != "azure" or not self._event_ids:
            return
        body = json.dumps({"StartRequests": [{"EventId": i} for i in self._event_ids]}).encode()
        try:
            self._request("POST", "/metadata/scheduledevents?api-version=2020-07-01",
                          {"Metadata": "true", "Content-Type": "application/json"}, body)
        except (OSError, urllib.error.URLError):
            pass  # the node goes at NotBefore anyway

    # -- the thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                notice = self.poll_once()
                failures = 0
            except (OSError, urllib.error.URLError, ValueError) as e:
                failures += 1
                notice = None
                if failures == 3 and self._on_error is not None:
                    # Once per streak: a watcher that silently never sees anything is worse.
                    self._on_error(f"{self.provider} metadata at {self.base_url}: {e}")
            if notice is not None:
                self.notice = notice
                self._seen.set()
                self._on_notice(notice)
                return
            self._stop.wait(max(0.0, self.poll_s - (time.monotonic() - t0)))

    def poll_once(self) -> Notice | None:
        self.num_polls += 1
        return {"aws": self._poll_aws, "gce": self._poll_gce, "azure": self._poll_azure}[
            self.provider]()

    def _poll_aws(self) -> Notice | None:
        if self._token is None or time.monotonic() > self._token_expires:
            self._token = self._request("PUT", "/latest/api/token",
                                        {"X-aws-ec2-metadata-token-ttl-seconds": "21600"})[1]
            self._token_expires = time.monotonic() + 21000
        status, body = self._request("GET", "/latest/meta-data/spot/instance-action",
                                     {"X-aws-ec2-metadata-token": self._token}, ok=(200, 404, 401))
        if status == 401:  # the token expired early (IMDS restarted): get a new one next time
            self._token = None
            return None
        if status == 404:
            return None
        doc = json.loads(body)
        deadline = calendar.timegm(time.strptime(doc["time"], "%Y-%m-%dT%H:%M:%SZ"))
        return Notice("aws", time.time(), float(deadline), {"action": doc.get("action")})

    def _poll_gce(self) -> Notice | None:
        _s, body = self._request("GET", "/computeMetadata/v1/instance/preempted",
                                 {"Metadata-Flavor": "Google"})
        if body.strip().upper() != "TRUE":
            return None
        now = time.time()
        return Notice("gce", now, now + GCE_NOTICE_S, {"deadline_assumed_s": GCE_NOTICE_S})

    def _poll_azure(self) -> Notice | None:
        _s, body = self._request("GET", "/metadata/scheduledevents?api-version=2020-07-01",
                                 {"Metadata": "true"})
        events = [e for e in json.loads(body).get("Events", []) if e.get("EventType") == "Preempt"]
        if not events:
            return None
        self._event_ids = [str(e["EventId"]) for e in events]
        deadlines = [email.utils.parsedate_to_datetime(e["NotBefore"]).timestamp()
                     for e in events if e.get("NotBefore")]
        return Notice("azure", time.time(), min(deadlines) if deadlines else None,
                      {"event_ids": self._event_ids})

    def _request(self, method: str, path: str, headers: dict[str, str], body: bytes | None = None,
                 ok: tuple[int, ...] = (200,)) -> tuple[int, str]:
        req = urllib.request.Request(self.base_url + path, data=body, method=method,
                                     headers=headers)
        try:
            with _OPENER.open(req, timeout=_TIMEOUT_S) as resp:
                status, text = resp.status, resp.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode(errors="replace")
        if status not in ok:
            raise ValueError(f"{method} {path}: HTTP {status} {text[:200]!r}")
        return status, text


class PreemptedMidStep(Exception):
    """Raised by a block-boundary check: every rank agreed a notice is in; abandon the step."""


def install_block_checks(blocks: Any, watcher: PreemptionWatcher, device: Any) -> list[Any]:
    """Check for a notice at every block boundary, forward and backward, not just per step.

    A check is a one-element all-reduce of "has my node seen a notice", so every rank takes the
    same decision at the same block and raises ``PreemptedMidStep`` there together. Without it
    a notice waits for the next step boundary: half a step on average (1.5 s for ``small`` on
    2 CPU cores), more than the rest of the emergency save. Forward: a pre-hook on each block.
    Backward: a hook on each block's output gradient, which autograd calls just before that
    block's backward. The step's parameters and optimizer state are untouched until the
    optimizer step, so the caller reshards the FSDP modules and saves the previous step.
    Costs ``2 x len(blocks)`` tiny all-reduces per step, only while watching. Returns the hook
    handles."""
    import torch
    import torch.distributed as dist

    def check() -> None:
        flag = torch.tensor([1.0 if watcher.noticed else 0.0], device=device)
        dist.all_reduce(flag)
        if flag.item() > 0:
            raise PreemptedMidStep()

    def on_output(_module: Any, _args: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda grad: check())

    handles = []
    for block in blocks:
        handles.append(block.register_forward_pre_hook(lambda _m, _a: check()))
        handles.append(block.register_forward_hook(on_output))
    return handles
