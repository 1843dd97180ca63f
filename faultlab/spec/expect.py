"""The ``expect`` section: the service-level assertions an experiment states.

The spec validates each key's type and range. How a key is judged against a measured metric
(which metric, which comparison) is decided by ``faultlab.judge``, whose SLA table has one
entry per field here, in the same order (a test keeps the two in step).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from faultlab.spec._base import SpecModel

__all__ = ["NOISE_K_DEFAULT", "Expect"]

NOISE_K_DEFAULT = 10.0
"""``matches_golden_within_noise: true``: a run may stray 10 times the fault-free spread."""


class Expect(SpecModel):
    """Service-level assertions judged after the run; unset keys are not judged."""

    completes: bool | None = None
    """The job must (true) or must not (false) reach run.steps."""
    max_restarts: int | None = Field(default=None, ge=0)
    """At most this many restarts."""
    detection_latency_s: float | None = Field(default=None, gt=0)
    """Upper bound, seconds."""
    resume_time_s: float | None = Field(default=None, gt=0)
    """Upper bound, seconds."""
    recovery_time_s: float | None = Field(default=None, gt=0)
    """Upper bound, seconds."""
    lost_steps: int | None = Field(default=None, ge=0)
    """Upper bound, steps."""
    goodput: float | None = Field(default=None, gt=0, le=1)
    """Lower bound, a fraction in (0, 1]."""
    bitwise_equal_to_golden: bool | None = None
    """Final state bitwise equal (or not) to the fault-free golden run's. With ``golden:
    {runs: 2}`` and two fault-free runs that differ, not measured (never failed)."""
    matches_golden_within_noise: Annotated[float, Field(gt=0)] | Literal[True] | None = None
    """``k``: the run's losses at every step, and its final weights, stay within ``k`` times
    the spread of two fault-free runs (``true``: 10). For trainers that are not bitwise
    reproducible; runs the golden run twice."""
    samples_exactly_once: bool | None = None
    """Every sample trained on exactly once (or not)."""
    corrupt_checkpoint_never_loaded: bool | None = None
    """No checkpoint a storage fault damaged was ever loaded (or, if false, one was)."""
    emergency_checkpoint_before_deadline: bool | None = None
    """After a preemption notice, an emergency checkpoint was (or was not) committed before
    the deadline."""
    emergency_checkpoint_s: float | None = Field(default=None, gt=0)
    """Upper bound, seconds from the notice to the committed emergency checkpoint."""
    checkpoints_all_finite: bool | None = None
    """Every checkpoint left in the job's folder holds (or not) only finite values; keep them
    all with ``target.overrides.keep_checkpoints`` to cover every checkpoint ever saved."""
    requeue_latency_s: float | None = Field(default=None, gt=0)
    """Upper bound, seconds from the fault to the job running again after the scheduler
    requeued it (``topology.launcher: slurm``); a job never requeued fails it."""
    straggler_detected_within_s: float | None = Field(default=None, gt=0)
    """Upper bound, seconds from slowing a rank down to the trainer naming it."""
    max_slowdown: float | None = Field(default=None, gt=0)
    """Upper bound on the slowdown a slowing fault causes (step time during ÷ before)."""
    save_failure_detected: bool | None = None
    """A save that a storage fault made fail was (or was not) noticed by the job."""
    failed_save_never_loaded: bool | None = None
    """No checkpoint whose save failed, was cut short or was damaged was ever loaded (or, if
    false, one was)."""
    training_continued_through_save_failure: bool | None = None
    """After a failed save the same processes trained on (or did not)."""
    save_hang_detected_within_s: float | None = Field(default=None, gt=0)
    """Upper bound, seconds from a hung save (``io_hang``) to the job noticing it."""
    faulty_node_excluded: bool | None = None
    """The job finished without (true) the node whose GPU stayed failed (``gpu_error`` with
    ``sticky: true``), or did not (false)."""
    restarts_until_excluded: int | None = Field(default=None, ge=1)
    """Upper bound on the restarts from a GPU that stayed failed until the job ran without its
    node; a job that never excluded it fails it."""
    survivor_restarts: int | None = Field(default=None, ge=0)
    """Upper bound on the restarts of the ranks a fault did not strike (torchft: the other
    replica groups step on without one: 0)."""
    survivor_lost_steps: int | None = Field(default=None, ge=0)
    """Upper bound on the steps the ranks a fault did not strike redid or lost (0 expected
    where the stack recovers per step)."""
    healed_by_step: int | None = Field(default=None, ge=1)
    """The struck ranks stepped again (healed) at or before this step."""
    heal_time_s: float | None = Field(default=None, gt=0)
    """Upper bound, seconds from the fault to the struck ranks' first committed step."""
    healed_state_matches_peer: bool | None = None
    """The healed ranks' weights equal (or not) a surviving peer's at every step both recorded
    from the heal on (needs ``observe.step_digest``)."""
    same_resume_point: bool | None = None
    """Every rank of each restart resumed from the same checkpoint step (or, if false, some
    did not): one node with an older view of the checkpoint directory (``stale_shared_fs``)
    must not make its ranks load another checkpoint than the rest."""

    @field_validator("matches_golden_within_noise", mode="before")
    @classmethod
    def _noise_k(cls, value: Any) -> Any:
        if value is True:
            return NOISE_K_DEFAULT
        if value is False:
            raise ValueError("expected k, a number > 0 (or true for the default, "
                             f"{NOISE_K_DEFAULT:g}); leave the key out not to judge it")
        return value

    def items(self) -> list[tuple[str, bool | int | float]]:
        """``(key, bound)`` for every key that is set, in the order of the fields above."""
        return [(k, getattr(self, k)) for k in type(self).model_fields
                if getattr(self, k) is not None]
