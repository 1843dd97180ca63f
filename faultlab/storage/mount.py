"""The engine's side of the passthrough: start it over a directory, change its rules, stop it,
and make sure nothing is left mounted, whatever happened.

``StorageMount.start`` launches ``faultlab.storage.server`` over the directory and waits until
the kernel shows the mount; ``set_rule``/``remove_rule`` talk to it; ``stop`` asks it to release
every held operation and unmount, then checks ``/proc/self/mountinfo`` and falls back to
``force_unmount``. A guard file (``guard_path``) names the mount, the server's pid and its
control socket so that ``faultlab.reaper`` can do the same after faultlab itself was killed.

Running mounts are found by directory (``mount_for``), so a storage fault reaches the mount
of the run it belongs to through nothing but its ``FaultContext.run_dir``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from faultlab.errors import FaultError, FaultlabError

__all__ = ["StorageMount", "force_unmount", "fuse_unavailable", "is_mounted", "mount_for",
           "propagates"]

_MOUNTS: dict[Path, StorageMount] = {}
START_TIMEOUT_S = 15.0


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n") \
        .replace("\\134", "\\")


def is_mounted(path: Path) -> bool:
    """Is a FUSE filesystem mounted exactly at ``path`` (``/proc/self/mountinfo``)? Unlike
    ``os.path.ismount`` this never touches the mount, so a dead server cannot hang it."""
    want = str(path)
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return False
    for line in lines:
        fields = line.split(" ")
        sep = fields.index("-")
        if _unescape(fields[4]) == want and fields[sep + 1].startswith("fuse"):
            return True
    return False


def propagates(path: Path, mountinfo: str | None = None) -> bool:
    """Does a mount made at ``path`` propagate to other mount namespaces? True when the mount
    holding ``path`` has shared propagation (``shared:N`` in ``/proc/self/mountinfo``, or the
    ``mountinfo`` text given): then containers that bind it ``rslave`` (the local Slurm
    cluster's nodes) see the new mount."""
    path = Path(os.path.abspath(path))
    best, shared = -1, False
    if mountinfo is None:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        point = Path(_unescape(fields[4]))
        if (point == path or point in path.parents) and len(point.parts) > best:
            best = len(point.parts)
            shared = any(f.startswith("shared:") for f in fields[6:fields.index("-")])
    return shared


def _conn_id(path: Path) -> str | None:
    """The mount's FUSE connection (``/sys/fs/fuse/connections/<id>``): its device minor."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" ")
        if _unescape(fields[4]) == str(path):
            return fields[2].split(":")[1]
    return None


def force_unmount(path: Path, server_pid: int | None = None) -> list[str]:
    """Remove the mount at ``path`` without its server's help: abort the FUSE connection (a
    request still hung fails at once instead of waiting), kill the server, detach the mount
    lazily. Never leaves the path as "Transport endpoint is not connected": after the lazy
    detach the path shows the directory beneath, which holds every byte written."""
    done: list[str] = []
    conn = _conn_id(path) if is_mounted(path) else None
    if conn is not None:
        try:
            Path(f"/sys/fs/fuse/connections/{conn}/abort").write_text("1")
            done.append(f"aborted FUSE connection {conn}")
        except OSError:
            pass
    if server_pid:
        try:
            os.kill(server_pid, signal.SIGKILL)
            done.append(f"killed storage server {server_pid}")
        except ProcessLookupError:
            pass
    for _ in range(3):
        if not is_mounted(path):
            break
        cmd = (["umount", "-l", str(path)] if os.geteuid() == 0 else
               ["fusermount3", "-u", "-z", str(path)])
        subprocess.run(cmd, capture_output=True, timeout=10, check=False)
        done.append(f"{' '.join(cmd[:-1])} {path}")
    if is_mounted(path):
        done.append(f"could not unmount {path}: run `umount -l {path}` as root")
    return done


def fuse_unavailable() -> str | None:
    """Why this machine cannot mount the passthrough (which part is missing and how to get
    it), or None when it can."""
    if not Path("/dev/fuse").exists():
        return ("this machine has no /dev/fuse (the FUSE kernel module is not loaded: "
                "`modprobe fuse` as root; in a container run it with `--device /dev/fuse "
                "--cap-add SYS_ADMIN`)")
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is not readable and writable by this user (run faultlab as root)"
    if os.geteuid() != 0 and shutil.which("fusermount3") is None:
        return ("no right to mount: not root and no fusermount3 (install Debian's fuse3: "
                "`apt-get install fuse3`, or run faultlab as root)")
    try:
        import mfusepy  # noqa: F401  (loads libfuse3 through ctypes)
    except (ImportError, OSError) as e:
        return (f"libfuse cannot be loaded ({e}); install Debian's fuse3 and libfuse3-3: "
                f"`apt-get install fuse3 libfuse3-3`")
    return None


def mount_for(path: Path) -> StorageMount:
    """The running mount serving ``path`` or a directory above it; FaultError if none."""
    path = Path(path).resolve()
    for root, m in _MOUNTS.items():
        if path == root or root in path.parents or path in root.parents:
            return m
    raise FaultError(f"no faultlab storage mount serves {path}: storage faults need the "
                     f"passthrough that `faultlab run` (and the pytest plugin) mounts at the "
                     f"start of the run; the Chaos Toolkit control does not mount it yet")


class StorageMount:
    """One running passthrough over ``path`` (see the module docstring)."""

    def __init__(self, path: Path, proc: subprocess.Popen[bytes], control: Path,
                 guard_path: Path) -> None:
        self.path, self.proc, self.control, self.guard_path = path, proc, control, guard_path
        self._sock: socket.socket | None = None
        self.stopped = False

    @classmethod
    def start(cls, path: Path, state_dir: Path, log: Path | None = None,
              kernel_cache: bool = True) -> StorageMount:
        """Serve ``path`` (created if missing) through the passthrough; returns once mounted.
        ``kernel_cache=False``: every lookup and stat reaches the server (needed where one
        node's view differs from another's: ``stale_shared_fs``)."""
        path = Path(path).resolve()
        path.mkdir(parents=True, exist_ok=True)
        if is_mounted(path):
            raise FaultlabError(f"{path} is already a FUSE mount (a faultlab run killed "
                                f"before its guard could clean up?): `umount -l {path}`")
        state_dir.mkdir(parents=True, exist_ok=True)
        control = state_dir / "storage.sock"
        if len(str(control)) > 100:  # AF_UNIX paths are limited to 108 bytes
            control = Path(f"/tmp/faultlab-storage-{os.getpid()}-{len(_MOUNTS)}.sock")
        log_f = open(log or state_dir / "storage-server.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "faultlab.storage.server", "--mount", str(path),
             "--control", str(control), "--parent", str(os.getpid()),
             *([] if kernel_cache else ["--no-kernel-cache"])],
            stdin=subprocess.DEVNULL, stdout=log_f, stderr=subprocess.STDOUT,
            start_new_session=True)  # a Ctrl-C meant for faultlab must not kill it first
        log_f.close()
        self = cls(path, proc, control, state_dir / "storage-guard.json")
        self.guard_path.write_text(json.dumps({"mount": str(path), "pid": proc.pid,
                                               "control": str(control)}))
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (is_mounted(path) and control.exists()):
            if proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = (state_dir / "storage-server.log").read_text(errors="replace")[-800:]
                raise FaultlabError(f"the storage passthrough did not mount {path}: {tail}")
            time.sleep(0.02)
        _MOUNTS[path] = self
        return self

    def request(self, msg: dict[str, Any], timeout_s: float = 10.0) -> dict[str, Any]:
        if self._sock is None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._sock.settimeout(timeout_s)
            self._sock.connect(str(self.control))
            self._file = self._sock.makefile("rwb")
        self._file.write(json.dumps(msg).encode() + b"\n")
        self._file.flush()
        line = self._file.readline()
        if not line:
            raise FaultError(f"the storage passthrough over {self.path} stopped answering")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise FaultError(f"storage passthrough: {reply.get('error')}")
        return reply

    def set_rule(self, rule: dict[str, Any]) -> None:
        self.request({"cmd": "set", "rule": rule})

    def remove_rule(self, rule_id: str) -> dict[str, Any]:
        """Remove a rule (its held operations go on); its final counts."""
        return self.request({"cmd": "remove", "id": rule_id})["rule"]

    def counts(self) -> list[dict[str, Any]]:
        return self.request({"cmd": "counts"})["rules"]

    def set_view(self, view_id: str, node: str, options: dict[str, Any]) -> dict[str, Any]:
        """Give ``node`` an NFS client's view (``faultlab.storage.views``); what it warmed."""
        return self.request({"cmd": "view", "id": view_id, "node": node,
                             "options": options}, timeout_s=60)["view"]

    def remove_view(self, view_id: str) -> dict[str, Any]:
        """End a node's view (its buffered writes are written back); the ops it answered."""
        return self.request({"cmd": "unview", "id": view_id})["view"]

    def stop(self, timeout_s: float = 10.0) -> list[str]:
        """Release every held operation and unmount; idempotent. What was done."""
        if self.stopped:
            return []
        self.stopped = True
        _MOUNTS.pop(self.path, None)
        done: list[str] = []
        try:
            if self.proc.poll() is None:
                self.request({"cmd": "stop"}, timeout_s=5)
                done.append("released held operations")
                self.proc.wait(timeout_s)
                done.append(f"unmounted {self.path}")
        except (OSError, FaultError, subprocess.TimeoutExpired, ValueError) as e:
            done.append(f"storage server did not stop cleanly ({type(e).__name__})")
        if self._sock is not None:
            self._sock.close()
        if is_mounted(self.path) or self.proc.poll() is None:
            done += force_unmount(self.path, self.proc.pid)
            self.proc.wait(5)
        self.control.unlink(missing_ok=True)
        self.guard_path.unlink(missing_ok=True)
        return done


def restore_from_guard(guard: Path) -> list[str]:
    """The reaper's undo after faultlab died: stop the server, else force the unmount."""
    state = json.loads(guard.read_text())
    path, pid = Path(state["mount"]), int(state["pid"])
    done: list[str] = []
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(3)
            s.connect(state["control"])
            s.sendall(b'{"cmd": "stop"}\n')
            s.recv(65536)
            done.append("released held operations")
    except OSError:
        pass
    deadline = time.monotonic() + 5
    while is_mounted(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    if is_mounted(path):
        done += force_unmount(path, pid)
    else:
        done.append(f"{path} unmounted")
    guard.unlink(missing_ok=True)
    return done
