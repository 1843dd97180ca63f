"""Chaos Toolkit probes: the state of a training job, read from its run directory.

Every probe reads the job's event stream (``RUN_DIR/events``, the event protocol of
docs/concepts.md) afresh, so it works the same on a job launched by this ``chaos`` process and on
one that was already running. The boolean probes are made for a steady-state hypothesis with
``"tolerance": true``; ``current_step`` suits a ``range`` tolerance; ``final_digest_matches_golden``
answers ``"inconclusive"`` where bitwise equality cannot be judged (a trainer that is not
reproducible), which ``true`` does not accept. Metric definitions (high-water step, recovery
time, completion) are those of ``faultlab.observe.metrics``.

Probes that wait (``training_is_progressing``, ``recovered_within``, ``wait_for_completion``)
wait at most as long as their argument says, and stop early once the answer is known. Why a
probe answered ``false`` is logged on the ``chaostoolkit`` logger (shown by ``chaos run``).

(No ``from __future__ import annotations``: Chaos Toolkit's discovery reads the real
annotation objects.)
"""

import logging
import time
from pathlib import Path
from typing import Any

from chaosfaultlab import _jobs
from chaosfaultlab._state import ActionLog, InjectionState
from faultlab.errors import TargetError
from faultlab.faults import fault_types
from faultlab.judge.noise import reproducibility
from faultlab.observe import EventStream, FaultRecord, compute_metrics

__all__ = [
    "current_step",
    "final_digest_matches_golden",
    "latest_checkpoint_valid",
    "recovered_within",
    "training_is_progressing",
    "wait_for_completion",
]

logger = logging.getLogger("chaostoolkit")
_POLL_S = 0.2
_FLUSH_SLACK_S = 0.5
"""After a deadline, how long events stamped before it may still take to reach the disk."""


def _events(run_dir: Path) -> list[dict[str, Any]]:
    stream = EventStream(run_dir)
    stream.poll()
    return stream.events


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise TargetError(f"{name}: expected a number of seconds >= 0, got {value!r}")
    return float(value)


def _window_s(path: Path, name: str, seconds: Any, cold_starts: Any) -> float:
    """A waiting probe's window: ``seconds``, or when ``cold_starts`` is given (> 0) that many
    times the job's own cold start, its launch to its first step (``faultlab.sla.timing``): a
    window in cold starts holds on a slower machine as on a faster one. The cold start is
    known for a job this process launched once it has made a step; otherwise the probe fails
    with the reason (a window it cannot measure is never a pass)."""
    k = _seconds("cold_starts", cold_starts)
    if not k:
        return _seconds(name, seconds)
    cold = _jobs.cold_start_s(path)
    if cold is None:
        raise TargetError(f"cold_starts: the cold start of the job in {path} is not known (it "
                          f"is for a job this chaos process launched, once it has made a "
                          f"step); give {name} in seconds instead")
    return k * cold


def current_step(run_dir: str | None = None, configuration: dict | None = None) -> int:
    """The highest step the job has completed so far (0 before the first)."""
    stream = EventStream(_jobs.resolve_run_dir(run_dir, configuration))
    stream.poll()
    return stream.max_step()


def training_is_progressing(run_dir: str | None = None, within_s: float = 10.0,
                            configuration: dict | None = None,
                            cold_starts: float = 0.0) -> bool:
    """True if the job completes a new step within ``within_s`` seconds from now (or, given
    ``cold_starts``, within that many times its own launch-to-first-step) — or has completed
    its run (a finished job made all the progress there was to make)."""
    path = _jobs.resolve_run_dir(run_dir, configuration)
    within_s = _window_s(path, "within_s", within_s, cold_starts)
    stream = EventStream(path)
    stream.poll()
    start = stream.max_step()
    deadline = time.monotonic() + within_s
    while True:
        if compute_metrics(stream.events, []).completes:
            return True
        if stream.max_step() > start:
            return True
        if time.monotonic() >= deadline or not _jobs.job_running(path):
            stream.poll()
            if stream.max_step() > start or compute_metrics(stream.events, []).completes:
                return True
            why = "has ended without completing" if not _jobs.job_running(path) else \
                f"made no step in {within_s:g} s"
            logger.warning(f"training_is_progressing: the job in {path} {why} (at step "
                           f"{stream.max_step()})")
            return False
        time.sleep(_POLL_S)
        stream.poll()


def _recovery_s(events: list[dict[str, Any]], fault: InjectionState) -> float | None:
    """Seconds from the fault until the job was again at its pre-fault high-water step."""
    cls = fault_types().get(fault.type)
    record = FaultRecord(id=fault.id, type=fault.type, injected_t=float(fault.injected_t or 0),
                         capabilities=cls.capabilities() if cls else ())
    m = compute_metrics(events, [record]).faults[0]
    if m.recovery_time_s is not None or m.went_down:
        return m.recovery_time_s
    # It did not go down (a hang continued before anyone noticed, a skipped step): recovered
    # once every rank of the world at the fault has completed a step beyond the high water.
    T, H = m.injected_t, m.high_water_step
    before = [e for e in events if e.get("kind") == "step" and e["t"] <= T]
    if not before:
        return None
    world = before[-1].get("world_size")
    if not isinstance(world, int):
        return None
    first: dict[int, float] = {}
    for e in events:
        if (e.get("kind") == "step" and e["t"] > T and isinstance(e.get("step"), int)
                and e["step"] > H and e.get("rank") in range(world)):
            first.setdefault(e["rank"], e["t"])
    return max(first.values()) - T if len(first) == world else None


def recovered_within(seconds: float = 0.0, run_dir: str | None = None,
                     configuration: dict | None = None, cold_starts: float = 0.0) -> bool:
    """True if the job got back to the highest step it had reached before the last injected
    fault within ``seconds`` of that injection (faultlab's recovery time <= ``seconds``), or,
    given ``cold_starts``, within that many times the job's own launch-to-first-step.

    Waits until the answer is known: recovery seen, or ``seconds`` after the injection passed,
    or the job ended. True when no fault was injected (nothing to recover from), so the probe
    can sit in a steady-state hypothesis that is also checked before the method.
    """
    path = _jobs.resolve_run_dir(run_dir, configuration)
    if not (seconds or cold_starts):
        raise TargetError("recovered_within: give seconds, or cold_starts (> 0)")
    seconds = _window_s(path, "seconds", seconds, cold_starts)
    fault = ActionLog(path).last_injected()
    if fault is None:
        logger.info(f"recovered_within: no fault injected into {path} yet; nothing to recover "
                    f"from")
        return True
    deadline_t = float(fault.injected_t or 0) + seconds + _FLUSH_SLACK_S
    stream = EventStream(path)
    while True:
        stream.poll()
        measured = _recovery_s(stream.events, fault)
        if measured is not None:
            break
        if time.time() >= deadline_t or not _jobs.job_running(path):
            stream.poll()
            measured = _recovery_s(stream.events, fault)
            break
        time.sleep(_POLL_S)
    if measured is not None and measured <= seconds:
        return True
    logger.warning(f"recovered_within: after {fault.id} ({fault.type} on {fault.target}) the "
                   f"job " + (f"took {measured:.2f} s to recover" if measured is not None else
                              "did not recover") + f"; required <= {seconds:g} s")
    return False


def latest_checkpoint_valid(run_dir: str | None = None,
                            configuration: dict | None = None) -> bool:
    """True if the newest committed checkpoint passes the full manifest and SHA-256 check
    (the check the trainer makes before loading); False if it fails it or there is none."""
    from faultlab.runtime.manifest import list_checkpoints, verify_checkpoint

    path = _jobs.resolve_run_dir(run_dir, configuration)
    candidates = list_checkpoints(path / "checkpoints")
    if not candidates:
        logger.warning(f"latest_checkpoint_valid: no checkpoint in {path / 'checkpoints'}")
        return False
    reason = verify_checkpoint(candidates[0][1])
    if reason is not None:
        logger.warning(f"latest_checkpoint_valid: {reason}")
    return reason is None


def wait_for_completion(run_dir: str | None = None, timeout_s: float = 300.0,
                        configuration: dict | None = None) -> bool:
    """Wait up to ``timeout_s`` for the job to end; True if it completed its run (faultlab's
    ``completes``: rank 0 exited ``completed`` with a final digest in the last incarnation)."""
    timeout_s = _seconds("timeout_s", timeout_s)
    path = _jobs.resolve_run_dir(run_dir, configuration)
    stream = EventStream(path)

    def done() -> bool:
        stream.poll()
        return compute_metrics(stream.events, []).completes or not _jobs.job_running(path)

    _jobs.wait_until(done, timeout_s)
    if compute_metrics(stream.events, []).completes:
        return True
    state = "still runs" if _jobs.job_running(path) else "ended without completing"
    logger.warning(f"wait_for_completion: the job in {path} {state} after {timeout_s:g} s "
                   f"(at step {stream.max_step()})")
    return False


INCONCLUSIVE = "inconclusive"
"""What ``final_digest_matches_golden`` returns when bitwise equality cannot be judged: a value
a tolerance tells apart from both ``true`` and ``false``."""


def final_digest_matches_golden(run_dir: str | None = None, golden_digest: str | None = None,
                                golden_experiment: str | None = None,
                                golden_cache_dir: str | None = None,
                                timeout_s: float = 600.0,
                                configuration: dict | None = None) -> bool | str:
    """True if the job's final state is bitwise equal to a fault-free golden run's.

    The golden digest is ``golden_digest`` if given; else the (cached) golden run of
    ``golden_experiment`` (a faultlab experiment file); else, for a job launched by
    ``start_training`` or the run context, the golden run of the experiment it was launched
    from. Golden runs are cached in ``golden_cache_dir``; by default where ``faultlab run``
    caches them (``reports/.golden``; on Slurm the shared runs root's). False if the
    job has no final digest (it did not complete).

    ``"inconclusive"`` (neither true nor false) when that experiment asks for two fault-free
    runs (``golden: {runs: 2}``) and they differ: the trainer is not bitwise reproducible, so
    no digest of it can match; the log says from which step they differ and what to do. A
    tolerance of ``true`` does not accept it; ``[true, "inconclusive"]`` would.
    """
    path = _jobs.resolve_run_dir(run_dir, configuration)
    not_reproducible = None
    if golden_digest is None:
        golden = _golden(path, golden_experiment,
                         Path(golden_cache_dir) if golden_cache_dir else None,
                         _seconds("timeout_s", timeout_s))
        repro = reproducibility(golden)
        not_reproducible = repro.note() if repro is not None and not repro.reproducible \
            else None
        if not_reproducible is None and golden.digest is None:
            raise TargetError(f"the golden run in {golden.run_dir} produced no final digest")
        golden_digest = golden.digest
    digest = compute_metrics(_events(path), []).final_digest
    if digest is None:
        logger.warning(f"final_digest_matches_golden: the job in {path} has no final digest "
                       f"(it has not completed)")
        return False
    if not_reproducible is not None:
        logger.warning(f"final_digest_matches_golden: {INCONCLUSIVE}: {not_reproducible}")
        return INCONCLUSIVE
    if digest != golden_digest:
        logger.warning(f"final_digest_matches_golden: final digest {digest[:16]}… differs "
                       f"from the golden run's {str(golden_digest)[:16]}…")
    return digest == golden_digest


def _golden(run_dir: Path, golden_experiment: str | None, cache_dir: Path | None,
            timeout_s: float) -> Any:
    """The golden run (``faultlab.engine.golden.GoldenRun``) of the experiment named, or of
    the one the job was launched from: as many fault-free runs as it asks for, cached in
    ``cache_dir`` (None: where ``faultlab run`` caches it)."""
    import json

    from faultlab.engine.golden import GoldenRunFailed, golden_cache_for, golden_run
    from faultlab.errors import InvalidExperimentError
    from faultlab.spec import experiment_from_dict, load_experiment

    launched_from = run_dir / "faultlab-actions" / _jobs.EXPERIMENT_FILE
    try:
        if golden_experiment:
            exp = load_experiment(golden_experiment)
        elif launched_from.exists():
            exp = experiment_from_dict(json.loads(launched_from.read_text()), launched_from)
        else:
            raise TargetError(f"final_digest_matches_golden: the job in {run_dir} was not "
                              f"launched by chaosfaultlab, so its golden run is unknown; pass "
                              f"golden_digest or golden_experiment")
    except InvalidExperimentError as e:
        raise TargetError(f"golden_experiment: {e}") from None
    try:  # on the job's own target, like the engine's
        return golden_run(exp, golden_cache_for(exp, cache_dir, Path("reports")),
                          timeout_s=timeout_s, runs=exp.golden.runs)
    except GoldenRunFailed as e:
        raise TargetError(str(e)) from None
