"""The ``expect`` section: the service-level assertions an experiment states.

The ``Expect`` model is built from the SLA declarations (``faultlab.sla``, the built-ins and each
team's, all registered under the ``faultlab.slas`` entry-point group): one optional field per
SLA, in the declarations' order (``Sla.order``), typed and bounded as the declaration says,
described by its ``doc``. A campaign's ``CampaignExpect`` (``faultlab.spec.campaign``) is built
the same way, on ``Expect``, from the campaign SLAs. A key no declaration names is refused with
the closest valid one, as for every model of the spec.

The declarations live in ``faultlab.sla``, beneath both the spec and the judge, because the spec
may not import the judge: the spec reads the YAML half of each declaration (key, value type,
bounds, text) and the judge its verdict half (what it measures, how it compares, its note),
from the same object. The spec never learns what an SLA means; it only checks the value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BeforeValidator, Field, create_model, field_validator

from faultlab.sla import NOISE_K_DEFAULT, Sla, slas
from faultlab.spec._base import SpecModel, as_tuple

__all__ = ["NOISE_K_DEFAULT", "Expect", "ExpectBase", "expect_model"]


class ExpectBase(SpecModel):
    """What every ``Expect`` model has besides its fields (one per SLA)."""

    detected_by: Annotated[tuple[Annotated[str, Field(min_length=1)], ...],
                           BeforeValidator(as_tuple), Field(min_length=1)] | None = None
    """The detection signals the detection SLAs count (``detected_within_steps``,
    ``detection_attributed``, ``false_alarms`` ..., ``straggler_detected_within_s``): names of
    ``observe.detections``, or ``anomaly:<what>`` for the trainer's own anomaly records.
    Unset: every declared signal and every anomaly counts."""

    def items(self) -> list[tuple[str, bool | int | float]]:
        """``(key, bound)`` for every SLA key that is set, in the order of the fields."""
        return [(k, getattr(self, k)) for k in type(self).model_fields
                if k not in ExpectBase.model_fields and getattr(self, k) is not None]


def _parser(sla: Sla) -> Any:
    def parse(cls: type, value: Any) -> Any:
        return sla.parse(value)

    parse.__name__ = parse.__qualname__ = f"_parse_{sla.key}"
    return field_validator(sla.key, mode="before")(parse)


def expect_model(declared: dict[str, Sla], name: str, base: type[ExpectBase], doc: str
                 ) -> type[ExpectBase]:
    """A model ``name`` on ``base`` with one optional field per declaration, in their order."""
    fields: dict[str, Any] = {
        key: (sla.annotation(), Field(default=None, description=sla.field_doc(),
                                      **sla.field_bounds()))
        for key, sla in declared.items()}
    parsers = {f"_parse_{key}": _parser(sla) for key, sla in declared.items()
               if type(sla).parse is not Sla.parse or sla.relative}
    return create_model(name, __base__=base, __module__=base.__module__, __doc__=doc,
                        __validators__=parsers, **fields)


if TYPE_CHECKING:
    class Expect(ExpectBase):
        """The experiment's ``expect`` section: one optional field per registered SLA."""

        def __getattr__(self, key: str) -> Any: ...
else:
    Expect = expect_model(slas(), "Expect", ExpectBase, "Service-level assertions judged after "
                          "the run; unset keys are not judged.")
