"""faultlab's pytest plugin: experiment YAML files as test items, the ``faultlab`` fixture and
the ``faultlab_experiment`` marker. The hooks live in ``pytest_faultlab.plugin`` (entry point
``pytest11``, name ``faultlab``); its docstring is the user's guide."""

from pytest_faultlab.plugin import (
    ExperimentFailed,
    ExperimentFile,
    ExperimentItem,
    FaultlabRunner,
    Settings,
    sla_table,
)

__all__ = [
    "ExperimentFailed",
    "ExperimentFile",
    "ExperimentItem",
    "FaultlabRunner",
    "Settings",
    "sla_table",
]
