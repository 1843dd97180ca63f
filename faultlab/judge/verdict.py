"""The verdict of one run: every SLA of ``expect`` against the measured metrics, the final
digest against the golden run's, and whether each fault was injected at all.

``judge`` returns one ``SLAResult`` per check; the run passes when every one of them does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from faultlab.judge.noise import reproducibility, run_losses, within_noise
from faultlab.judge.slas import CAMPAIGN_SLAS, SLA_KINDS, SLAS
from faultlab.observe import FaultRecord, Metrics
from faultlab.observe.final_state import FinalState, final_checkpoint_path, first_difference
from faultlab.observe.launch_findings import LaunchFinding
from faultlab.observe.metrics import UNFINISHED_RUN, completion
from faultlab.observe.node_exits import final_world_shortfall, struck_nodes, unclean_node_exit
from faultlab.observe.save_failures import sign_note, struck
from faultlab.spec import Experiment, arrival_times_s

__all__ = ["Golden", "SLAResult", "judge"]


class Golden(Protocol):
    """What the judge needs of a golden run (the engine's ``GoldenRun``): its final digest,
    and for a job without a digest event its final checkpoint's tensor hashes."""

    @property
    def digest(self) -> str | None: ...

    @property
    def tensors(self) -> dict[str, str]: ...

    @property
    def not_measured(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class SLAResult:
    name: str
    bound: Any
    measured: Any
    passed: bool
    note: str = ""

    def describe(self) -> str:
        campaign = CAMPAIGN_SLAS.get(self.name)
        kind = campaign.kind if campaign else SLA_KINDS.get(self.name, "bool")
        op = {"max": "<=", "min": ">=", "bool": "=="}[kind]
        measured = "not measured" if self.measured is None else repr(self.measured)
        return f"{self.name}: measured {measured}, required {op} {self.bound!r}" + \
            (f" ({self.note})" if self.note else "")


def judge(exp: Experiment, metrics: Metrics, golden: Golden | None, *,
          timed_out: bool, faults: list[FaultRecord],
          events: Sequence[Mapping[str, Any]] = (),
          final_state: FinalState | None = None,
          job_s: float | None = None,
          findings: Sequence[LaunchFinding] = (),
          node_exits: Mapping[str, int | None] | None = None,
          lost_nodes: Collection[str] = (),
          stopped_nodes: Collection[str] = (),
          losses: Mapping[int, float] | None = None) -> list[SLAResult]:
    """Every SLA of ``expect`` against the measured metrics, plus the implicit check that each
    fault was injected at least once (an experiment whose fault never fired proved nothing).

    ``events`` and ``final_state`` (a job judged by its final checkpoint) only sharpen the
    notes: which tensor differs first from the golden run, which damaged checkpoint was loaded
    at which step, why the bitwise verdict could not be measured; ``job_s`` (how long the job
    ran, on the clock the triggers read) says which time trigger the run never reached;
    ``findings`` (the team's launch line at work: ``faultlab.observe.launch_findings``) are
    added to the note of every SLA they explain that failed.

    ``completes`` also asks of the nodes (``faultlab.observe.node_exits``): the final
    incarnation's world is the topology's (an elastic one shrunk only by the nodes the faults
    struck, not below ``min_nodes``), and each node no fault struck exited 0. ``node_exits``
    is the target's exit code per node (``Target.result().returncodes``; None: that half is not
    measured), ``lost_nodes`` its nodes lost on purpose (``killed``), ``stopped_nodes`` those
    the engine stopped because training had completed and they still ran."""
    out = []
    fired = {f.id.split("#")[0] for f in faults if not f.details.get("error")}
    for i, spec in enumerate(exp.faults):
        fid = spec.id
        idle = _struck_nothing(spec, [f for f in faults if f.id.split("#")[0] == fid])
        hit = fid in fired and not idle
        out.append(SLAResult(f"fault_injected[{fid}]", True, hit, hit,
                             idle if fid in fired else _not_fired(exp, i, faults, metrics,
                                                                  events, job_s)))
    restarted = getattr(golden, "restarts", 0) or 0
    if restarted:  # a finding about the stack itself, whatever the faults showed
        failures = list(getattr(golden, "failures", ()) or ())
        out.append(SLAResult(
            "golden_run_fault_free", 0, restarted, False,
            f"the fault-free golden run needed {restarted} restart(s)"
            + (f": {failures[-1]}" if failures else "")
            + "; the stack restarts without any fault (not cached: the next run measures again)"))
    values = metrics.to_dict()
    if golden is not None and metrics.final_digest is not None and golden.digest is not None \
            and metrics.completes:  # an unfinished run's last checkpoint is not its final state
        values["bitwise_equal_to_golden"] = metrics.final_digest == golden.digest
    # Two fault-free runs that differ: the bitwise verdict has nothing to do with recovery.
    repro = reproducibility(golden) if golden is not None else None
    within = None
    if exp.expect.matches_golden_within_noise is not None:
        within = within_noise(golden, losses if losses is not None else run_losses(events),
                              final_state.path if final_state is not None else
                              final_checkpoint_path(events),
                              exp.expect.matches_golden_within_noise)
        values["matches_golden_within_noise"] = within.measured
    unfinished = _unfinished(metrics, timed_out)
    for name, bound in exp.expect.items():
        sla = SLAS[name]
        measured = values.get(sla.metric)
        note = ""
        if name == "bitwise_equal_to_golden" and golden is None:
            note = "no golden run"
        if name == "completes" and timed_out:
            measured, note = False, f"timed out after {exp.run.timeout_s:g} s"
            if not metrics.max_step:
                note += " without reaching a single step (see the nodes' logs)"
        elif name == "completes" and measured is False:
            note = _last_failure(events) or completion(list(events))[1] or note
        elif name == "completes" and measured is True:
            short = _nodes_fell_short(exp, faults, events, node_exits, lost_nodes,
                                      stopped_nodes)
            if short:
                measured, note = False, short
        if name == "bitwise_equal_to_golden":
            note = _bitwise_note(measured, golden, final_state) or note
        if name == "bitwise_equal_to_golden" and repro is not None and not repro.reproducible:
            out.append(SLAResult(name, bound, None, True, repro.note()))  # never failed
            continue
        if name == "matches_golden_within_noise" and within is not None:
            if not metrics.completes:
                within = dataclasses.replace(within, measured=None, note=(
                    "not measured: the run did not complete; " + within.note))
            out.append(SLAResult(name, bound, within.measured,
                                 within.measured is not None and within.passed, within.note))
            continue
        if name in ("corrupt_checkpoint_never_loaded", "failed_save_never_loaded") and \
                measured is False:
            note = _loaded_damage(faults, events) or _loaded_failed_save(events) or note
        if name == "save_failure_detected" and measured is False:
            note = "; ".join(sign_note(events, f) for f in faults if struck(f)
                             and metrics.save_failure_detected is False) or note
        if name == "training_continued_through_save_failure" and measured is False:
            restarted = metrics.restarts > 0
            note = ("the processes that failed the save did not train on: the job "
                    + ("was restarted" if restarted else "stopped") + " after it")
        if name in ("save_failure_detected", "training_continued_through_save_failure",
                    "save_hang_detected_within_s", "failed_save_never_loaded") and \
                measured is None and not note and not any(struck(f) for f in faults):
            note = ("not measured: no io_error, disk_full or io_hang fault hit an operation, "
                    "and the job reported no failed save")
        if name == "detection_latency_s" and measured is None and fired and \
                not any(f.went_down or f.detection_latency_s is not None
                        for f in metrics.faults):
            note = note or "not measured: the job never noticed the fault (no error, restart, " \
                           "anomaly or exit after it)"
        if name in ("restarts_until_excluded", "faulty_node_excluded") and not measured \
                and fired:
            lasting = [str(f.details.get("node")) for f in faults if f.details.get("sticky")]
            if lasting:
                note = note or (f"the job never ran without {', '.join(lasting)} (its GPU "
                                f"stayed failed); {metrics.restarts} restart(s) used")
        if name == "same_resume_point" and measured is not None:
            note = _resume_points(metrics)
        if name in _HEALING_SLAS and metrics.healing_note:
            note = metrics.healing_note
        if name == "max_restarts" and timed_out and measured is not None and \
                sla.holds(measured, bound):
            # faultlab stopped the job: the restarts it would still have spent are unknown
            measured, note = None, f"{metrics.restarts} restart(s) before {unfinished}"
        if measured is None and unfinished and (sla.metric in UNFINISHED_RUN
                                                or name == "bitwise_equal_to_golden"):
            why = UNFINISHED_RUN.get(sla.metric, "its last checkpoint is not a final state")
            note = note or f"not measured: {unfinished}; {why}"
        if name == "detection_latency_s" and measured is not None:
            first = max((f for f in metrics.faults if f.detection_latency_s is not None),
                        key=lambda f: f.detection_latency_s or 0.0)
            note = f"{first.fault_id}: {first.detected_by} [{first.detection_source}]"
        if measured is None:
            note = note or "not measured: the run ended without the events it needs"
        passed = measured is not None and sla.holds(measured, bound)
        if not passed:
            why = [f"{f.text}; to change it: {f.change}" for f in findings if name in f.affects]
            note = "; ".join(filter(None, [note, *why]))
        out.append(SLAResult(name, bound, measured, passed, note))
    return out


def _nodes_fell_short(exp: Experiment, faults: list[FaultRecord],
                      events: Sequence[Mapping[str, Any]],
                      node_exits: Mapping[str, int | None] | None,
                      lost: Collection[str], stopped: Collection[str]) -> str:
    """Why a job whose ranks completed did not complete on its nodes ('' if it did): its
    final world fell short of the topology, or a node no fault struck exited non-zero."""
    topo = exp.topology
    names = [n for n in node_exits or () if not n.startswith("job ")] or \
        [f"node{i}" for i in range(topo.nodes)]  # a Slurm job's one code is no node's
    struck, struck_all = struck_nodes(faults, events, names)
    return "; ".join(filter(None, [
        final_world_shortfall(events, nodes=topo.nodes, procs_per_node=topo.procs_per_node,
                              min_nodes=topo.min_nodes,
                              struck=topo.nodes if struck_all else min(len(struck),
                                                                       topo.nodes)),
        unclean_node_exit(node_exits or {}, struck=struck, struck_all=struck_all, lost=lost,
                          stopped=stopped,
                          any_struck=any(not f.details.get("error") for f in faults))]))


_HEALING_SLAS = ("survivor_restarts", "survivor_lost_steps", "healed_by_step", "heal_time_s",
                 "healed_state_matches_peer")


def _struck_nothing(spec: Any, records: list[FaultRecord]) -> str:
    """Why a storage fault that was set proved nothing: its rule was in force for the whole
    run and hit no operation of the job ('' if it hit one, or if the count is unknown)."""
    if not getattr(spec.fault_class, "mounts_storage", False) or not records:
        return ""
    undos: list[dict[str, Any]] = [u if isinstance(u := f.details.get("undo"), dict) else {}
                                   for f in records]
    counts = [u.get("num_ops_hit", u.get("num_ops_answered")) for u in undos]
    if any(not isinstance(c, int) or c > 0 for c in counts):
        return ""
    where = records[0].details.get("storage") or "the checkpoint directory"
    if records[0].details.get("nfs"):  # stale_shared_fs: a node's view, no rule
        return (f"{records[0].details.get('node')}'s view of {where} answered no operation "
                f"in the whole run: none of its processes looked at the checkpoints while it "
                f"was in force")
    ops = ", ".join(getattr(spec.params, "ops", ()) or ("write",))
    return (f"set on {where}, but it struck no operation in the whole run: the job did no "
            f"matching {ops} there while it was in force; if its checkpoints go elsewhere, "
            f"name that directory as target.checkpoint_dir")


def _unfinished(metrics: Metrics, timed_out: bool) -> str:
    """How the run fell short of finishing ('' if it completed)."""
    if metrics.completes:
        return ""
    if timed_out:
        return f"faultlab stopped the job at step {metrics.max_step} (timeout)"
    return f"the run did not complete (it stopped at step {metrics.max_step})"


def _not_fired(exp: Experiment, index: int, faults: list[FaultRecord], metrics: Metrics,
               events: Sequence[Mapping[str, Any]], job_s: float | None) -> str:
    """Why fault ``index`` was never injected: the injection failed, or the run ended before
    its trigger (the step, the time, the event or the first seeded arrival) was reached."""
    spec = exp.faults[index]
    failed = [f.details["error"] for f in faults
              if f.id.split("#")[0] == spec.id and f.details.get("error")]
    if failed:
        return f"the trigger fired but the injection failed: {failed[0]}"
    t = spec.trigger
    ran = f"{job_s:.1f} s" if job_s is not None else None
    if t.at_step is not None:
        if metrics.max_step < t.at_step:
            return (f"trigger never reached: the run ended at step {metrics.max_step}, before "
                    f"at_step {t.at_step}" + (f" (after {ran})" if ran else ""))
        return (f"step {t.at_step} was reached but no injection was recorded: a fault planned "
                f"in the ranks never reported striking (no fault_injected event for "
                f"{spec.id!r}), or the job ended before faultlab could fire it")
    if t.at_time_s is not None and job_s is not None and job_s < t.at_time_s:
        return (f"trigger never reached: the run ended at {ran}, before at_time_s "
                f"{t.at_time_s:g} s (trigger earlier, or run longer)")
    if t.after_event is not None:
        want = t.after_event
        seen = sum(1 for e in events if e.get("kind") == want.kind
                   and all(k in e and e[k] == v for k, v in want.match.items()))
        if seen < want.count:
            matching = f" matching {dict(want.match)}" if want.match else ""
            return (f"trigger never reached: the run ended after {seen} {want.kind} event"
                    f"{'' if seen == 1 else 's'}{matching}, before the {_nth(want.count)}")
    if t.every is not None and job_s is not None:
        arrivals = arrival_times_s(exp, index)
        if not arrivals or arrivals[0] > job_s:
            first = f"at {arrivals[0]:.1f} s" if arrivals else "within the run"
            return (f"trigger never reached: the first seeded arrival ({first}) came after "
                    f"the run ended at {ran}")
    return "the trigger fired but no injection was recorded"


def _nth(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _bitwise_note(measured: Any, golden: Golden | None, final: FinalState | None) -> str:
    """Why the bitwise verdict is what it is, where a checkpoint read-back says more."""
    if measured is None:
        for side, state in (("this run", final), ("the golden run", golden)):
            reason = getattr(state, "not_measured", None)
            if reason:
                return f"not measured: {reason} ({side})"
        return ""
    ours, theirs = (final.tensors if final else {}), (getattr(golden, "tensors", None) or {})
    if measured is False and ours and theirs:
        differs = first_difference(ours, theirs)
        return f"first differing tensor: {differs}" if differs else ""
    return ""


def _resume_points(metrics: Metrics) -> str:
    """Which checkpoint step each rank resumed from, after each fault whose restart split
    them (or, when none did, the step they agreed on)."""
    split = [f for f in metrics.faults if f.resumed_from_steps and len(f.resumed_from_steps) > 1]
    if not split:
        agreed = sorted({s for f in metrics.faults for s in f.resumed_from_steps or []})
        return f"every restart's ranks resumed from one step ({', '.join(map(str, agreed))})"
    parts = []
    for f in split:
        by_step: dict[int, list[str]] = {}
        for rank, got in sorted((f.resumed_by_rank or {}).items()):
            where = f"{got['node']} (rank {rank})" if got.get("node") else f"rank {rank}"
            by_step.setdefault(got["step"], []).append(where)
        steps = "; ".join(f"step {s} on {', '.join(w)}" for s, w in sorted(by_step.items()))
        parts.append(f"after {f.fault_id}: {steps}")
    return "the ranks of one restart loaded different checkpoints: " + " | ".join(parts)


def _last_failure(events: Sequence[Mapping[str, Any]]) -> str:
    """How the last rank that failed ended: its exit reason and error."""
    failed = [e for e in events if e.get("kind") == "exit"
              and e.get("reason") not in ("completed", "stopped")]
    if not failed:
        return ""
    last = max(failed, key=lambda e: float(e.get("t") or 0))
    error = str(last.get("error") or "").splitlines()[0][:160] if last.get("error") else ""
    return (f"the last failure: rank {last.get('rank')} exited {last.get('reason')}"
            + (f" ({error})" if error else "")
            + f" after {len(failed)} failed exit(s) in all")


def _loaded_failed_save(events: Sequence[Mapping[str, Any]]) -> str:
    """Which failed save the job loaded, and when it had reported the failure."""
    failed = [e for e in events if e.get("kind") == "anomaly"
              and e.get("what") in ("checkpoint_save_failed", "checkpoint_save_hung")
              and isinstance(e.get("path"), str)]
    for e in events:
        if e.get("kind") != "checkpoint_loaded" or not isinstance(e.get("path"), str):
            continue
        for f in failed:
            p, q = e["path"].rstrip("/"), f["path"].rstrip("/")
            if (p == q or p.startswith(q + "/") or q.startswith(p + "/")) and \
                    float(e.get("t") or 0) > float(f.get("t") or 0):
                return (f"rank {e.get('rank')} loaded {e['path']} (step {e.get('step')}) after "
                        f"its save was reported {f.get('what')} at step {f.get('step')}")
    return ""


def _loaded_damage(faults: list[FaultRecord], events: Sequence[Mapping[str, Any]]) -> str:
    """Which checkpoint a storage fault damaged the job then loaded: file, offset and step."""
    for f in faults:
        damaged = set(f.details.get("checkpoints") or [])
        for e in events:
            if e.get("kind") == "checkpoint_loaded" and e.get("path") in damaged and \
                    float(e.get("t") or 0) > f.injected_t:
                hits = [h for key in ("flips", "truncated", "zeroed") for h in
                        (f.details.get(key) or []) if isinstance(h, dict)]
                where = "; ".join(f"{h.get('file')} at offset {h.get('offset')}"
                                  for h in hits[:3]) or ", ".join(map(str, f.details.get(
                                      "deleted") or [])) or "its files"
                return (f"rank {e.get('rank')} loaded {e.get('path')} (step {e.get('step')}) "
                        f"after {f.id} ({f.type}) damaged {where}, and trained on")
    return ""
