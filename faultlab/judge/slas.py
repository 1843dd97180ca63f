"""The SLAs: for every key an experiment may state under ``expect``, the metric it is judged
against and how (an upper bound, a lower bound, or an expected truth value).

The spec's ``Expect`` model says which keys exist and what values they take; this table says
what each one means. It has one entry per ``Expect`` field, in the same order (a test keeps
the two in step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["CAMPAIGN_SLAS", "SLAS", "SLA_KINDS", "Sla"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Sla:
    """How one ``expect`` key is judged against a measured metric."""

    key: str
    """The key under ``expect``."""
    metric: str
    """Name of the measured metric (faultlab.observe)."""
    kind: Literal["max", "min", "bool"]
    """``max``: measured <= bound; ``min``: measured >= bound; ``bool``: measured == expected."""
    unit: str
    """What the measured value counts: ``s``, ``steps``, ``restarts``, ``ratio``, ``bool`` ..."""
    description: str

    def holds(self, measured: float | bool, bound: float | bool) -> bool:
        if self.kind == "max":
            return measured <= bound
        if self.kind == "min":
            return measured >= bound
        return bool(measured) == bool(bound)


SLAS: dict[str, Sla] = {s.key: s for s in [
    Sla(key="completes", unit="bool", metric="completes", kind="bool",
        description="the job reached run.steps and exited cleanly: every rank of its final "
                    "incarnation, at the topology's world size (an elastic job: less only the "
                    "nodes a fault struck, not below min_nodes), and every node no fault "
                    "struck with exit 0"),
    Sla(key="max_restarts", unit="restarts", metric="restarts", kind="max",
        description="restarts of the job (torchrun restarts of the worker group)"),
    Sla(key="detection_latency_s", unit="s", metric="detection_latency_s", kind="max",
        description="fault injected → first sign the job noticed"),
    Sla(key="resume_time_s", unit="s", metric="resume_time_s", kind="max",
        description="fault injected → first completed step after the job came back"),
    Sla(key="recovery_time_s", unit="s", metric="recovery_time_s", kind="max",
        description="fault injected → the job is back at its highest step before the fault"),
    Sla(key="lost_steps", unit="steps", metric="lost_steps", kind="max",
        description="highest step before the fault − step it resumed from"),
    Sla(key="goodput", unit="ratio (0-1)", metric="goodput", kind="min",
        description="useful step time ÷ wall time over the run"),
    Sla(key="bitwise_equal_to_golden", unit="bool", metric="bitwise_equal_to_golden", kind="bool",
        description="final digest equals the fault-free golden run's"),
    Sla(key="matches_golden_within_noise", unit="noise units",
        metric="matches_golden_within_noise", kind="max",
        description="largest distance to the golden run (per-step loss, final weights) in "
                    "units of two fault-free runs' spread"),
    Sla(key="samples_exactly_once", unit="bool", metric="samples_exactly_once", kind="bool",
        description="every sample was trained on exactly once"),
    Sla(key="corrupt_checkpoint_never_loaded", unit="bool",
        metric="corrupt_checkpoint_never_loaded",
        kind="bool", description="no checkpoint damaged by a storage fault was loaded"),
    Sla(key="emergency_checkpoint_before_deadline", unit="bool",
        metric="emergency_checkpoint_before_deadline", kind="bool",
        description="after a preemption notice, an emergency checkpoint was committed before "
                    "the termination deadline"),
    Sla(key="emergency_checkpoint_s", unit="s", metric="emergency_checkpoint_s", kind="max",
        description="preemption notice → emergency checkpoint committed"),
    Sla(key="checkpoints_all_finite", unit="bool", metric="checkpoints_all_finite", kind="bool",
        description="every checkpoint the job left holds only finite values (read back after "
                    "the run)"),
    Sla(key="requeue_latency_s", unit="s", metric="requeue_latency_s", kind="max",
        description="fault injected → the scheduler requeued the job → running again "
                    "(slurm)"),
    Sla(key="straggler_detected_within_s", unit="s",
        metric="straggler_detected_within_s", kind="max",
        description="a rank slowed down → the trainer names it in an anomaly"),
    Sla(key="max_slowdown", unit="ratio (x)", metric="slowdown", kind="max",
        description="median step time while a slowing fault is in force ÷ the median before "
                    "it"),
    Sla(key="save_failure_detected", unit="bool", metric="save_failure_detected", kind="bool",
        description="a save that io_error, disk_full or io_hang made fail was noticed (an "
                    "anomaly, a watchdog, a rank that failed), not taken for saved"),
    Sla(key="failed_save_never_loaded", unit="bool", metric="failed_save_never_loaded", kind="bool",
        description="no checkpoint whose save failed or was cut short (or that a storage "
                    "fault damaged) was loaded"),
    Sla(key="training_continued_through_save_failure", unit="bool",
        metric="training_continued_through_save_failure", kind="bool",
        description="after a failed save the same processes trained on, without a restart"),
    Sla(key="save_hang_detected_within_s", unit="s",
        metric="save_hang_detected_within_s", kind="max",
        description="io_hang struck a save → the job noticed (detection_latency_s, counting "
                    "only signs of a failed save)"),
    Sla(key="faulty_node_excluded", unit="bool", metric="faulty_node_excluded", kind="bool",
        description="the job finished without the node whose GPU stayed failed (sticky "
                    "gpu_error; faultlab.observe.exclusion)"),
    Sla(key="restarts_until_excluded", unit="restarts",
        metric="restarts_until_excluded", kind="max",
        description="GPU failed for good → restarts until the job ran without its node"),
    Sla(key="survivor_restarts", unit="restarts", metric="survivor_restarts", kind="max",
        description="restarts of the ranks no fault struck, after the first fault "
                    "(faultlab.observe.healing)"),
    Sla(key="survivor_lost_steps", unit="steps", metric="survivor_lost_steps", kind="max",
        description="steps the ranks no fault struck redid or lost"),
    Sla(key="healed_by_step", unit="step", metric="healed_at_step", kind="max",
        description="the step at which the struck ranks stepped again (healed)"),
    Sla(key="heal_time_s", unit="s", metric="heal_time_s", kind="max",
        description="fault injected (or undone) → the struck ranks' first committed step"),
    Sla(key="healed_state_matches_peer", unit="bool",
        metric="healed_state_matches_peer", kind="bool",
        description="the healed ranks' weights equal a survivor's at every step both "
                    "recorded (observe.step_digest)"),
    Sla(key="same_resume_point", unit="bool", metric="same_resume_point", kind="bool",
        description="every rank of each restart resumed from the same checkpoint step"),
]}
"""Every SLA an experiment may state under ``expect``; add a field to
``faultlab.spec.Expect`` and an entry here to add one."""

CAMPAIGN_SLAS: dict[str, Sla] = {s.key: s for s in [
    Sla(key="ettr", unit="ratio (0-1)", metric="ettr", kind="min",
        description="effective training time ratio of the campaign: useful step time ÷ wall "
                    "time"),
    Sla(key="detection_rate", unit="ratio (0-1)", metric="detection_rate", kind="min",
        description="injections the job detected ÷ injections"),
    Sla(key="attribution_accuracy", unit="ratio (0-1)", metric="attribution_accuracy", kind="min",
        description="detected injections whose victim the job named ÷ attributable ones"),
    Sla(key="false_positives_per_hour", unit="per hour",
        metric="false_positives_per_hour", kind="max",
        description="detections, restarts and anomalies of the fault-free golden run per hour"),
    Sla(key="recovery_time_p95_s", unit="s", metric="recovery_time_p95_s", kind="max",
        description="95th percentile of the injections' recovery time (an unrecovered one "
                    "counts as infinite)"),
]}
"""A campaign's own ``expect`` keys (``faultlab.spec.campaign.CampaignExpect``), judged against
``faultlab.observe.campaign.CampaignScore``, in the order of ``CAMPAIGN_SLAS`` there."""

SLA_KINDS: dict[str, Literal["max", "min", "bool"]] = {k: s.kind for k, s in SLAS.items()}
"""``expect`` key → comparison kind (an experiment's; a campaign's are in CAMPAIGN_SLAS)."""
