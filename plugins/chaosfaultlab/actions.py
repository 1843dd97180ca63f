"""Chaos Toolkit actions: launch a training job, inject faultlab faults into it, undo them.

Every fault goes through :func:`inject_fault`, which takes any registered faultlab fault type
(``faultlab list faults``) with its ``params`` exactly as in a faultlab experiment (a
third-party fault included); the other fault actions are named shortcuts for built-in faults.
Each injection is journaled in ``RUN_DIR/faultlab-actions/faults.jsonl`` (see
``chaosfaultlab._state``) before and after it happens, so :func:`undo_faults` — the rollback —
can undo it from this process or from a later ``chaos`` process that only knows the run
directory.

``run_dir`` is the job's run directory: one launched by :func:`start_training` or by the
``chaosfaultlab.control`` run context (which sets ``${faultlab_run_dir}`` in the
configuration; ``run_dir`` may then be left out), or that of a job already running, which is
attached to through its ``launch.json`` and event stream.

This module is the extension's contract: the activities, their arguments and docstrings. What
they do beneath lives in private modules: ``chaosfaultlab._inject`` (argument checks and the
journaled injection), ``chaosfaultlab._undo`` (undoing a fault, here or from the journal) and
``chaosfaultlab._jobs`` (the job: its experiment, launch, stop and address).

(No ``from __future__ import annotations`` here: Chaos Toolkit's discovery reads the real
annotation objects to report argument types.)
"""

from pathlib import Path

from chaosfaultlab import _inject, _jobs, _undo
from chaosfaultlab._state import ActionLog
from faultlab.engine.runner import new_run_folder
from faultlab.errors import FaultError, TargetError

__all__ = [
    "continue_all",
    "corrupt_checkpoint",
    "delay_collectives",
    "hang_node",
    "hang_rank",
    "inject_fault",
    "inject_nan",
    "kill_node",
    "kill_rank",
    "partition_collectives",
    "send_spot_notice",
    "start_training",
    "stop_training",
    "undo_faults",
]


# --- injecting --------------------------------------------------------------------------------

def inject_fault(fault_type: str, target: dict | str, params: dict | None = None,
                 run_dir: str | None = None, after_step: int = 0, duration_s: float | None = None,
                 timeout_s: float = 120.0, configuration: dict | None = None) -> dict:
    """Inject any installed faultlab fault into the job in ``run_dir``; return what was done.

    ``fault_type``: a faultlab fault type (``rank_kill``, ``node_kill``, ``rank_hang``,
    ``node_hang`` or a plugin's). ``target``: ``{"rank": N}``, ``{"node": N}`` (index or name)
    or ``"all"``, as the fault type allows. ``params``: the fault's parameters, validated as in
    a faultlab experiment. ``after_step``: first wait (up to ``timeout_s``) until the job has
    completed this step. ``duration_s``: undo a reversible fault after this long (otherwise a
    rollback or the run context's end undoes it).

    Returns ``{id, type, target, injected_t, details}``; the injection is journaled in
    ``RUN_DIR/faultlab-actions/faults.jsonl`` for rollbacks and for ``recovered_within``.
    """
    cls = _inject.fault_class(fault_type)
    fault_params = _inject.fault_params(cls, params)
    kind, value = _inject.parse_target(cls, target)
    if isinstance(after_step, bool) or not isinstance(after_step, int) or after_step < 0:
        raise FaultError(f"after_step: expected an integer >= 0, got {after_step!r}")
    timeout_s = _inject.check_number("timeout_s", timeout_s)
    if duration_s is not None:
        duration_s = _inject.check_number("duration_s", duration_s)
        if not cls.reversible_with(fault_params):
            raise FaultError(f"duration_s: {cls.type} cannot be undone, so it takes no "
                             f"duration; leave duration_s out")
    path = _jobs.resolve_run_dir(run_dir, configuration)
    ctx = _jobs.job_context(path)
    _inject.wait_for_job(ctx, path, kind, value, after_step, timeout_s)
    victim = _inject.resolve_victim(ctx, kind, value)
    return _inject.inject(path, ctx, cls(fault_params), victim, duration_s)


def kill_rank(rank: int, run_dir: str | None = None, signal: str = "KILL", after_step: int = 0,
              timeout_s: float = 120.0, configuration: dict | None = None) -> dict:
    """Kill one rank's process with ``signal`` (KILL, TERM, SEGV or ABRT): a crash or OOM kill.

    Not reversible: the job has to recover by itself."""
    return inject_fault("rank_kill", {"rank": rank}, {"signal": signal}, run_dir,
                        after_step=after_step, timeout_s=timeout_s, configuration=configuration)


def kill_node(node: int | str, run_dir: str | None = None, signal: str = "KILL",
              after_step: int = 0, timeout_s: float = 120.0,
              configuration: dict | None = None) -> dict:
    """Kill a whole node at once (its torchrun agent and every worker): a machine loss.

    ``node``: index or name (``node1``). Not reversible."""
    return inject_fault("node_kill", {"node": node}, {"signal": signal}, run_dir,
                        after_step=after_step, timeout_s=timeout_s, configuration=configuration)


def hang_rank(rank: int, run_dir: str | None = None, duration_s: float | None = None,
              after_step: int = 0, timeout_s: float = 120.0,
              configuration: dict | None = None) -> dict:
    """Freeze one rank's process with SIGSTOP; continued after ``duration_s``, by the
    ``undo_faults`` rollback, or when the run context ends."""
    return inject_fault("rank_hang", {"rank": rank}, None, run_dir, after_step=after_step,
                        duration_s=duration_s, timeout_s=timeout_s, configuration=configuration)


def hang_node(node: int | str, run_dir: str | None = None, duration_s: float | None = None,
              after_step: int = 0, timeout_s: float = 120.0,
              configuration: dict | None = None) -> dict:
    """Freeze a whole node (agent and workers) with SIGSTOP; undone like ``hang_rank``."""
    return inject_fault("node_hang", {"node": node}, None, run_dir, after_step=after_step,
                        duration_s=duration_s, timeout_s=timeout_s, configuration=configuration)


def inject_nan(rank: int, run_dir: str | None = None, param_glob: str = "*",
               value: str = "nan", after_step: int = 0, timeout_s: float = 120.0,
               configuration: dict | None = None) -> dict:
    """Make ``rank``'s local gradient shards of the parameters matching ``param_glob`` NaN (or
    ``value="inf"``) at its next step, through its in-rank runtime agent (``grad_nan`` /
    ``grad_inf``). The job must catch it before the optimizer step."""
    if value not in ("nan", "inf"):
        raise FaultError(f"value: {value!r} is not one of nan, inf")
    return inject_fault(f"grad_{value}", {"rank": rank}, {"param_glob": param_glob}, run_dir,
                        after_step=after_step, timeout_s=timeout_s, configuration=configuration)


def delay_collectives(rank: int, delay_ms: float, run_dir: str | None = None,
                      ops: list | None = None, jitter_ms: float = 0.0,
                      duration_s: float | None = None, after_step: int = 0,
                      timeout_s: float = 120.0, configuration: dict | None = None) -> dict:
    """Hold back every matching collective ``rank`` issues by ``delay_ms`` (± ``jitter_ms``):
    a slow link or a straggler, on any transport. ``ops``: operation names, default all.
    Undone after ``duration_s``, by ``undo_faults``, or when the run context ends."""
    params: dict = {"delay_ms": delay_ms, "jitter_ms": jitter_ms}
    if ops is not None:
        params["ops"] = ops
    return inject_fault("collective_delay", {"rank": rank}, params, run_dir,
                        after_step=after_step, duration_s=duration_s, timeout_s=timeout_s,
                        configuration=configuration)


def partition_collectives(groups: list, run_dir: str | None = None, mode: str = "hang",
                          duration_s: float | None = None, after_step: int = 0,
                          timeout_s: float = 120.0, configuration: dict | None = None) -> dict:
    """Split the ranks into ``groups`` (e.g. ``[[0], [1]]``): collectives spanning groups
    ``hang`` or raise (``mode: error``) on every rank. Undone like ``delay_collectives``."""
    return inject_fault("collective_partition", "all", {"groups": groups, "mode": mode},
                        run_dir, after_step=after_step, duration_s=duration_s,
                        timeout_s=timeout_s, configuration=configuration)


def corrupt_checkpoint(run_dir: str | None = None, kind: str = "bitflip",
                       params: dict | None = None, timeout_s: float = 120.0,
                       configuration: dict | None = None) -> dict:
    """Damage checkpoint files on disk with a storage fault: ``kind`` is ``bitflip``,
    ``truncate``, ``zero_range``, ``delete_shard`` or ``stale_pointer`` (the ``ckpt_<kind>``
    fault; ``params`` as in an experiment, e.g. ``{"which": "latest", "num_bits": 1}``). The job
    must never load the damaged checkpoint."""
    kinds = ("bitflip", "truncate", "zero_range", "delete_shard", "stale_pointer")
    if kind not in kinds:
        raise FaultError(f"kind: {kind!r} is not one of {', '.join(kinds)}")
    return inject_fault(f"ckpt_{kind}", "all", params, run_dir, timeout_s=timeout_s,
                        configuration=configuration)


def send_spot_notice(metadata_url: str, control_token: str, notice_s: float = 120.0,
                     configuration: dict | None = None) -> dict:
    """Make a standalone fake metadata endpoint (``faultlab metadata serve``) announce a spot
    preemption ``notice_s`` from now, through its control endpoint; returns its answer
    (``{"deadline": t}``).

    For a staging node whose trainer polls that endpoint. (In a faultlab experiment the
    ``spot_preemption`` fault runs the endpoints and terminates the node at the deadline.)"""
    import json as _json
    import urllib.error
    import urllib.request

    notice_s = _inject.check_number("notice_s", notice_s)
    req = urllib.request.Request(
        metadata_url.rstrip("/") + "/_faultlab/preempt", method="POST",
        data=_json.dumps({"notice_s": notice_s}).encode(),
        headers={"X-Faultlab-Token": control_token, "Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=10) as resp:
            return dict(_json.loads(resp.read()))
    except urllib.error.HTTPError as e:
        raise FaultError(f"{metadata_url}: HTTP {e.code}: "
                         f"{e.read().decode(errors='replace')[:200]}") from None
    except (OSError, urllib.error.URLError) as e:
        raise FaultError(f"metadata_url: cannot reach {metadata_url!r}: {e}") from None


# --- undoing (rollbacks) ----------------------------------------------------------------------

def undo_faults(run_dir: str | None = None, configuration: dict | None = None) -> dict:
    """Rollback: undo every reversible fault still active in the job (hangs are continued).

    Works from a later ``chaos`` process too: the journal in ``RUN_DIR/faultlab-actions``
    names the processes that were stopped. Returns ``{undone: [ids], errors: {id: why}}``."""
    path = _jobs.resolve_run_dir(run_dir, configuration)
    undone, errors = [], {}
    for state in ActionLog(path).active():
        details = _undo.undo_by_id(path, state.id)
        if details is None:
            continue
        if "undo_error" in details:
            errors[state.id] = details["undo_error"]
        else:
            undone.append(state.id)
    return {"undone": undone, "errors": errors}


def continue_all(run_dir: str | None = None, configuration: dict | None = None) -> list:
    """Rollback of last resort: SIGCONT every process of the job; returns their pids."""
    path = _jobs.resolve_run_dir(run_dir, configuration)
    ctx = _jobs.job_context(path)
    pids = sorted(ctx.pids())
    ctx.continue_all()
    return pids


# --- the job ----------------------------------------------------------------------------------

def start_training(experiment_file: str | None = None, preset: str | None = None,
                   steps: int | None = None, nodes: int | None = None,
                   procs_per_node: int | None = None, min_nodes: int | None = None,
                   checkpoint_every: int | None = None, seed: int | None = None,
                   overrides: dict | None = None, run_dir: str | None = None,
                   report_dir: str = "reports/chaos", name: str = "chaos") -> str:
    """Launch a training job on this host and return its run directory.

    Either ``experiment_file`` (a faultlab experiment: its target, topology, steps and seed are
    used; its faults and SLAs are not — the Chaos Toolkit experiment's method and hypothesis
    play those parts) or the job's shape: ``preset`` (default ``tiny``), ``steps`` (30),
    ``nodes`` (2), ``procs_per_node`` (1), ``min_nodes``, ``checkpoint_every`` (10), ``seed``
    (0) and trainer ``overrides``. The job runs in ``<folder>/job``, the folder being ``run_dir`` if
    given, else a new ``<report_dir>/<name>-<timestamp>`` (an engine run's layout; on Slurm,
    ``job`` links to the cluster's shared filesystem); the job's directory is returned, and is
    what the activities name. The job lives as long as this ``chaos`` process, or
    until ``stop_training`` / the run context's end.
    """
    exp = _jobs.build_experiment(experiment_file, preset=preset, steps=steps, nodes=nodes,
                                 procs_per_node=procs_per_node, min_nodes=min_nodes,
                                 checkpoint_every=checkpoint_every, seed=seed,
                                 overrides=overrides, name=name)
    path = Path(run_dir) if run_dir else new_run_folder(Path(report_dir), exp.name)
    if any((d / "launch.json").exists() and _jobs.job_running(d) for d in (path, path / "job")):
        raise TargetError(f"run_dir: a job is already running in {str(path)!r}; attach to it "
                          f"by passing it as run_dir to the actions, or choose another one")
    return str(_jobs.launch(exp, path).target.run_dir)


def stop_training(run_dir: str | None = None, configuration: dict | None = None) -> dict:
    """Stop and reap a job this ``chaos`` process launched (stopped processes are continued
    first). A job that was attached to is never stopped: that is not ours to end."""
    path = _jobs.resolve_run_dir(run_dir, configuration)
    if _jobs.launched(path) is None:
        raise TargetError(f"run_dir: the job in {str(path)!r} was not launched by this chaos "
                          f"process; chaosfaultlab stops only jobs it launched")
    return _jobs.stop(path)

