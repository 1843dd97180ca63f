"""Where a golden run's reference is kept and what it is keyed by: the cache every way of
running finds, the site the nodes compute on, and the refusal of a reference from elsewhere.

``faultlab.engine.golden`` runs and caches the reference; this module says where
(``golden_cache_for``), on what (``reference_site``: the target kind and the nodes' site,
``faultlab.runtime.site``, read on this host for nodes on this host, and what the target says
over it: Slurm's cluster and the site its nodes reported), and, once a run has reported its
own site, whether the reference was from other hardware (``refuse_other_hardware``: the entry
is dropped and the target told what the nodes are, so the next run computes it again under the
key of those nodes).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from pathlib import Path
from typing import Any

from faultlab.observe.site import other_hardware, run_site
from faultlab.runtime.site import site
from faultlab.spec import Experiment
from faultlab.targets import target_class

__all__ = ["forget", "golden_cache_dir", "golden_cache_for", "reference_site",
           "refuse_other_hardware"]


def reference_site(exp: Experiment) -> dict[str, Any]:
    """Where a golden run of ``exp`` computes its bits, as far as it is known before the run:
    the target kind and this host's site (``faultlab.runtime.site``, exact for nodes on this
    host), with what the target says over it (``Target.reference_site``: Slurm's cluster and
    its nodes' site). Part of the cache key: a CPU reference is never looked up for a GPU run,
    one cluster's or partition's never for another's."""
    here = site(exp.topology.world_size)
    return {"target": exp.topology.launcher, **here, **target_class(exp).reference_site(exp)}


def golden_cache_dir(exp: Experiment, default: Path) -> Path:
    """Where ``exp``'s golden runs are cached when no cache was named (``--golden-cache``):
    where its target says (``Target.golden_cache_dir``: ``default``, the report directory's
    ``.golden``, where the nodes see this host's files; the shared runs root on Slurm)."""
    return target_class(exp).golden_cache_dir(exp, default)


def golden_cache_for(exp: Experiment, named: Path | None, report_dir: Path) -> Path:
    """The golden cache every way of running ``exp`` uses (a run, a campaign, ``--repeat``,
    the pre-launch suite, the pytest plugin, the Chaos Toolkit probe): the one named, else
    ``golden_cache_dir`` with ``report_dir/.golden`` as the default."""
    return named if named is not None else golden_cache_dir(exp, report_dir / ".golden")


def refuse_other_hardware(exp: Experiment, cache_dir: Path, golden: Any,
                          events: list[dict[str, Any]], source: str) -> str:
    """After a run: ``reference from other hardware (A vs B)`` when its rank 0 reported
    another site than ``golden`` (a ``GoldenRun``) ran on (the judge used none of it), and
    then the entry is dropped (``forget``); '' when the sites agree or either is unknown."""
    seen = run_site(events)
    note = other_hardware(golden.site, seen)
    if note and seen is not None:
        forget(exp, cache_dir, golden.key, golden.site, seen, source)
    return note


def forget(exp: Experiment, cache_dir: Path, key: str, ran_on: dict[str, Any] | None,
           seen: dict[str, Any], source: str) -> None:
    """A run met other hardware (``seen``: its rank 0's site) than the reference under ``key``
    ran on (``ran_on``): drop the entry, so that the next run computes the reference again,
    and tell the target what the nodes are (``site_seen``), so that it does so under the key
    of those nodes."""
    with open(cache_dir / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        entry = cache_dir / f"{key}.json"
        with contextlib.suppress(OSError, ValueError):
            if json.loads(entry.read_text()).get("site") == ran_on:  # not a newer one
                entry.unlink()
    site_seen = getattr(target_class(exp), "site_seen", None)
    if site_seen is not None:
        site_seen(exp, seen, source)
