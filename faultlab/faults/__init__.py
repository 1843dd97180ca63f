"""The built-in faults, one module per family (``process``, ``storage``, ``storage_io``,
``network``, ``numeric``, ``collective``, ``gpu``, ``cloud``, ``slurm``), each registered under the
``faultlab.faults`` entry-point group exactly as a third party's would be.

The contract they implement and the registry that finds them live beneath the spec, in
``faultlab.fault_api``; this package offers the same names, so a team's fault package writes
``from faultlab.faults import Fault, FaultParams`` (and, for a fault that needs a context
capability, ``require`` and its protocol: ``NodeNetwork`` ...).

It may import ``faultlab.errors``, ``faultlab.fault_api``, ``faultlab.spec``,
``faultlab.runtime``, ``faultlab.metadata``, ``faultlab.targets`` and ``faultlab.storage``; never
the engine, the judge or the report.
"""

from __future__ import annotations

from faultlab.fault_api import (
    CAPABILITIES,
    CONTEXT_CAPABILITIES,
    ENTRY_POINT_GROUP,
    Fault,
    FaultContext,
    FaultParams,
    NodeFreezer,
    NodeMachine,
    NodeNetwork,
    NodeRestart,
    Services,
    SlurmController,
    Victim,
    fault_types,
    get_fault_type,
    require,
)

__all__ = ["CAPABILITIES", "CONTEXT_CAPABILITIES", "ENTRY_POINT_GROUP", "Fault", "FaultContext",
           "FaultParams", "NodeFreezer", "NodeMachine", "NodeNetwork", "NodeRestart", "Services",
           "SlurmController", "Victim", "fault_types", "get_fault_type", "require"]
