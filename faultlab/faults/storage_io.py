"""Storage that fails while the job writes (issue 23): errors, latency, hangs and a full disk,
in the kernel's file-system path, for any trainer and any writer (``torch.save``'s C++ writer
included, which no Python-level patch sees).

The engine serves the job's checkpoint directory through a FUSE passthrough
(``faultlab.storage``) from the start of any run that has one of these faults; a run without
them is unchanged. Injecting a fault sets a rule in that passthrough; undoing it removes the
rule (``duration_s`` and/or ``until: reaction``), which releases any operation it holds. The
journal records the operations each fault hit and their counts (``details.undo.ops_hit``).

``path`` is a glob relative to the job's checkpoint directory, ``*`` crossing ``/``
(``*.distcp``: every DCP shard; ``step_*/.metadata*``: DCP's commit). ``target: all`` is the
directory as every node sees it; ``{node: N}`` is one node's view: only the operations of that
node's processes (its agent and every process under it, found by the caller's pid that FUSE
passes) are hit, the other nodes' go through.

Local and docker nodes: the mount exists before the containers are created, and Docker's bind
of the run directory is recursive, so each container sees it at the same path. Slurm: the job's
directory is on the shared directory, and the mount reaches the nodes only if that directory is
a shared mount on this host and the nodes bind it ``rslave``, as the local test cluster does
(``scripts/slurm-cluster.sh``); otherwise the experiment is refused at load time. A real
cluster's nodes mount the shared filesystem themselves, which no mount on faultlab's host
reaches. ``{node: N}`` is refused there at injection (the nodes' pids are not the host's).
"""

from __future__ import annotations

import itertools
from typing import Any, ClassVar

from pydantic import Field, field_validator

from faultlab.errors import FaultError
from faultlab.fault_api import Fault, FaultContext, FaultParams, Victim, require
from faultlab.fault_api.context import SharedRunsRoot
from faultlab.spec._base import show, unknown
from faultlab.storage.mount import fuse_unavailable, mount_for, propagates
from faultlab.storage.rules import ERRNOS, OPS

__all__ = ["DiskFullFault", "IoErrorFault", "IoHangFault", "IoLatencyFault",
           "StaleSharedFsFault"]

_rule_ids = itertools.count(1)


def _check_ops(value: Any) -> Any:
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list | tuple):
        for op in value:
            if op not in OPS:
                raise ValueError(unknown("op", op, OPS, "valid ops"))
        if not value:
            raise ValueError(f"ops must name at least one operation; valid ops: "
                             f"{', '.join(OPS)}")
    return value


def _check_path(value: Any) -> Any:
    if isinstance(value, str) and (value.startswith(("/", "~", "{")) or
                                   ".." in value.split("/")):
        raise ValueError(f"path {show(value)} is outside the job's checkpoint storage: give a "
                         f"glob relative to the checkpoint directory, e.g. '*.distcp' or "
                         f"'step_*/.metadata*' ('*' matches every file)")
    return value


class _OpsPath(FaultParams):
    """Which operations on which files a fault hits (io_hang's whole selection)."""

    ops: tuple[str, ...] = Field(("write",), description=f"operations hit: {', '.join(OPS)}")
    path: str = Field("*", description="glob of the files hit, relative to the job's "
                                       "checkpoint directory ('*' crosses '/')")

    _ops = field_validator("ops", mode="before")(classmethod(lambda cls, v: _check_ops(v)))
    _path = field_validator("path", mode="before")(classmethod(lambda cls, v: _check_path(v)))


class _Where(_OpsPath):
    percent: float = Field(100.0, description="share of the matching operations hit, 0-100 "
                                              "(seeded)")

    @field_validator("percent")
    @classmethod
    def _percent(cls, value: float) -> float:
        if not 0 <= value <= 100:
            raise ValueError(f"percent must be within 0-100, got {show(value)}")
        return value


class _IoFault(Fault):
    family = "storage"
    targets: ClassVar[tuple[str, ...]] = ("all", "node")
    """``all``: the checkpoint directory as every node sees it; ``{node: N}``: one node's."""
    reversible = True
    mounts_storage: ClassVar[bool] = True
    """The engine serves the job's checkpoint directory through the passthrough for the whole
    run when an experiment has a fault with this set."""

    def __init__(self, params: FaultParams) -> None:
        super().__init__(params)
        self._rule_id: str | None = None
        self._mount_path: Any = None

    @classmethod
    def refuses(cls, topology: Any) -> str | None:
        why = fuse_unavailable()
        if why is not None:
            return f"cannot mount the storage passthrough: {why}"
        settings = getattr(topology, "settings", None)
        if isinstance(settings, SharedRunsRoot):  # the nodes mount the runs' directory
            try:
                shared = settings.runs_root()
            except ValueError:
                return None  # where the runs go is checked when the run starts
            if not propagates(shared):
                return (f"the job's directory {str(shared)!r} is not on a shared mount of this "
                        f"host, so the passthrough mounted there would not reach the "
                        f"{topology.launcher} nodes, which mount it themselves; the local "
                        f"Slurm test cluster makes its shared directory one "
                        f"(scripts/slurm-cluster.sh up): run storage faults on nodes that see "
                        f"this host's files there")
        return None

    @classmethod
    def refuses_target(cls, target: Any) -> str | None:
        if target.command is None:
            return None  # the reference trainer: {run_dir}/checkpoints
        from faultlab.spec.checkpoint_args import checkpoint_dir_of

        return checkpoint_dir_of(target.command, target.checkpoint_dir)[1]

    def rule(self) -> dict[str, Any]:
        """The passthrough rule this fault sets (``faultlab.storage.rules.Rule``'s fields)."""
        raise NotImplementedError

    def inject(self, ctx: FaultContext, victim: Victim) -> dict[str, Any]:
        mount = mount_for(ctx.run_dir)
        self._rule_id = f"{self.type}-{next(_rule_ids)}"
        rule = {**self.rule(), "id": self._rule_id,
                "seed": ctx.rng(f"{self.type}/{victim}").randrange(2**31)}
        where: dict[str, Any] = {}
        if victim.kind == "node":  # that node's view: its processes only, by this host's pids
            require(ctx, "node_storage_view", f"{self.type} on one node ({{node: N}}; "
                    f"target: all needs nothing more)")
            node = ctx.node_names()[victim.value or 0]
            rule["pids"] = ctx.node_pids(node)
            if not rule["pids"]:
                raise FaultError(f"node {node} has no running process to hit")
            where = {"node": node, "pids": rule["pids"]}
        mount.set_rule(rule)
        self._mount_path = mount.path
        return {"storage": str(mount.path), **where,
                "rule": {k: v for k, v in rule.items() if k not in ("id", "seed", "pids")}}

    def undo(self, ctx: FaultContext) -> dict[str, Any]:
        """Remove its rule from the FUSE passthrough (a held operation goes on; the mount
        stays for the run and is unmounted with it, by the guard if faultlab dies); report
        the operations it hit."""
        if self._rule_id is None:
            return {}
        rule_id, self._rule_id = self._rule_id, None
        try:
            final = mount_for(self._mount_path).remove_rule(rule_id)
        except FaultError as e:  # the mount is gone already: nothing is held any more
            return {"note": str(e)}
        counts = final.get("counts", {})
        return {"ops_hit": counts, "num_ops_hit": sum(counts.values()),
                "bytes_seen": final.get("bytes_seen", 0)}


class IoErrorFault(_IoFault):
    """Fail the matching file operations with an errno (EIO, ENOSPC ...) in the kernel."""

    type = "io_error"
    fails_saves: ClassVar[bool] = True

    class Params(_Where):
        errno: str = Field("EIO", description=f"the error returned: {', '.join(ERRNOS)}")
        after_bytes: int = Field(0, ge=0, description="strike only after this many bytes were "
                                                      "written to matching files")

        @field_validator("errno", mode="before")
        @classmethod
        def _errno(cls, value: Any) -> Any:
            if value not in ERRNOS:
                raise ValueError(unknown("errno", value, ERRNOS, "valid errnos"))
            return value

    params: Params

    def rule(self) -> dict[str, Any]:
        p = self.params
        return {"errno": p.errno, "ops": list(p.ops), "path": p.path, "percent": p.percent,
                "after_bytes": p.after_bytes}


class IoLatencyFault(_IoFault):
    """Slow shared storage: a delay per matching operation and/or a cap on write bandwidth."""

    type = "io_latency"

    class Params(_Where):
        delay_ms: float = Field(0.0, ge=0, description="added to each matching operation")
        bandwidth_mb_s: float | None = Field(None, gt=0, description="cap on the matching "
                                                                      "writes, MB/s (shared)")

        def model_post_init(self, context: Any) -> None:
            if not self.delay_ms and self.bandwidth_mb_s is None:
                raise ValueError("io_latency needs delay_ms: <milliseconds> and/or "
                                 "bandwidth_mb_s: <MB/s>")

    params: Params

    def rule(self) -> dict[str, Any]:
        p = self.params
        return {"delay_ms": p.delay_ms, "bandwidth_mb_s": p.bandwidth_mb_s, "ops": list(p.ops),
                "path": p.path, "percent": p.percent}


class IoHangFault(_IoFault):
    """Block the matching operations until the fault is undone (a stuck NFS mount).

    The process sits in the kernel, not in Python: no Python-level timeout sees it."""

    type = "io_hang"
    fails_saves: ClassVar[bool] = True
    hangs_saves: ClassVar[bool] = True

    class Params(_OpsPath):
        pass

    params: Params

    def rule(self) -> dict[str, Any]:
        p = self.params
        return {"hang": True, "ops": list(p.ops), "path": p.path}


class DiskFullFault(_IoFault):
    """Fail writes with ENOSPC beyond ``free_bytes`` of new data (a full volume or quota)."""

    type = "disk_full"
    fails_saves: ClassVar[bool] = True

    class Params(FaultParams):
        free_bytes: int = Field(0, ge=0, description="new data the volume still takes")

    params: Params

    def rule(self) -> dict[str, Any]:
        return {"free_bytes": self.params.free_bytes, "ops": []}


class StaleSharedFsFault(_IoFault):
    """One node sees the checkpoint directory as a Linux NFS client with its own caches would.

    From the injection until the fault is undone, node N's processes (and those it starts
    again) are answered from an NFS client's caches: attributes served for ``acregmin`` s
    (files) and ``acdirmin`` s (directories), growing to the max while unchanged; a name found
    missing stays missing, and a directory's listing stays as it was, until the directory's
    attributes expire and show a change; its own writes reach the others only at close or
    fsync. Every other node, and faultlab, see the directory as it is. The view starts warm:
    the node's caches hold the directory as it was at the injection, as a node that had looked
    at it then would (``faultlab.storage.views``). The mount options are nfs(5)'s names and
    defaults; a site that sets ``actimeo=60`` or more gives longer windows.

    The question it asks: after a restart, does every rank resume from the same checkpoint,
    when one node's listing of the checkpoint directory is older than the others'? The
    ``same_resume_point`` expectation judges it. Local and docker nodes (the node is found by
    ``FAULTLAB_NODE`` in the environment of the process that calls).
    """

    type = "stale_shared_fs"
    targets: ClassVar[tuple[str, ...]] = ("node",)
    needs: ClassVar[tuple[str, ...]] = ("node_storage_view",)
    """A Slurm node's processes reach the shared directory through its own mount of it:
    faultlab's passthrough can give them no view of their own."""
    needs_exact_mount: ClassVar[bool] = True
    """The passthrough runs without the kernel's 1 s attribute and name caches, which every
    node of this host would share."""

    class Params(FaultParams):
        acregmin: float = Field(3.0, gt=0, description="seconds a file's attributes are "
                                                       "cached at first (nfs(5))")
        acregmax: float = Field(60.0, gt=0, description="longest a file's attributes are "
                                                        "cached")
        acdirmin: float = Field(30.0, gt=0, description="seconds a directory's attributes, "
                                                        "names and listing are cached at first")
        acdirmax: float = Field(60.0, gt=0, description="longest a directory's attributes are "
                                                        "cached")

        def model_post_init(self, context: Any) -> None:
            for kind in ("acreg", "acdir"):
                lo, hi = getattr(self, f"{kind}min"), getattr(self, f"{kind}max")
                if lo > hi:
                    raise ValueError(f"{kind}min ({lo:g}) is above {kind}max ({hi:g}): raise "
                                     f"{kind}max or lower {kind}min")

    params: Params

    def inject(self, ctx: FaultContext, victim: Victim) -> dict[str, Any]:
        require(ctx, "node_storage_view", "stale_shared_fs")
        mount = mount_for(ctx.run_dir)
        node = victim.node(ctx)
        p = self.params
        options = {"acregmin": p.acregmin, "acregmax": p.acregmax, "acdirmin": p.acdirmin,
                   "acdirmax": p.acdirmax}
        view_id = f"{self.type}-{next(_rule_ids)}"
        warmed = mount.set_view(view_id, node, options)
        self._rule_id, self._mount_path = view_id, mount.path  # _IoFault's slots: a view id
        return {"storage": str(mount.path), "node": node, "nfs": options,
                "warmed_names": warmed.get("warmed_names", 0)}

    def undo(self, ctx: FaultContext) -> dict[str, Any]:
        """End the node's view: what it buffered is written back, files it holds open stay
        with the view until closed; report the operations the view answered."""
        if self._rule_id is None:
            return {}
        view_id, self._rule_id = self._rule_id, None
        try:
            final = mount_for(self._mount_path).remove_view(view_id)
        except FaultError as e:
            return {"note": str(e)}
        ops = final.get("ops", {})
        return {"ops_answered": ops, "num_ops_answered": sum(ops.values())}
