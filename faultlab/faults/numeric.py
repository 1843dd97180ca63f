"""Numeric faults: corrupt what a rank computes — gradients, the loss, the weights in memory.

They strike inside the victim ranks through their rank-side actions
(``faultlab.runtime.actions.numeric`` documents the mechanism), at the victim's next step after
the trigger, once per (fault, rank, step) for the whole job: an in-process rollback or a
restarted process replaying that step is not hit again. None is reversible: the value is
corrupted the moment it strikes, and detecting and recovering from it is the job's business
(skip, roll back, abort).
"""

from __future__ import annotations

from pydantic import Field, field_validator

from faultlab.faults.runtime_base import RuntimeFault, RuntimeFaultParams

__all__ = ["GradInfFault", "GradNanFault", "LossSpikeFault", "WeightBitflipFault"]

_SEED = Field(None, ge=0, lt=2**63, description="seed of the random choices; default: derived "
                                                 "from the fault id (same experiment, same "
                                                 "choices)")


class _GradParams(RuntimeFaultParams):
    param_glob: str = Field("*", min_length=1, description="parameters to hit: fnmatch pattern "
                                                           "on the parameter FQN, e.g. "
                                                           "'blocks.0.*'")
    fraction: float = Field(1.0, gt=0.0, le=1.0, description="fraction of the matching "
                                                             "parameters to hit (seeded "
                                                             "choice, at least one)")
    seed: int | None = _SEED


class GradNanFault(RuntimeFault):
    """Fill the victim rank's local gradient shard of some parameters with NaN (a bad kernel,
    an overflow), after the reduce-scatter and before the optimizer step."""

    type = "grad_nan"
    family = "numeric"
    rank_action = "faultlab.runtime.actions.numeric:GradNan"

    class Params(_GradParams):
        pass


class GradInfFault(RuntimeFault):
    """Fill the victim rank's local gradient shard of some parameters with +Inf, after the
    reduce-scatter and before the optimizer step."""

    type = "grad_inf"
    family = "numeric"
    rank_action = "faultlab.runtime.actions.numeric:GradInf"

    class Params(_GradParams):
        pass


class LossSpikeFault(RuntimeFault):
    """Multiply the victim rank's loss by ``scale`` for one step (needs the trainer's
    ``rt.loss(loss)`` hook): a bad batch, a finite but huge gradient."""

    type = "loss_spike"
    family = "numeric"
    rank_action = "faultlab.runtime.actions.numeric:LossSpike"

    class Params(RuntimeFaultParams):
        scale: float = Field(1e4, allow_inf_nan=False,
                             description="factor applied to the loss (not 0)")

        @field_validator("scale")
        @classmethod
        def _not_zero(cls, v: float) -> float:
            if v == 0:
                raise ValueError("0 is not allowed")
            return v


class WeightBitflipFault(RuntimeFault):
    """Flip bits of the victim rank's local weight shard in memory at step start: silent data
    corruption (a cosmic ray, a bad DIMM) that no error reports."""

    type = "weight_bitflip"
    family = "numeric"
    rank_action = "faultlab.runtime.actions.numeric:WeightBitflip"

    class Params(RuntimeFaultParams):
        param_glob: str = Field("*", min_length=1, description="parameters eligible: fnmatch "
                                                               "pattern on the FQN")
        num_bits: int = Field(1, ge=1, le=4096, description="bits to flip, each in a seeded "
                                                            "parameter and element")
        bit_index: int | None = Field(None, ge=0, le=63, description="bit within the element "
                                                                     "(0 = least significant; "
                                                                     "30 = top exponent bit of "
                                                                     "float32); default seeded")
        seed: int | None = _SEED
