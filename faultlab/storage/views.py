"""One node's NFS client view inside the storage passthrough (``stale_shared_fs``, issue 37).

The passthrough serves the job's checkpoint directory to every node at once. A view makes one
node see it the way a Linux NFS client with its own caches would (``NfsClient``: attributes,
names and listings cached, its own writes held until close), while every other node, and
faultlab itself, keeps the coherent directory. The view belongs to the *node*, not to its
processes: a caller is the node's when its environment says ``FAULTLAB_NODE=<node>`` (every
process the local and docker targets start has it, workers a restart creates included), so a
node whose processes are killed and started again on the same machine keeps the caches of
that machine, as its kernel's NFS client would. A caller's node is read from ``/proc`` at most
once a second per pid (pids are reused), and again while its environment reads empty (a
process inside ``execve``).

A view starts warm: at ``set`` it reads the directory tree once (listings and attributes, at
most ``WARM_ENTRIES`` names), so the node's caches hold the directory as it was at that moment
and age from there by the NFS rules (``acdirmin``...). Without it a fresh view would know
nothing and answer every first question from the server: no stale answer at all.

Files a node opened through its view stay with the view until closed, after the view is
removed too (their buffered writes are written back at close, as NFS does); files opened
before the view go on through the passthrough. Removing a view writes back what it buffered.
"""

from __future__ import annotations

import stat
import threading
import time
from collections import deque
from typing import Any

from faultlab.storage.nfs_client import NfsClient, NfsOptions

__all__ = ["NodeViews", "WARM_ENTRIES", "node_of"]

WARM_ENTRIES = 20_000
"""At most this many names are read into a view when it starts (a checkpoint directory of a
tiny job has tens; a large DCP checkpoint has a file per rank per step)."""
_CACHE = 65_536
_CACHE_S = 1.0
"""How long a caller's node is taken from the cache. Not for the view's whole life: a pid is
reused once the kernel's pids wrap (``pid_max`` is 32,768 on this machine, and a CI machine
starts thousands of processes a minute), and a new process must not be answered from the
node of a dead one that had its pid."""
_KEY = b"FAULTLAB_NODE="


def node_of(pid: int) -> str | None:
    """The ``FAULTLAB_NODE`` in the environment of process (or thread) ``pid``; None if it has
    none, is gone, or cannot tell yet."""
    return _environ_node(pid)[1]


def _environ_node(pid: int) -> tuple[bool, str | None]:
    """(whether ``pid``'s environment could be read, its ``FAULTLAB_NODE``).

    An empty ``/proc/<pid>/environ`` cannot be trusted: a process in the middle of ``execve``
    (after its old memory is gone, before the new stack is laid out) and a kernel thread both
    read as empty. A process that has just been started reads so for a while under load."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:
        return False, None
    for item in env.split(b"\0"):
        if item.startswith(_KEY):
            return True, item[len(_KEY):].decode(errors="replace")
    return bool(env), None


class _View:
    def __init__(self, view_id: str, node: str, client: NfsClient) -> None:
        self.id, self.node, self.client = view_id, node, client
        self.ops: dict[str, int] = {}
        self.warmed = 0

    def summary(self) -> dict[str, Any]:
        return {"id": self.id, "node": self.node, "warmed_names": self.warmed,
                "ops": dict(self.ops)}


class NodeViews:
    """The views in force, by node; thread-safe (libfuse serves requests in many threads)."""

    def __init__(self, root_fd: int) -> None:
        self.root = root_fd
        self._lock = threading.Lock()
        self._by_node: dict[str, _View] = {}
        self._retired: list[_View] = []
        self._removed: dict[str, dict[str, Any]] = {}
        self._nodes: dict[int, tuple[str | None, float]] = {}  # pid -> (node, when read)

    def __bool__(self) -> bool:
        return bool(self._by_node or self._retired)

    def set(self, view_id: str, node: str, options: dict[str, Any]) -> dict[str, Any]:
        view = _View(view_id, node, NfsClient(self.root, NfsOptions(**options)))
        view.warmed = _warm(view.client)
        with self._lock:
            old = self._by_node.get(node)
            if old is not None:
                raise ValueError(f"node {node} already has a view ({old.id}); remove it first")
            self._by_node[node] = view
            self._nodes.clear()
        return view.summary()

    def remove(self, view_id: str) -> dict[str, Any]:
        """Stop answering for the node from its caches: what it buffered is written back,
        files it holds open through the view stay with it until closed."""
        with self._lock:
            view = next((v for v in self._by_node.values() if v.id == view_id), None)
            if view is None:
                return self._removed.get(view_id, {"id": view_id, "ops": {}})
            del self._by_node[view.node]
            self._retired.append(view)
            self._removed[view_id] = view.summary()
        view.client.destroy("/")
        return view.summary()

    def clear(self) -> list[dict[str, Any]]:
        """Remove every view; all of them write back what they buffered."""
        for view in list(self._retired):
            view.client.destroy("/")
        return [self.remove(v.id) for v in list(self._by_node.values())]

    def for_caller(self, pid: int, op: str) -> NfsClient | None:
        """The view that answers ``op`` for the process (or thread) ``pid``, if its node has
        one."""
        if not self._by_node:
            return None
        now = time.monotonic()
        with self._lock:
            node, read_t = self._nodes.get(pid, (None, -_CACHE_S))
        if now - read_t >= _CACHE_S:
            read, node = _environ_node(pid)  # outside the lock: /proc may be slow
            if read:  # an environment not readable yet is asked again next time
                with self._lock:
                    if len(self._nodes) >= _CACHE:
                        self._nodes.clear()
                    self._nodes[pid] = (node, now)
        with self._lock:
            return self._counted(self._by_node.get(node) if node else None, op)

    def for_handle(self, fh: int | None, op: str) -> NfsClient | None:
        """The view a file handle was opened through, if any (it keeps answering for it)."""
        if fh is None or not self:
            return None
        with self._lock:
            view = next((v for v in [*self._by_node.values(), *self._retired]
                         if v.client.owns(fh)), None)
            return self._counted(view, op)

    @staticmethod
    def _counted(view: _View | None, op: str) -> NfsClient | None:
        """``view``'s client, ``op`` counted against it (the caller holds the lock)."""
        if view is None:
            return None
        view.ops[op] = view.ops.get(op, 0) + 1
        return view.client

    def released(self) -> None:
        """Forget retired views that hold no file any more."""
        with self._lock:
            self._retired = [v for v in self._retired if v.client.open_handles()]


def _warm(client: NfsClient) -> int:
    """Read the directory tree into ``client``'s caches, breadth first, at most
    ``WARM_ENTRIES`` names; how many were read."""
    seen, todo = 0, deque(["/"])
    client.getattr("/")
    while todo and seen < WARM_ENTRIES:
        directory = todo.popleft()
        try:
            entries = client.readdir(directory, 0)
        except OSError:
            continue  # removed meanwhile: nothing to cache
        for name, attrs, _ in entries:
            if name in (".", "..") or seen >= WARM_ENTRIES:
                continue
            path = f"{directory.rstrip('/')}/{name}"
            seen += 1
            try:
                client.getattr(path)
            except OSError:
                continue
            if stat.S_ISDIR(attrs.get("st_mode", 0)):
                todo.append(path)
    return seen
