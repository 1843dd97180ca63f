"""The FUSE passthrough: one process serving a directory at its own path, with fault rules.

    python -m faultlab.storage.server --mount DIR --control SOCK [--parent PID]

It opens ``DIR`` before mounting over it and serves every operation through that descriptor
(``openat`` and friends with ``dir_fd``), so the directory under the mount *is* the backing
directory: whatever the job writes lands in the real files at once, and after the unmount the
same path holds them, with nothing to copy back. Every operation first meets the rules
(``faultlab.storage.rules``), which the engine changes at run time over a Unix socket of JSON
lines (``faultlab.storage.mount`` is the client): ``set`` a rule, ``remove`` one (releasing
what it holds), ``counts``, ``stop``.

Stopping releases every hung operation first, then unmounts (libfuse detaches the mount
lazily as root, so a file the job still holds open does not keep it); a request still waiting
then fails instead of hanging (the kernel aborts the connection when this process exits). When
``--parent`` dies (faultlab SIGKILLed), the server stops itself the same way; the engine's
guard process (``faultlab.reaper``) checks the mount is gone and removes it if not.

Multi-threaded: libfuse runs each request in a worker thread (``max_threads``), so a hung
``write`` of one file does not stop a ``read`` of another. Writes are not cached by the kernel
(no ``writeback_cache``): each ``write(2)`` reaches us and its error reaches the writer.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from faultlab.storage.nfs_client import NfsClient
from faultlab.storage.ops import rel, set_times, statfs
from faultlab.storage.rules import Rule, RuleSet
from faultlab.storage.views import NodeViews

MAX_THREADS = 64
"""libfuse's worker threads: enough that hung requests leave others served (measured: with 20
writes hung, a write to another file still went through). libfuse 3.14's ``fuse_main`` prints
"Ignoring invalid max threads value" at start: harmless, its own default is then used."""


class Passthrough:
    """mfusepy operations over a directory descriptor, each through ``RuleSet.gate``."""

    use_ns = True

    def __init__(self, root_fd: int, rules: RuleSet, views: NodeViews | None = None) -> None:
        self.root = root_fd
        self.rules = rules
        self.views = views if views is not None else NodeViews(root_fd)

    def _gate(self, op: str, path: str, nbytes: int = 0) -> None:
        from mfusepy import FuseOSError, fuse_get_context

        caller = fuse_get_context()[2] if self.rules.needs_caller() else None
        err = self.rules.gate(op, rel(path), nbytes, caller)
        if err:
            raise FuseOSError(err)

    def _view(self, op: str) -> NfsClient | None:
        """The caller's node's NFS view, if it has one (``faultlab.storage.views``)."""
        if not self.views:
            return None
        from mfusepy import fuse_get_context

        return self.views.for_caller(fuse_get_context()[2], op)

    def _held(self, fh: int | None, op: str) -> NfsClient | None:
        """The view ``fh`` was opened through, if any."""
        return self.views.for_handle(fh, op) if self.views else None

    # -- metadata
    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        view = self._held(fh, "getattr") if fh is not None else self._view("getattr")
        if view is not None:
            return view.getattr(path, fh)
        st = os.fstat(fh) if fh is not None else os.lstat(rel(path), dir_fd=self.root)
        return {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_uid", "st_gid",
                                            "st_size", "st_ino", "st_blocks",
                                            "st_atime_ns", "st_mtime_ns", "st_ctime_ns")} | {
            "st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns, "st_ctime": st.st_ctime_ns}

    def readdir(self, path: str, fh: int) -> list[Any]:
        if (view := self._view("readdir")) is not None:
            return view.readdir(path, fh)
        fd = os.open(rel(path), os.O_RDONLY | os.O_DIRECTORY, dir_fd=self.root)
        try:
            return [".", "..", *os.listdir(fd)]
        finally:
            os.close(fd)

    def readlink(self, path: str) -> str:
        if (view := self._view("readlink")) is not None:
            return view.readlink(path)
        return os.readlink(rel(path), dir_fd=self.root)

    def statfs(self, path: str) -> dict[str, int]:
        return statfs(self.root)

    def chmod(self, path: str, mode: int) -> int:
        if (view := self._view("chmod")) is not None:
            return view.chmod(path, mode)
        os.chmod(rel(path), mode, dir_fd=self.root, follow_symlinks=False)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        if (view := self._view("chown")) is not None:
            return view.chown(path, uid, gid)
        os.chown(rel(path), uid, gid, dir_fd=self.root, follow_symlinks=False)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        """``touch`` through the mount: libfuse passes utimensat's ``UTIME_NOW`` and
        ``UTIME_OMIT`` as a timespec of 0 s and that many ns, which mfusepy sums; None is
        "now" for both."""
        if (view := self._view("utimens")) is not None:
            return view.utimens(path, times)
        set_times(self.root, path, times)
        return 0

    def access(self, path: str, amode: int) -> int:
        if not os.access(rel(path), amode, dir_fd=self.root):
            from mfusepy import FuseOSError
            raise FuseOSError(errno.EACCES)
        return 0

    # -- namespace
    def mkdir(self, path: str, mode: int) -> int:
        self._gate("mkdir", path)
        if (view := self._view("mkdir")) is not None:
            return view.mkdir(path, mode)
        os.mkdir(rel(path), mode, dir_fd=self.root)
        return 0

    def rmdir(self, path: str) -> int:
        self._gate("unlink", path)
        if (view := self._view("rmdir")) is not None:
            return view.rmdir(path)
        os.rmdir(rel(path), dir_fd=self.root)
        return 0

    def unlink(self, path: str) -> int:
        self._gate("unlink", path)
        if (view := self._view("unlink")) is not None:
            return view.unlink(path)
        os.unlink(rel(path), dir_fd=self.root)
        return 0

    def rename(self, old: str, new: str) -> int:
        self._gate("rename", old)
        if (view := self._view("rename")) is not None:
            return view.rename(old, new)
        os.rename(rel(old), rel(new), src_dir_fd=self.root, dst_dir_fd=self.root)
        return 0

    def symlink(self, target: str, source: str) -> int:
        if (view := self._view("symlink")) is not None:
            return view.symlink(target, source)
        os.symlink(source, rel(target), dir_fd=self.root)
        return 0

    def link(self, target: str, source: str) -> int:
        if (view := self._view("link")) is not None:
            return view.link(target, source)
        os.link(rel(source), rel(target), src_dir_fd=self.root, dst_dir_fd=self.root)
        return 0

    # -- files
    def open(self, path: str, flags: int) -> int:
        self._gate("open", path)
        if (view := self._view("open")) is not None:
            return view.open(path, flags)
        return os.open(rel(path), flags, dir_fd=self.root)

    def create(self, path: str, mode: int, flags: int = os.O_WRONLY) -> int:
        """``flags``: the caller's open flags (mfusepy passes them to a three-argument
        ``create``)."""
        self._gate("create", path)
        if (view := self._view("create")) is not None:
            return view.create(path, mode, flags)
        return os.open(rel(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode,
                       dir_fd=self.root)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        self._gate("read", path, size)
        if (view := self._held(fh, "read")) is not None:
            return view.read(path, size, offset, fh)
        return os.pread(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        self._gate("write", path, len(data))
        if (view := self._held(fh, "write")) is not None:
            return view.write(path, data, offset, fh)
        return os.pwrite(fh, data, offset)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        view = self._held(fh, "truncate") if fh is not None else self._view("truncate")
        if view is not None:
            return view.truncate(path, length, fh)
        if fh is not None:
            os.ftruncate(fh, length)
        else:
            fd = os.open(rel(path), os.O_WRONLY, dir_fd=self.root)
            try:
                os.ftruncate(fd, length)
            finally:
                os.close(fd)
        return 0

    def fallocate(self, path: str, mode: int, offset: int, size: int, fh: int) -> int:
        self._gate("write", path, size)
        if (view := self._held(fh, "fallocate")) is not None:
            view.fsync(path, 1, fh)  # its buffered writes first: the file's size is theirs
        os.posix_fallocate(fh, offset, size)
        return 0

    def flush(self, path: str, fh: int) -> int:
        if (view := self._held(fh, "flush")) is not None:
            return view.flush(path, fh)
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        self._gate("fsync", path)
        if (view := self._held(fh, "fsync")) is not None:
            return view.fsync(path, datasync, fh)
        (os.fdatasync if datasync else os.fsync)(fh)
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        self._gate("fsync", path)
        return 0

    def release(self, path: str, fh: int) -> int:
        if (view := self._held(fh, "release")) is not None:
            view.release(path, fh)
            self.views.released()
            return 0
        os.close(fh)
        return 0

    def destroy(self, path: str) -> None:
        """At unmount: every view writes back what it buffered."""
        self.views.clear()


class Control:
    """The engine's channel: JSON lines over a Unix socket, one request, one reply."""

    def __init__(self, sock_path: Path, rules: RuleSet, on_stop: Any,
                 views: NodeViews | None = None) -> None:
        self.rules = rules
        self.views = views
        self.on_stop = on_stop
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock_path.unlink(missing_ok=True)
        self.server.bind(str(sock_path))
        self.server.listen(8)
        threading.Thread(target=self._accept, daemon=True, name="control").start()

    def _accept(self) -> None:
        while True:
            conn, _ = self.server.accept()
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rwb") as f:
            for line in f:
                try:
                    reply = self.handle(json.loads(line))
                except Exception as e:  # noqa: BLE001 - a bad request must not kill the server
                    reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
                f.write(json.dumps(reply).encode() + b"\n")
                f.flush()

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        cmd = req.get("cmd")
        if cmd == "set":
            self.rules.set(Rule.from_dict(req["rule"]))
            return {"ok": True}
        if cmd == "remove":
            return {"ok": True, "rule": self.rules.remove(req["id"])}
        if cmd == "counts":
            return {"ok": True, "rules": self.rules.counts()}
        if cmd == "view" and self.views is not None:
            return {"ok": True, "view": self.views.set(req["id"], req["node"], req["options"])}
        if cmd == "unview" and self.views is not None:
            return {"ok": True, "view": self.views.remove(req["id"])}
        if cmd == "ping":
            return {"ok": True, "pid": os.getpid()}
        if cmd == "stop":
            rules = self.rules.clear()
            if self.views is not None:
                self.views.clear()  # write back what the nodes' views buffered
            self.on_stop()
            return {"ok": True, "rules": rules}
        raise ValueError(f"unknown command {cmd!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="faultlab.storage.server")
    parser.add_argument("--mount", type=Path, required=True)
    parser.add_argument("--control", type=Path, required=True)
    parser.add_argument("--parent", type=int, default=None)
    parser.add_argument("--no-kernel-cache", action="store_true",
                        help="every lookup and stat reaches the server (a node's NFS view "
                             "decides what it sees: the kernel's 1 s caches are shared by "
                             "every node of this host)")
    args = parser.parse_args(argv)
    from mfusepy import FUSE

    mount = args.mount.resolve()
    root_fd = os.open(mount, os.O_RDONLY | os.O_DIRECTORY)  # before the mount hides it
    rules = RuleSet()
    views = NodeViews(root_fd)
    stopping = threading.Event()

    def stop() -> None:
        stopping.set()
        rules.clear()  # release every hung operation before the unmount
        # libfuse's own SIGTERM handler ends its loop and unmounts (lazily, as root)
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM)).start()

    Control(args.control, rules, stop, views)
    if args.parent:
        def watch() -> None:
            while _alive(args.parent):
                time.sleep(0.5)
            print(f"faultlab storage: faultlab (pid {args.parent}) is gone; unmounting "
                  f"{mount}", file=sys.stderr)
            stop()
        threading.Thread(target=watch, daemon=True, name="parent-watch").start()
    try:
        uncached = {"attr_timeout": 0, "entry_timeout": 0, "negative_timeout": 0} \
            if args.no_kernel_cache else {}
        FUSE(Passthrough(root_fd, rules, views), str(mount), foreground=True, nothreads=False,
             fsname="faultlab", subtype="faultlab", default_permissions=True,
             max_threads=MAX_THREADS, **uncached)
    except RuntimeError:  # libfuse reports the loop ended by our own SIGTERM as 8
        if not stopping.is_set():
            raise
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie parent (killed, not yet reaped) is gone too
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
