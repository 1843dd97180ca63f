"""Services a team runs beside its nodes (``target.services``): torchft's lighthouse, a
standalone store, a coordinator.

Each one is started before the nodes, in a session of its own, with a free port of its own
filled into ``{NAME_port}`` (in its own line and in the nodes' launch line), and is ready once
it listens on that port. It belongs to the job: ``pids`` counts it, ``stop`` reaps it (SIGTERM,
then SIGKILL), and its parent-death signal (``die_with_parent``) takes it down if faultlab is
killed. A node's loss never touches it: it is in no node's process tree; ``kill`` (the
``service_kill`` fault) is the only thing that breaks it on purpose.
"""

from __future__ import annotations

import functools
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from faultlab.errors import ServiceError
from faultlab.spec.launch import fill, placeholders_in, program, service_placeholder
from faultlab.targets.procs import (
    die_with_parent,
    process_tree,
    send_signal,
    signal_tree,
    tree_listens,
)

__all__ = ["ServiceError", "Services"]



@dataclass(slots=True)
class _Service:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    cmd: list[str]
    port: int


class Services:
    """The services of one launch, by name. ``ports`` are chosen when it is built, so that the
    nodes' lines can be filled before anything starts."""

    def __init__(self, lines: Mapping[str, tuple[str, ...]], *, free_port: Callable[[], int],
                 ready_timeout_s: float = 30.0) -> None:
        self.lines = {name: tuple(line) for name, line in lines.items()}
        self.ports = {name: free_port() for name in self.lines}
        self.ready_timeout_s = ready_timeout_s
        self._running: dict[str, _Service] = {}

    def values(self) -> dict[str, str]:
        """Placeholder → port, for every service (``{lighthouse_port}`` ...)."""
        return {service_placeholder(n): str(p) for n, p in self.ports.items()}

    def start(self, logs: Path, values: Mapping[str, str],
              submit: Callable[[Callable[[], Any]], Future[Any]]) -> None:
        """Start every service and wait until each listens on its port. ``values`` fills the
        job-wide placeholders (``{run_dir}``, ``{num_nodes}``); ``submit`` runs the start on a
        thread that lives as long as faultlab (the parent-death signal fires when the thread
        that forked the process exits)."""
        for name, line in self.lines.items():
            cmd = fill(line, {**values, **self.values()})
            cmd[0] = program(cmd[0]) or cmd[0]
            log_path = logs / f"service-{name}.log"
            self._running[name] = submit(functools.partial(self._popen, name, cmd,
                                                           log_path)).result()
        for name, service in self._running.items():
            if service_placeholder(name) in placeholders_in(self.lines[name]):
                self._await_listening(service)

    def _popen(self, name: str, cmd: list[str], log_path: Path) -> _Service:
        with open(log_path, "ab") as log:
            try:
                popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=die_with_parent)
            except OSError as e:
                raise ServiceError(f"target.services.{name}: cannot start {cmd[0]!r}: "
                                   f"{e}") from None
        return _Service(name, popen, log_path, cmd, self.ports[name])

    def _await_listening(self, service: _Service) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if service.popen.poll() is not None:
                tail = service.log_path.read_text(errors="replace").strip().splitlines()[-5:]
                raise ServiceError(f"target.services.{service.name}: exited with "
                                   f"{service.popen.returncode} before it listened on port "
                                   f"{service.port}; its log ({service.log_path}) ends: "
                                   + " | ".join(tail))
            if tree_listens(service.popen.pid, {service.port}):
                return
            time.sleep(0.05)
        raise ServiceError(f"target.services.{service.name}: not listening on port "
                           f"{service.port} after {self.ready_timeout_s:g} s; see "
                           f"{service.log_path}")

    # -- addressing and breaking ------------------------------------------------------------

    def names(self) -> list[str]:
        return list(self.lines)

    def pid(self, name: str) -> int:
        if name not in self._running:
            raise KeyError(f"no service {name!r}; services are "
                           f"{', '.join(self.lines) or 'none'}")
        return self._running[name].popen.pid

    def kill(self, name: str, sig: int = signal.SIGKILL) -> list[int]:
        """Signal a service and everything it started (the ``service_kill`` fault)."""
        pid = self.pid(name)
        return signal_tree(pid, sig)

    def pids(self) -> set[int]:
        return {p.pid for s in self._running.values() for p in process_tree(s.popen.pid)}

    def info(self) -> list[dict[str, object]]:
        return [{"service": s.name, "pid": s.popen.pid, "port": s.port, "cmd": s.cmd,
                 "log": str(s.log_path)} for s in self._running.values()]

    def describe(self) -> list[str]:
        import shlex

        return [f"service {s.name}: {shlex.join(s.cmd)}" for s in self._running.values()]

    def stop(self, grace_s: float = 5.0) -> None:
        """Reap every service and its children: SIGTERM, then SIGKILL. Idempotent."""
        procs = [p for s in self._running.values() for p in process_tree(s.popen.pid)]
        for p in procs:
            send_signal(p, signal.SIGCONT)
            send_signal(p, signal.SIGTERM)
        _gone, alive = psutil.wait_procs(procs, timeout=grace_s)
        for p in alive:
            send_signal(p, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=5)
        for s in self._running.values():
            try:
                s.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
