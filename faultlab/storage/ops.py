"""What both FUSE layers of this package do the same way over their backing directory's
descriptor: paths relative to it, ``statfs``, ``readlink`` and the times of ``utimens``."""

from __future__ import annotations

import os
import time

__all__ = ["UTIME_NOW", "UTIME_OMIT", "rel", "set_times", "statfs"]

UTIME_NOW, UTIME_OMIT = (1 << 30) - 1, (1 << 30) - 2
"""utimensat(2)'s special tv_nsec values (Linux)."""


def rel(path: str) -> str:
    """A FUSE path (``/a/b``) relative to the backing directory's descriptor."""
    return path.lstrip("/") or "."


def statfs(root: int) -> dict[str, int]:
    """The backing filesystem's ``statvfs``, as mfusepy's ``statfs`` returns it."""
    st = os.fstatvfs(root)
    return {k: getattr(st, k) for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree",
                                        "f_bavail", "f_files", "f_ffree", "f_favail",
                                        "f_flag", "f_namemax")}


def set_times(root: int, path: str, times: tuple[int, int] | None) -> None:
    """``utimens`` as utimensat means it: libfuse passes ``UTIME_NOW`` and ``UTIME_OMIT``
    (``touch``) as a timespec of 0 s and that many ns, which mfusepy sums into plain
    nanoseconds; None is "now" for both."""
    st = os.lstat(rel(path), dir_fd=root)
    now, old = time.time_ns(), (st.st_atime_ns, st.st_mtime_ns)
    atime, mtime = (now if t is None or t == UTIME_NOW else was if t == UTIME_OMIT else t
                    for t, was in zip(times or (None, None), old, strict=True))
    os.utime(rel(path), ns=(atime, mtime), dir_fd=root, follow_symlinks=False)
