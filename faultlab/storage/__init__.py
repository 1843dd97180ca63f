"""The storage path under fault: a FUSE passthrough over the job's checkpoint directory whose
rules make the kernel's file operations fail, slow down or hang (``io_error``, ``io_latency``,
``io_hang``, ``disk_full`` in ``faultlab.faults.storage_io``).

``rules`` is what one operation meets, ``server`` the FUSE process, ``mount`` the engine's
side: start, change, stop, and the undo that survives faultlab's own death. ``nfs`` is another
FUSE layer: a directory as one Linux NFS client sees it (cached attributes and negative
lookups, close-to-open; its caches are ``nfs_client``), one ``NfsView`` per simulated client
(issue 37). Import it from ``faultlab.storage.nfs``: it is not re-exported here, so that
``python -m faultlab.storage.nfs`` does not find itself imported before it runs.

It may import ``faultlab.errors`` only: the faults, the engine and the reaper use it, and the
server process loads only this package (and mfusepy).
"""

from faultlab.storage.mount import (
                                    StorageMount,
                                    force_unmount,
                                    fuse_unavailable,
                                    is_mounted,
                                    mount_for,
)
from faultlab.storage.rules import ERRNOS, OPS, Rule, RuleSet

__all__ = ["ERRNOS", "OPS", "Rule", "RuleSet", "StorageMount", "force_unmount",
           "fuse_unavailable", "is_mounted", "mount_for"]
