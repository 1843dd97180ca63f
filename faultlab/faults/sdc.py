"""Silent data corruption: a mercurial rank that computes wrong but finite numbers, every step.

``sdc`` strikes inside the victim ranks through its rank-side action
(``faultlab.runtime.actions.sdc`` documents the mechanism of each surface), from its trigger
step on, every step, for as long as its ``lifetime`` lasts: unlike the numeric faults, which
strike once per (fault, rank, step), a bad device is wrong every time. Nothing reports it: no
exception, no NaN (unless a flipped exponent bit makes one); whether the job notices is the
business of its monitors (``observe.detections``). Every strike is recorded as a
``fault_struck`` event (step, rank, surface, op, elements, magnitude, where): the ground truth
that detection is scored against. It cannot be undone: what it corrupted stays corrupted.

Planning: with an ``at_step`` trigger it is part of the launch plan, from that step to the end
of the job, so a restarted process (``lifetime: job``) or the next process on the node
(``lifetime: node``) meets it again. With another trigger it is injected live into the running
victim processes only, which is ``lifetime: process``; the other lifetimes are refused there.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator

from faultlab.errors import FaultError
from faultlab.fault_api import FaultContext, Victim
from faultlab.faults.runtime_base import RuntimeFault, RuntimeFaultParams

__all__ = ["SdcFault"]

_SURFACES = ("activation", "gradient", "update", "weights")


def _only_with(info: ValidationInfo, key: str, allowed: tuple[str, ...], field: str) -> None:
    """Refuse ``field`` (set explicitly) when ``key`` is not one of ``allowed``."""
    value = info.data.get(key)
    if value is not None and value not in allowed:
        raise ValueError(f"{field} applies only with {key}: {' or '.join(allowed)}, and "
                         f"{key} is {value!r}; remove {field} or change {key}")


class SdcFault(RuntimeFault):
    """A mercurial rank: wrong but finite numbers on the victim, every step from the trigger on.

    ``surface`` says where the wrong value appears (a module's output, the local gradient
    before the collective, the parameters after the optimizer step, the weights in memory),
    ``op`` and ``magnitude`` how wrong, ``persistence`` whether the same input gives the same
    wrong value (``deterministic``: a same-device replay agrees with itself), a seeded chance
    (``intermittent``) or one strike per step that no replay meets again (``once``), and
    ``lifetime`` how long the device stays bad (the job, the victim process, or the node)."""

    type = "sdc"
    family = "numeric"
    rank_action = "faultlab.runtime.actions.sdc:Sdc"
    strikes = "window"
    planned_from_step = True
    corrupts_silently: ClassVar[bool] = True
    targets: ClassVar[tuple[str, ...]] = ("rank", "all")

    class Params(RuntimeFaultParams):
        surface: Literal["activation", "gradient", "update", "weights"] = Field(
            "activation", description="where the wrong value appears: activation (the output "
            "of the modules module_glob names), gradient (the victim's local gradient before "
            "the collective that averages it), update (the victim's parameters right after "
            "its optimizer step: its replica diverges), weights (the weights in memory at "
            "step start)")
        module_glob: str | None = Field(
            None, min_length=1, description="surface activation: the modules whose output is "
            "corrupted, fnmatch on the name named_modules() gives it under the rank's "
            "outermost module (e.g. 'net.0', '*.fc*'); default: every torch.nn.Linear")
        param_glob: str | None = Field(
            None, min_length=1, description="surfaces gradient, update, weights: the "
            "parameters hit, fnmatch on the FQN (e.g. 'blocks.0.*'); default: every parameter")
        op: Literal["bitflip", "scale", "noise", "sign_flip"] = Field(
            "noise", description="how the chosen elements go wrong: bitflip (bit bit_index "
            "flipped), scale (times 1 + magnitude), noise (plus magnitude x |x| x a standard "
            "normal draw), sign_flip (negated)")
        magnitude: float = Field(
            1e-3, gt=0, le=1e6, allow_inf_nan=False, description="ops scale and noise: the "
            "relative size of the error, from 1e-7 (about one float32 ulp: near invisible) "
            "to 1e6 (catastrophic)")
        bit_index: int = Field(
            22, ge=0, le=63, description="op bitflip: the bit flipped in each chosen element "
            "(0 = least significant; float32: 0-22 mantissa, 23-30 exponent, 31 sign; 22 "
            "changes a value by a third to a half); must fit the tensor's element size")
        num_elements: int = Field(
            1, ge=1, le=2**24, description="elements hit in each tensor struck (at most its "
            "size), chosen as persistence says")
        fraction: float | None = Field(
            None, gt=0, le=1, description="instead of num_elements: this fraction of each "
            "tensor's elements (at least one)")
        persistence: Literal["deterministic", "intermittent", "once"] = Field(
            "deterministic", description="deterministic: the elements and the noise derive "
            "from a hash of the input (a module's input, the uncorrupted gradient or "
            "parameter), so the same input gives the same wrong value every time; "
            "intermittent: each opportunity strikes with probability `probability`, drawn from "
            "a seeded stream that advances per call (a replay draws anew); once: at most once "
            "per (fault, rank, step), never again in a replay of that step")
        probability: float = Field(
            0.5, gt=0, le=1, description="persistence intermittent: the chance that one "
            "opportunity (a module's forward, a parameter's gradient, an optimizer step, a "
            "step start) strikes")
        lifetime: Literal["job", "process", "node"] = Field(
            "job", description="job: until the job ends, across restarts of the victim; "
            "process: until the victim process ends (a restarted one is healthy); node: with "
            "the node the victim ran on when it first struck: whatever rank runs there "
            "strikes, a replacement node does not")
        seed: int | None = Field(None, ge=0, lt=2**63, description="seed of the choices; "
                                 "default: derived from the fault id")

        @field_validator("module_glob")
        @classmethod
        def _module_glob(cls, v: str | None, info: ValidationInfo) -> str | None:
            _only_with(info, "surface", ("activation",), "module_glob")
            return v

        @field_validator("param_glob")
        @classmethod
        def _param_glob(cls, v: str | None, info: ValidationInfo) -> str | None:
            _only_with(info, "surface", ("gradient", "update", "weights"), "param_glob")
            return v

        @field_validator("magnitude")
        @classmethod
        def _magnitude(cls, v: float, info: ValidationInfo) -> float:
            _only_with(info, "op", ("scale", "noise"), "magnitude")
            return v

        @field_validator("bit_index")
        @classmethod
        def _bit_index(cls, v: int, info: ValidationInfo) -> int:
            _only_with(info, "op", ("bitflip",), "bit_index")
            return v

        @field_validator("fraction")
        @classmethod
        def _fraction(cls, v: float | None, info: ValidationInfo) -> float | None:
            if v is not None and info.data.get("num_elements", 1) != 1:
                raise ValueError("give num_elements or fraction, not both")
            return v

        @field_validator("probability")
        @classmethod
        def _probability(cls, v: float, info: ValidationInfo) -> float:
            _only_with(info, "persistence", ("intermittent",), "probability")
            return v

    params: Params

    def plan_entry(self, fault_id: str, ranks: list[int] | None,
                   steps: list[int] | None) -> dict[str, Any]:
        """As every runtime fault's, except ``lifetime: node``: every rank gets the entry (the
        next process on the victim's node may hold another rank) and ``victim_ranks`` names the
        ranks whose node it marks."""
        entry = super().plan_entry(fault_id, ranks, steps)
        entry["params"]["victim_ranks"] = ranks
        if self.params.lifetime == "node":
            entry["ranks"] = None
        return entry

    @classmethod
    def refuses_live(cls, params: Any) -> tuple[str, str] | None:
        if params.lifetime == "process":
            return None
        return ("lifetime", f"sdc with lifetime {params.lifetime!r} must be planned at launch "
                            f"(a live one reaches only the processes running now)")

    def inject(self, ctx: FaultContext, victim: Victim) -> dict[str, Any]:
        lifetime = self.params.lifetime
        if lifetime != "process":
            raise FaultError(f"sdc with lifetime {lifetime!r} must be planned at launch: give "
                             f"it an at_step trigger, or set params.lifetime: process (an sdc "
                             f"injected live reaches only the victim processes running now)")
        return super().inject(ctx, victim)
