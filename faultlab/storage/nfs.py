"""A directory seen the way one Linux NFS client with default mount options sees it: a FUSE
layer over a backing directory, one instance per simulated client, so that several instances
over the same directory disagree the way NFS clients of one server do (issue 37).

    python -m faultlab.storage.nfs BACKING MOUNTPOINT [--acregmin S] [--acdirmin S] ...

mounts in the foreground until SIGTERM or SIGINT (one per node of the Slurm test cluster);
``NfsView.start(backing, mountpoint, acregmin=..., ...)`` runs the same in a subprocess, returns
once the mount answers, and ``stop()`` (or leaving its ``with`` block) unmounts; if the process
that started it dies, the subprocess unmounts itself. The backing directory plays the server:
a write reaches it when the "client" would have sent it. The caches are
``faultlab.storage.nfs_client.NfsClient``.

Reproduced, per instance (nfs(5) and Linux's fs/nfs, defaults ``acregmin=3``, ``acregmax=60``,
``acdirmin=30``, ``acdirmax=60``):

- Attribute cache. A file's attributes are served from the cache for ``acregmin`` s, a
  directory's for ``acdirmin`` s; each revalidation that finds them unchanged doubles the
  timeout, up to ``acregmax``/``acdirmax``, and a change resets it to the minimum (Linux's
  ``attrtimeo``), so a directory polled while it does not change is rechecked only every 60 s.
- Name cache. A name looked up and found missing stays "No such file or directory" until the
  parent directory's attributes, once expired, are revalidated and show a change, even if
  another client or the backing directory created it meanwhile. A name another client removed
  keeps its cached attributes (``stat`` succeeds) until they expire, while ``open()`` fails at
  once. A fresh directory listing replaces the negative entries of the names it shows
  (readdirplus), and ``open(O_CREAT)`` does not trust a negative entry: it reaches the backing
  directory, so an existing file is opened (``O_EXCL`` fails with EEXIST).
- Directory listings are cached with the directory's attributes and read again only when
  those are found changed.
- Close-to-open. ``open()`` always fetches the file's attributes afresh. Writes through an
  instance stay in that instance (write-back, per file, shared by its descriptors, like the page
  cache) until ``close()`` of any of its descriptors, ``fsync``, a truncate, or more than
  ``max_dirty_bytes`` are buffered for the file (the kernel's writeback under memory pressure);
  then they reach the backing directory in order. Other instances see them only after that, and
  only when their own cached attributes expire or they open the file again.
- A client's own changes are visible to itself at once: buffered writes (size, mtime, data),
  creates, renames, removals, attribute changes. As with NFS's pre- and post-operation
  attributes, a change this client alone made to a directory does not expire its other cached
  names there, but a change by another client noticed in that directory's pre-operation
  attributes does.
- ``O_APPEND`` appends at the end of the file as this client sees it (the backing size plus
  its own buffered writes): two clients appending to one file can overwrite each other.
- Unmounting (``stop``, SIGTERM) writes back every buffered write first.
- Unlinking a file this client holds open: libfuse hides it as ``.fuse_hiddenNNN`` until the
  last close, the counterpart of NFS's silly-rename (``.nfsNNNN``); other clients list it
  (libfuse also removes it when the view stops; a crashed NFS client leaves its ``.nfs`` files).
- Inode numbers are the backing directory's, the same on every client, like NFS file ids.

Not reproduced:

- Mount options other than the four timeouts (``lookupcache=``, ``noac``, ``actimeo``,
  ``sync``, ``hard``/``soft``, ``timeo``, ``rsize``/``wsize``...); the NFS version is not chosen.
- Linux's ``stat()`` of a file with dirty pages writes them back first (for a fresh mtime):
  FUSE's getattr cannot tell a user's stat from the kernel's own size checks, so here only
  close, fsync, a truncate or ``max_dirty_bytes`` write back; nor is there writeback after
  ``dirty_expire_centisecs`` (30 s): a writer that never closes is never seen.
- No data cache of its own: reads go to the backing directory through the kernel's page cache
  of the mount, bounded by the size this client has cached, so another client's written-back
  bytes within that size can show before this client's attributes expire.
- ESTALE: opening a name another client removed gives ENOENT; a descriptor stays readable after
  another client removed its file (no stale file handles). No server reboot or grace period.
- Locks: ``fcntl``/``flock`` locks are local to one instance (no NLM or NFSv4 locking across
  clients, no cache revalidation on lock), no delegations.
- Change detection uses the backing file's mtime, ctime, size, link count and inode (NFSv3's
  attributes; NFSv4's change attribute is exact): two changes within one timestamp tick of the
  backing filesystem look like one. Kernels with multigrain timestamps (Linux 6.13 and later)
  give a change a fine-grained ctime when the old one was looked at, which this layer always
  did first (measured on 6.18 and ext4: 0 of 4,000 creates right after a stat were missed).
- Pre- and post-operation attributes are two ``lstat`` calls around the operation, not atomic:
  another client's change in between counts as this client's own.
- Permissions are checked by the kernel against the cached attributes (``default_permissions``,
  no ACCESS calls, no root squashing); no extended attributes, ``mknod`` or atime updates.

The kernel must not cache on top of this: the mount passes ``attr_timeout=0``,
``entry_timeout=0`` and ``negative_timeout=0`` (libfuse's defaults are 1 s, 1 s and 0), so
every lookup and stat reaches this layer, which alone decides what is stale (with libfuse's
1 s, a ``stat`` right after ``open()`` would still show the size from before the open). The
kernel's page cache of a file is dropped at each open (no ``kernel_cache``), as NFS drops a
file's cached data when open finds its attributes changed.
"""

from __future__ import annotations

import argparse
import atexit
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from faultlab.errors import FaultlabError
from faultlab.storage.mount import force_unmount, is_mounted
from faultlab.storage.nfs_client import NfsClient, NfsOptions
from faultlab.storage.server import _alive

__all__ = ["NfsClient", "NfsOptions", "NfsView", "main", "serve"]

START_TIMEOUT_S = 15.0
FUSE_OPTIONS: dict[str, Any] = {
    "attr_timeout": 0, "entry_timeout": 0, "negative_timeout": 0,  # see the module docstring
    "use_ino": True, "default_permissions": True,
    "fsname": "faultlab-nfs", "subtype": "faultlab-nfs",
}
"""What the mount passes to libfuse (``-o``; mfusepy moves ``use_ino`` into fuse_config)."""
LOOP_ENDED_BY_SIGNAL = 8
"""``fuse_main``'s return code when its loop ended, SIGTERM and SIGINT included."""


def serve(backing: Path, mountpoint: Path, options: NfsOptions, parent: int | None = None) -> int:
    """Mount ``backing`` at ``mountpoint`` as one NFS client until SIGTERM or SIGINT (or until
    ``parent`` dies); 0 on a clean stop."""
    from mfusepy import FUSE

    root_fd = os.open(backing, os.O_RDONLY | os.O_DIRECTORY)
    client = NfsClient(root_fd, options)
    stopping = threading.Event()
    if parent:
        def watch() -> None:
            while _alive(parent) and not stopping.is_set():
                time.sleep(0.5)
            if not stopping.is_set():
                print(f"faultlab nfs: parent {parent} is gone; unmounting {mountpoint}",
                      file=sys.stderr)
                os.kill(os.getpid(), signal.SIGTERM)  # libfuse's handler unmounts
        threading.Thread(target=watch, daemon=True, name="parent-watch").start()
    try:
        FUSE(client, str(mountpoint), foreground=True, nothreads=False, **FUSE_OPTIONS)
    except RuntimeError as e:  # libfuse reports a loop ended by a signal as 8
        if e.args != (LOOP_ENDED_BY_SIGNAL,):
            print(f"faultlab nfs: could not serve {backing} at {mountpoint}: libfuse "
                  f"returned {e.args[0]!r}", file=sys.stderr)
            return 1
    finally:
        stopping.set()
        client.destroy("/")  # libfuse calls it too, unless the mount never came up
    return 0


class NfsView:
    """One NFS client's view of ``backing`` mounted at ``mountpoint`` by a
    ``python -m faultlab.storage.nfs`` subprocess (see the module docstring)."""

    def __init__(self, backing: Path, mountpoint: Path, options: NfsOptions,
                 proc: subprocess.Popen[bytes], log: Path, own_log: bool) -> None:
        self.backing, self.mountpoint, self.options = backing, mountpoint, options
        self.proc, self.log, self._own_log = proc, log, own_log
        self.stopped = False

    @classmethod
    def start(cls, backing: Path, mountpoint: Path, *, acregmin: float = 3.0,
              acregmax: float = 60.0, acdirmin: float = 30.0, acdirmax: float = 60.0,
              max_dirty_bytes: int = 64 << 20, log: Path | None = None,
              timeout_s: float = START_TIMEOUT_S) -> NfsView:
        """Mount and return once the mount answers; FaultlabError (naming the paths and
        libfuse's words) if it does not. ``log`` keeps the server's output (else a temporary
        file, removed by ``stop``)."""
        options = NfsOptions(acregmin=acregmin, acregmax=acregmax, acdirmin=acdirmin,
                             acdirmax=acdirmax, max_dirty_bytes=max_dirty_bytes)
        backing, mountpoint = Path(backing).resolve(), Path(mountpoint).resolve()
        if not backing.is_dir():
            raise FaultlabError(f"the NFS view's backing directory {str(backing)!r} is not a "
                                f"directory: create it first")
        if is_mounted(mountpoint):
            raise FaultlabError(f"{mountpoint} is already a FUSE mount (a view not stopped?): "
                                f"`umount -l {mountpoint}`")
        own_log = log is None
        if log is None:
            fd, name = tempfile.mkstemp(prefix="faultlab-nfs-", suffix=".log")
            os.close(fd)
            log = Path(name)
        with open(log, "ab") as log_f:
            proc = subprocess.Popen(
                [sys.executable, "-m", "faultlab.storage.nfs", str(backing), str(mountpoint),
                 *options.argv(), "--parent", str(os.getpid())],
                stdin=subprocess.DEVNULL, stdout=log_f, stderr=subprocess.STDOUT,
                start_new_session=True)  # a Ctrl-C meant for us must not kill it first
        self = cls(backing, mountpoint, options, proc, log, own_log)
        atexit.register(self.stop)
        try:
            deadline = time.monotonic() + timeout_s
            while not is_mounted(mountpoint):
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = log.read_text(errors="replace")[-800:].strip()
                    raise FaultlabError(
                        f"the NFS view could not mount {str(mountpoint)!r} over "
                        f"{str(backing)!r} (is the mountpoint an existing directory?): "
                        f"{tail or 'the server said nothing'}")
                time.sleep(0.02)
            os.stat(mountpoint)  # the mount answers
        except BaseException:  # a failed start or a Ctrl-C while waiting leaves nothing behind
            self.stop()
            raise
        return self

    def stop(self, timeout_s: float = 10.0) -> list[str]:
        """Write back buffered writes and unmount (lazily: a file still open does not keep
        it); idempotent. What was done."""
        if self.stopped:
            return []
        self.stopped = True
        atexit.unregister(self.stop)
        done: list[str] = []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # libfuse's handler unmounts
            try:
                self.proc.wait(timeout_s)
                done.append(f"unmounted {self.mountpoint}")
            except subprocess.TimeoutExpired:
                done.append(f"the NFS view's server ({self.proc.pid}) did not stop in "
                            f"{timeout_s} s")
        if is_mounted(self.mountpoint) or self.proc.poll() is None:
            done += force_unmount(self.mountpoint, self.proc.pid)
            self.proc.wait(5)
        if self._own_log:
            self.log.unlink(missing_ok=True)
        return done

    def __enter__(self) -> NfsView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m faultlab.storage.nfs",
        description="Mount BACKING at MOUNTPOINT as one Linux NFS client with default mount "
                    "options would see it, until SIGTERM or SIGINT.")
    parser.add_argument("backing", type=Path)
    parser.add_argument("mountpoint", type=Path)
    defaults = NfsOptions()
    for f in fields(NfsOptions):
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(getattr(defaults, f.name)),
                            default=getattr(defaults, f.name), metavar="N")
    parser.add_argument("--parent", type=int, default=None,
                        help="unmount when this process is gone")
    args = parser.parse_args(argv)
    try:
        options = NfsOptions(**{f.name: getattr(args, f.name) for f in fields(NfsOptions)})
    except ValueError as e:
        parser.error(str(e))
    if not args.backing.is_dir():
        parser.error(f"BACKING {str(args.backing)!r} is not a directory")
    return serve(args.backing.absolute(), args.mountpoint.absolute(), options, args.parent)


if __name__ == "__main__":
    sys.exit(main())
