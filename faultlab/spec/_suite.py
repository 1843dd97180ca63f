"""The pre-launch suite: the experiments a planned training run must survive, and the plan.

    suite:
      name: prelaunch
      description: What survives, how fast, and what it costs at full scale.
      experiments:                  # files relative to this one; adding one is one line
        - rank_kill.yaml
        - ckpt_bitflip.yaml
      plan:                         # the run the report projects to
        num_gpus: 1024
        gpus_per_node: 8
        mtbf_per_gpu_h: 50000       # or mtbf_per_node_h (exactly one of the two)
        step_time_s: 4.0
        checkpoint_size_gb: 1120
        storage_bandwidth_gb_s: 50
        run_days: 30                # optional: totals over the run
        gpu_hour_cost_usd: 2.5      # optional: costs in USD

``faultlab run`` runs every experiment and writes one report folder (``report.html``,
``report.md``, ``report.json``); ``faultlab validate`` checks the suite and every experiment it
names. (The older list form, ``{name: s, suite: [a.yaml, b.yaml]}``, is ``model.Suite``: a plain
list of experiments with no plan and no report of its own.)
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, Field, field_validator, model_validator

from faultlab.spec._base import SpecModel, as_tuple, located, slug_name, spec_error

__all__ = ["Plan", "PlannedSuite", "SuiteSpec"]


class Plan(SpecModel):
    """The training run the suite vouches for: its size, failure rate and checkpoint."""

    num_gpus: int = Field(ge=1)
    """GPUs of the planned run."""
    gpus_per_node: int = Field(ge=1)
    """GPUs per node; the run has ceil(num_gpus / gpus_per_node) nodes."""
    mtbf_per_gpu_h: float | None = Field(default=None, gt=0)
    """Mean time between failures of one GPU (with its share of the host), hours."""
    mtbf_per_node_h: float | None = Field(default=None, gt=0)
    """Mean time between failures of one node, hours (instead of mtbf_per_gpu_h)."""
    step_time_s: float = Field(gt=0)
    """Seconds per training step at full scale."""
    checkpoint_size_gb: float = Field(gt=0)
    """Size of one full checkpoint of the planned run, GB (10^9 bytes)."""
    storage_bandwidth_gb_s: float = Field(gt=0)
    """Aggregate write bandwidth of the checkpoint storage, GB/s."""
    run_days: float | None = Field(default=None, gt=0)
    """Length of the planned run in days, for totals over the run."""
    gpu_hour_cost_usd: float | None = Field(default=None, ge=0)
    """Price of one GPU-hour in USD, for costs in money."""

    @model_validator(mode="after")
    def _one_mtbf(self) -> Plan:
        if self.mtbf_per_gpu_h is not None and self.mtbf_per_node_h is not None:
            raise located([spec_error(("mtbf_per_node_h",), "give the failure rate once: "
                                      "either mtbf_per_gpu_h or mtbf_per_node_h, not both",
                                      self.mtbf_per_node_h)])
        if self.mtbf_per_gpu_h is None and self.mtbf_per_node_h is None:
            raise ValueError("the plan needs a failure rate: set mtbf_per_gpu_h (hours "
                             "between failures of one GPU) or mtbf_per_node_h (of one node)")
        return self

    @property
    def num_nodes(self) -> int:
        return -(-self.num_gpus // self.gpus_per_node)


class SuiteSpec(SpecModel):
    """What ``suite:`` holds."""

    name: str
    """Identifier of the suite: lowercase letters, digits, ``_`` and ``-``."""
    description: str | None = None
    """What the suite vouches for, in a sentence or two."""
    experiments: Annotated[tuple[Annotated[str, Field(min_length=1)], ...],
                           BeforeValidator(as_tuple), Field(min_length=1)]
    """Experiment files, relative to the suite file, run in this order."""
    plan: Plan
    """The planned run the report projects the measurements to."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return slug_name(value, "suite name")

    @field_validator("experiments")
    @classmethod
    def _unique(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        first: dict[str, int] = {}
        errors = []
        for i, path in enumerate(value):
            if path in first:
                errors.append(spec_error((i,), f"{path!r} is listed twice (also "
                                         f"experiments[{first[path]}]); each experiment runs "
                                         f"once per suite, so remove one", path))
            first.setdefault(path, i)
        if errors:
            raise located(errors)
        return value


class PlannedSuite(SpecModel):
    """A pre-launch suite document: a single ``suite`` mapping."""

    suite: SuiteSpec
    """The suite: name, description, experiments and plan."""

    @property
    def name(self) -> str:
        return self.suite.name
