"""Process trees of this host: liveness, snapshots and signals that never raise.

Every target that runs a node as a process tree of this host (local agents, containers whose
processes the host sees) addresses a node through its topmost pid and these helpers. A zombie
counts as gone: a SIGKILLed process lingers as one until its parent reaps it, and treating it
as alive would hide a restart or block a clean-up.
"""

from __future__ import annotations

import ctypes
import os
import signal

import psutil

__all__ = ["die_with_parent", "pid_alive", "process_tree", "send_pid", "send_signal",
           "signal_tree", "tree_listens"]

_PR_SET_PDEATHSIG = 1


def pid_alive(pid: int) -> bool:
    """Is ``pid`` a live process (not gone, not an unreaped zombie)?"""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def process_tree(pid: int) -> list[psutil.Process]:
    """A process and all its descendants (empty if it is gone, or an unreaped zombie)."""
    try:
        root = psutil.Process(pid)
        if root.status() == psutil.STATUS_ZOMBIE:
            return []
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def send_signal(p: psutil.Process, sig: int) -> None:
    """Signal ``p``; a process that is already gone (or not ours to signal) is skipped."""
    try:
        p.send_signal(sig)
    except psutil.Error:
        pass


def send_pid(pid: int, sig: int) -> None:
    """Signal ``pid``; a process that is already gone is skipped."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def signal_tree(pid: int, sig: int) -> list[int]:
    """Signal a process and all its descendants, snapshotting the tree first (a worker that
    its agent restarts in between is not chased)."""
    procs = process_tree(pid)
    for p in procs:
        send_signal(p, sig)
    return [p.pid for p in procs]


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux; a no-op
    elsewhere). Used as ``preexec_fn`` and by long-lived helpers such as the store."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
    except OSError:
        pass


def tree_listens(pid: int, ports: set[int]) -> bool:
    """Does ``pid`` or a descendant listen on one of ``ports`` (TCP)? A launcher that hosts a
    store, or a service, is ready once it does."""
    tree = {p.pid for p in process_tree(pid)}
    try:
        return any(c.pid in tree and c.laddr and c.laddr.port in ports
                   and c.status == psutil.CONN_LISTEN
                   for c in psutil.net_connections(kind="tcp"))
    except psutil.Error:
        return False
