"""The Docker engine side of the docker target: connecting, the node image, the network, and
removing everything a run created.

Nothing is pulled (no registry need be reachable): the node image is ``docker import``-ed from a
rootfs of a few kilobytes — empty directories, ``/etc/passwd`` and ``/etc/group`` — and every
container bind-mounts the host's ``/usr``, Python and virtual environment read-only at the
same paths, so the interpreter, torch and faultlab inside are exactly the host's.

Everything a run creates carries the label ``faultlab.run=<run id>`` (and ``faultlab=1``):
``remove_run`` deletes a run's containers, network and image by that label, whoever calls it
(the job's ``stop``, the guard process when faultlab itself was killed, ``faultlab docker
clean``).
"""

from __future__ import annotations

import io
import tarfile
import time
from typing import Any

from faultlab.errors import TargetError

__all__ = ["LABEL", "RUN_LABEL", "build_image", "connect", "remove_run", "run_resources"]

LABEL = "faultlab"
RUN_LABEL = "faultlab.run"
IMAGE_REPO = "faultlab-node"
_SETUP_HINT = ("the docker launcher needs a running Docker engine: install it (Debian: "
               "apt-get install docker.io), start containerd and dockerd as root, and check "
               "with `docker info` (README: Docker target)")


def connect(timeout_s: float = 30.0) -> Any:
    """A docker SDK client of the local engine; TargetError (with the way out) if none."""
    try:
        import docker
        import docker.errors
    except ImportError as e:  # a dependency of faultlab: a broken install
        raise TargetError(f"the docker SDK is not importable ({e}); reinstall faultlab") from None
    try:
        client = docker.from_env(timeout=int(timeout_s))
        client.ping()
    except docker.errors.DockerException as e:
        raise TargetError(f"no Docker engine answers ({_short(e)}); {_SETUP_HINT}") from None
    return client


def _short(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return text[:300]


def _rootfs() -> bytes:
    """A minimal root filesystem as a tar: mount points, merged-/usr links, users."""
    buf = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add(name: str, *, kind: bytes = tarfile.DIRTYPE, data: bytes = b"",
                link: str = "", mode: int = 0o755) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime, info.linkname = kind, mode, now, link
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

        for d in ("etc", "tmp", "proc", "sys", "dev", "run", "usr", "root", "home", "var",
                  "var/tmp", "work", "opt", "mnt", "sbin"):
            add(d, mode=0o1777 if d in ("tmp", "var/tmp") else 0o755)
        # /sbin stays a real directory: the engine bind-mounts its init at /sbin/docker-init,
        # which cannot be created on the read-only /usr that a /sbin -> usr/sbin link points at.
        for name, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
            add(name, kind=tarfile.SYMTYPE, link=target, mode=0o777)
        add("etc/passwd", kind=tarfile.REGTYPE, mode=0o644,
            data=b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:"
                 b"/usr/sbin/nologin\n")
        add("etc/group", kind=tarfile.REGTYPE, mode=0o644, data=b"root:x:0:\nnogroup:x:65534:\n")
        add("etc/nsswitch.conf", kind=tarfile.REGTYPE, mode=0o644,
            data=b"passwd: files\ngroup: files\nhosts: files dns\n")
    return buf.getvalue()


def build_image(client: Any, run_id: str) -> str:
    """``docker import`` the node image for one run; returns its tag."""
    import docker.errors

    tag = f"{IMAGE_REPO}:{run_id}"
    changes = [f"LABEL {LABEL}=1", f"LABEL {RUN_LABEL}={run_id}",
               "ENV PATH=/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin",
               "ENV HOME=/tmp"]
    try:
        client.api.import_image_from_data(_rootfs(), repository=IMAGE_REPO, tag=run_id,
                                          changes=changes)
    except docker.errors.DockerException as e:
        raise TargetError(f"cannot import the node image {tag}: {_short(e)}") from None
    return tag


def run_resources(client: Any, run_id: str | None = None) -> dict[str, list[str]]:
    """Names of what faultlab created in the engine: of one run, or of every run. Safe while
    the guard or a ``stop`` removes them (docker-py's ``list`` inspects each container and
    image it lists, and one removed in between raised NotFound)."""
    label = _label(run_id)
    return {
        "containers": [c.name for c in client.containers.list(
            all=True, filters={"label": label}, ignore_removed=True)],
        "networks": [n.name for n in client.networks.list(filters={"label": label})],
        "images": [t for i in _images(client, label) for t in i.get("RepoTags") or []],
    }


def _label(run_id: str | None) -> str:
    """The label filter of one run's objects, or of every run's."""
    return f"{RUN_LABEL}={run_id}" if run_id else f"{LABEL}=1"


def _images(client: Any, label: str) -> list[dict[str, Any]]:
    """The images with ``label``, as the engine lists them (no inspect per image)."""
    return list(client.api.images(filters={"label": label}))


def remove_run(client: Any, run_id: str | None = None) -> dict[str, list[str]]:
    """Remove a run's containers (paused or running ones too), its network and its image
    (or every faultlab run's, with no ``run_id``). Idempotent; returns what was removed."""
    import docker.errors

    label = _label(run_id)
    removed: dict[str, list[str]] = {"containers": [], "networks": [], "images": []}
    for c in client.containers.list(all=True, filters={"label": label}, ignore_removed=True):
        try:
            if c.status == "paused":
                c.unpause()
            c.remove(force=True)
            removed["containers"].append(c.name)
        except docker.errors.NotFound:
            pass
    for n in client.networks.list(filters={"label": label}):
        try:
            n.remove()
            removed["networks"].append(n.name)
        except docker.errors.NotFound:
            pass
    for image in _images(client, label):
        try:
            client.images.remove(image["Id"], force=True)
            removed["images"] += image.get("RepoTags") or [image["Id"]]
        except docker.errors.NotFound:
            pass
    return removed


def engine_problem() -> str | None:
    """Why the docker launcher cannot run here (None when an engine answers). For tests and
    the pytest plugin: a docker experiment skips with this reason, unless the environment sets
    ``FAULTLAB_REQUIRE_DOCKER=1`` (CI does), where it fails instead."""
    try:
        connect(timeout_s=10).close()
    except TargetError as e:
        return str(e)
    return None
