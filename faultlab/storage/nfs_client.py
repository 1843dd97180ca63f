"""One NFS client's caches as mfusepy operations over a backing directory: the attribute and
name caches, directory listings, write-back of buffered writes. ``faultlab.storage.nfs`` mounts
it and says, in its docstring, which NFS behaviours this reproduces and which it does not.

Pure Python over a directory descriptor: the tests drive ``NfsClient`` without a mount, with a
clock of their own.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from faultlab.storage.ops import rel, set_times, statfs

__all__ = ["NfsClient", "NfsOptions"]


@dataclass(frozen=True, slots=True, kw_only=True)
class NfsOptions:
    """The client's mount options (nfs(5) names and defaults, in seconds)."""

    acregmin: float = 3.0
    """Shortest time a regular file's attributes are served from the cache."""
    acregmax: float = 60.0
    """Longest time a regular file's attributes are served from the cache."""
    acdirmin: float = 30.0
    """Shortest time a directory's attributes (and so its listing and names) are cached."""
    acdirmax: float = 60.0
    """Longest time a directory's attributes (and so its listing and names) are cached."""
    max_dirty_bytes: int = 64 << 20
    """Buffered writes of one file past which they are written back without a close."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"NfsOptions.{f.name} must be a positive number, got {value!r}")
        for kind in ("acreg", "acdir"):
            lo, hi = getattr(self, f"{kind}min"), getattr(self, f"{kind}max")
            if lo > hi:
                raise ValueError(f"NfsOptions.{kind}min ({lo!r}) is above {kind}max ({hi!r}): "
                                 f"raise {kind}max or lower {kind}min")

    def argv(self) -> list[str]:
        """These options as ``faultlab.storage.nfs`` command-line flags."""
        return [a for f in fields(self)
                for a in (f"--{f.name.replace('_', '-')}", str(getattr(self, f.name)))]


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


def _attrs(st: os.stat_result) -> dict[str, Any]:
    return {"st_mode": st.st_mode, "st_nlink": st.st_nlink, "st_uid": st.st_uid,
            "st_gid": st.st_gid, "st_size": st.st_size, "st_ino": st.st_ino,
            "st_dev": st.st_dev, "st_blocks": st.st_blocks, "st_atime": st.st_atime_ns,
            "st_mtime": st.st_mtime_ns, "st_ctime": st.st_ctime_ns}


@dataclass(slots=True)
class _Entry:
    """One name as this client last saw it: its attributes, or None (a negative entry)."""

    attrs: dict[str, Any] | None
    change: tuple[Any, ...]
    expires: float
    ttl: float
    gen: int
    """The parent directory's generation when the name was looked up: valid while it holds."""


@dataclass(slots=True)
class _Dir:
    """What this client knows of one directory beyond its attributes."""

    gen: int
    change: tuple[Any, ...] | None = None
    listing: list[tuple[str, int, int]] | None = None


@dataclass(slots=True)
class _Dirty:
    """A file's writes buffered in this client, in order; adjacent ones merged."""

    fd: int
    extents: list[tuple[int, bytearray]] = field(default_factory=list)
    end: int = 0
    nbytes: int = 0
    mtime_ns: int = 0

    def add(self, offset: int, data: bytes) -> None:
        last = self.extents[-1] if self.extents else None
        if last is not None and last[0] + len(last[1]) == offset:
            last[1].extend(data)
        else:
            self.extents.append((offset, bytearray(data)))
        self.end = max(self.end, offset + len(data))
        self.nbytes += len(data)
        self.mtime_ns = time.time_ns()


@dataclass(slots=True)
class _Handle:
    fd: int
    key: tuple[int, int]
    """The backing file's (st_dev, st_ino): buffered writes follow the file, not its name."""
    append: bool
    writable: bool


class NfsClient:
    """mfusepy operations: one NFS client's caches over the directory open as ``root_fd``
    (see the module docstring). ``clock`` is injectable so that tests can move time."""

    use_ns = True

    def __init__(self, root_fd: int, options: NfsOptions | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.root = root_fd
        self.options = options or NfsOptions()
        self.clock = clock
        self._lock = threading.RLock()
        self._entries: dict[str, _Entry] = {}
        self._dirs: dict[str, _Dir] = {}
        self._dirty: dict[tuple[int, int], _Dirty] = {}
        self._handles: dict[int, _Handle] = {}
        self._gens = itertools.count(1)

    # -- the caches
    @staticmethod
    def _change(st: os.stat_result) -> tuple[int, ...]:
        """What tells this client a file or directory changed on the server (NFSv3's wcc
        attributes; the backing filesystem's timestamp granularity applies)."""
        return st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_nlink, st.st_ino

    def _list(self, path: str) -> list[tuple[str, int, int]]:
        """``(name, inode, file type)`` of each entry: readdir needs the inode, for with
        ``use_ino`` an entry of inode 0 is one that readdir(3) skips."""
        fd = os.open(rel(path), os.O_RDONLY | os.O_DIRECTORY, dir_fd=self.root)
        try:
            with os.scandir(fd) as it:
                return [(e.name, e.inode(), stat.S_IFDIR if e.is_dir(follow_symlinks=False) else
                         stat.S_IFLNK if e.is_symlink() else stat.S_IFREG) for e in it]
        finally:
            os.close(fd)

    def _gen_of_parent(self, path: str) -> int:
        if path == "/":
            return 0
        d = self._dirs.get(_parent(path))
        return d.gen if d else -1

    def _store(self, path: str, st: os.stat_result | None) -> _Entry:
        """Record what the server answered for ``path`` now (None: no such name)."""
        now, old = self.clock(), self._entries.get(path)
        if path in self._dirs and (st is None or not stat.S_ISDIR(st.st_mode)):
            self._forget_below(path)
        if st is None:
            entry = _Entry(None, (), float("inf"), 0.0, self._gen_of_parent(path))
            self._entries[path] = entry
            return entry
        is_dir = stat.S_ISDIR(st.st_mode)
        lo, hi = ((self.options.acdirmin, self.options.acdirmax) if is_dir else
                  (self.options.acregmin, self.options.acregmax))
        change = self._change(st)
        if old is None or old.attrs is None or old.change != change:
            ttl = lo
        elif now >= old.expires:  # revalidated after expiry and unchanged: trust it longer
            ttl = min(old.ttl * 2, hi)
        else:
            ttl = old.ttl
        if is_dir:
            d = self._dirs.get(path)
            if d is None:
                self._dirs[path] = _Dir(next(self._gens), change)
            elif d.change != change:
                d.gen, d.change, d.listing = next(self._gens), change, None
        entry = _Entry(_attrs(st), change, now + ttl, ttl, self._gen_of_parent(path))
        self._entries[path] = entry
        return entry

    def _fetch(self, path: str, fd: int | None = None) -> os.stat_result | None:
        try:
            return os.fstat(fd) if fd is not None else os.lstat(rel(path), dir_fd=self.root)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def _lookup(self, path: str, fd: int | None = None) -> dict[str, Any]:
        """``path``'s attributes as this client sees them; FuseOSError(ENOENT) if none."""
        if path != "/":
            self._revalidate(_parent(path))
        e = self._entries.get(path)
        if e is None or e.gen != self._gen_of_parent(path) or (
                e.attrs is not None and self.clock() >= e.expires):
            e = self._store(path, self._fetch(path, fd))
        if e.attrs is None:
            from mfusepy import FuseOSError
            raise FuseOSError(errno.ENOENT)
        d = self._dirty.get((e.attrs["st_dev"], e.attrs["st_ino"]))
        if d is None:
            return e.attrs
        return e.attrs | {"st_size": max(e.attrs["st_size"], d.end), "st_mtime": d.mtime_ns,
                          "st_ctime": d.mtime_ns}

    def _revalidate(self, directory: str) -> None:
        """Refresh a directory's attributes if they expired (the kernel looked it up first)."""
        e = self._entries.get(directory)
        if (e is None or e.attrs is None or self.clock() >= e.expires
                or directory not in self._dirs):
            st = self._fetch(directory)
            self._store(directory, st)
            if st is None:
                from mfusepy import FuseOSError
                raise FuseOSError(errno.ENOENT)

    def _forget_below(self, path: str) -> None:
        prefix = path.rstrip("/") + "/"
        for table in (self._entries, self._dirs):
            for p in [p for p in table if p.startswith(prefix)]:
                del table[p]
        self._dirs.pop(path, None)

    def _changing(self, *directories: str) -> dict[str, tuple[Any, ...]]:
        """Pre-operation change attributes of the directories an operation of ours changes."""
        return {d: self._change(os.lstat(rel(d), dir_fd=self.root))
                for d in dict.fromkeys(directories)}

    def _changed(self, pre: dict[str, tuple[Any, ...]]) -> None:
        """Post-operation: our own change is ours; one we did not see coming is someone
        else's, and expires the directory's names like a revalidation that found it."""
        for path, before in pre.items():
            e, d = self._entries.get(path), self._dirs.get(path)
            after = self._fetch(path)
            if e is None or e.attrs is None or d is None or after is None:
                self._store(path, after)
                continue
            if before != e.change:
                d.gen = next(self._gens)
            d.change = e.change = self._change(after)
            d.listing = None
            e.attrs = _attrs(after)

    # -- buffered writes
    def _writeback(self, key: tuple[int, int]) -> None:
        d = self._dirty.pop(key, None)
        if d is None:
            return
        for offset, data in d.extents:
            view = memoryview(data)
            while view:
                n = os.pwrite(d.fd, view, offset)
                view, offset = view[n:], offset + n

    def _handle(self, fh: int) -> _Handle:
        return self._handles[fh]

    def owns(self, fh: int) -> bool:
        """Was ``fh`` opened through this client (and not yet released)?"""
        return fh in self._handles

    def open_handles(self) -> int:
        return len(self._handles)

    # -- metadata
    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        with self._lock:
            h = self._handles.get(fh) if fh is not None else None
            return self._lookup(path, h.fd if h else None)

    def readdir(self, path: str, fh: int) -> list[tuple[str, dict[str, int], int]]:
        with self._lock:
            ino = self._lookup(path)["st_ino"]
            d = self._dirs[path]
            if d.listing is None:
                d.listing = self._list(path)
                for name, _, _ in d.listing:  # readdirplus: a listed name is no longer missing
                    child = f"{path.rstrip('/')}/{name}"
                    e = self._entries.get(child)
                    if e is not None and e.attrs is None:
                        del self._entries[child]
            return [(name, {"st_ino": i, "st_mode": kind}, 0) for name, i, kind in
                    [(".", ino, stat.S_IFDIR), ("..", ino, stat.S_IFDIR), *d.listing]]

    def readlink(self, path: str) -> str:
        return os.readlink(rel(path), dir_fd=self.root)

    def statfs(self, path: str) -> dict[str, int]:
        return statfs(self.root)

    def _setattr(self, path: str, op: Callable[[], None]) -> int:
        with self._lock:
            op()
            self._store(path, self._fetch(path))
            return 0

    def chmod(self, path: str, mode: int) -> int:
        return self._setattr(path, lambda: os.chmod(rel(path), mode, dir_fd=self.root,
                                                    follow_symlinks=False))

    def chown(self, path: str, uid: int, gid: int) -> int:
        return self._setattr(path, lambda: os.chown(rel(path), uid, gid, dir_fd=self.root,
                                                    follow_symlinks=False))

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        """libfuse passes utimensat's ``UTIME_NOW`` and ``UTIME_OMIT`` (``touch``) as a
        timespec of 0 s and that many ns, which mfusepy sums: undone here."""
        return self._setattr(path, lambda: set_times(self.root, path, times))

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        with self._lock:
            h = self._handles.get(fh) if fh is not None else None
            fd = h.fd if h else os.open(rel(path), os.O_WRONLY, dir_fd=self.root)
            try:
                st = os.fstat(fd)
                self._writeback((st.st_dev, st.st_ino))  # NFS flushes before a SETATTR
                os.ftruncate(fd, length)
                self._store(path, os.fstat(fd))
            finally:
                if h is None:
                    os.close(fd)
            return 0

    # -- namespace
    def _namespace(self, op: Callable[[], None], *paths: str) -> None:
        with self._lock:
            pre = self._changing(*(_parent(p) for p in paths))
            try:
                op()
            except OSError:
                # The server's answer is news about these names: Linux's NFS client drops the
                # dentry of a failed create (d_drop), so a mkdir that got EEXIST for a name
                # cached as missing sees the directory at once (os.makedirs(exist_ok=True)
                # from two nodes, DCP's save, relies on it).
                for p in paths:
                    self._store(p, self._fetch(p))
                raise
            self._changed(pre)
            for p in paths:
                self._store(p, self._fetch(p))

    def mkdir(self, path: str, mode: int) -> int:
        self._namespace(lambda: os.mkdir(rel(path), mode, dir_fd=self.root), path)
        return 0

    def rmdir(self, path: str) -> int:
        self._namespace(lambda: os.rmdir(rel(path), dir_fd=self.root), path)
        return 0

    def unlink(self, path: str) -> int:
        self._namespace(lambda: os.unlink(rel(path), dir_fd=self.root), path)
        return 0

    def rename(self, old: str, new: str) -> int:
        def op() -> None:
            os.rename(rel(old), rel(new), src_dir_fd=self.root, dst_dir_fd=self.root)
            for p in (old, new):
                if p in self._dirs:
                    self._forget_below(p)
        self._namespace(op, old, new)
        return 0

    def symlink(self, target: str, source: str) -> int:
        self._namespace(lambda: os.symlink(source, rel(target), dir_fd=self.root), target)
        return 0

    def link(self, target: str, source: str) -> int:
        self._namespace(lambda: os.link(rel(source), rel(target), src_dir_fd=self.root,
                                        dst_dir_fd=self.root), target)
        return 0

    # -- files
    def _open(self, path: str, fd: int, flags: int) -> int:
        """Register a backing descriptor as a handle; close-to-open: fresh attributes."""
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        if flags & os.O_TRUNC:
            self._writeback(key)
            os.ftruncate(fd, 0)
            st = os.fstat(fd)
        self._handles[fd] = _Handle(fd, key, bool(flags & os.O_APPEND),
                                    flags & os.O_ACCMODE != os.O_RDONLY)
        self._store(path, st)
        return fd

    def open(self, path: str, flags: int) -> int:
        strip = os.O_APPEND | os.O_TRUNC | os.O_CREAT | os.O_EXCL
        with self._lock:
            try:
                fd = os.open(rel(path), flags & ~strip, dir_fd=self.root)
            except FileNotFoundError:
                self._store(path, None)
                raise
            return self._open(path, fd, flags)

    def create(self, path: str, mode: int, flags: int = os.O_WRONLY) -> int:
        with self._lock:
            pre = self._changing(_parent(path))
            fd = os.open(rel(path), (flags | os.O_CREAT) & ~(os.O_APPEND | os.O_TRUNC), mode,
                         dir_fd=self.root)
            self._changed(pre)
            return self._open(path, fd, flags)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        h = self._handle(fh)
        with self._lock:
            d = self._dirty.get(h.key)
            if d is None:
                extents: list[tuple[int, bytes]] = []
                end = 0
            else:  # our own buffered writes over what the server has
                extents = [(off, bytes(data[max(0, offset - off):offset + size - off]))
                           for off, data in d.extents
                           if off < offset + size and off + len(data) > offset]
                extents = [(max(off, offset), data) for off, data in extents]
                end = d.end
        data = os.pread(h.fd, size, offset)
        if not extents and end <= offset + len(data):
            return data
        buf = bytearray(data)
        buf.extend(bytes(max(0, min(offset + size, end) - offset - len(buf))))
        for off, chunk in extents:
            buf[off - offset:off - offset + len(chunk)] = chunk
        return bytes(buf)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        h = self._handle(fh)
        with self._lock:
            d = self._dirty.get(h.key)
            if h.append:
                offset = max(os.fstat(h.fd).st_size, d.end if d else 0)
            if d is None:
                d = self._dirty[h.key] = _Dirty(h.fd)
            d.fd = h.fd
            d.add(offset, data)
            if d.nbytes > self.options.max_dirty_bytes:
                self._writeback(h.key)
        return len(data)

    def flush(self, path: str, fh: int) -> int:
        """close(2): a descriptor open for writing writes back the whole file (Linux's
        ``nfs_file_flush``); closing a read-only one writes back nothing."""
        h = self._handle(fh)
        if h.writable:
            self._flush_file(path, h)
        return 0

    def _flush_file(self, path: str, h: _Handle) -> None:
        with self._lock:
            if h.key in self._dirty:
                self._writeback(h.key)
                self._store(path, os.fstat(h.fd))

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        """Writes back the whole file, through any descriptor."""
        h = self._handle(fh)
        self._flush_file(path, h)
        (os.fdatasync if datasync else os.fsync)(h.fd)
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        return 0

    def release(self, path: str, fh: int) -> int:
        with self._lock:
            h = self._handles.pop(fh)
            try:
                d = self._dirty.get(h.key)
                if d is not None and d.fd == h.fd:  # its writes can go through no other fd
                    self._writeback(h.key)
            finally:
                os.close(h.fd)
        return 0

    def destroy(self, path: str) -> None:
        """At unmount: write back everything still buffered, like an NFS umount."""
        with self._lock:
            for key in list(self._dirty):
                self._writeback(key)
