"""What a fault is, for everything that reads one: the contract every fault implements (``Fault``,
its ``Params``, the ``Victim`` a selector resolved to: ``base.py``), what it acts through (the
core ``FaultContext`` every target implements, and the named context capabilities only some
targets offer, each with its protocol: ``context.py``) and the registry that finds every fault
type by name (``registry.py``, the ``faultlab.faults`` entry-point group).

Why a package of its own, beneath ``spec`` and ``faults``: the spec checks each ``faults:``
entry against its fault's declaration (``Params``, the targets it accepts, the capabilities it
needs of the launcher's target, whether it is reversible), and the faults read the spec (a
storage fault finds the trainer's checkpoint directory in it): imports point one way, so the
contract and the registry live where both may import them. It may import ``faultlab.errors``
only. The built-in faults are ordinary implementations of it, in
``faultlab.faults``, which also offers these names to a team's fault package (``from
faultlab.faults import Fault, FaultParams``).
"""

from faultlab.fault_api.base import CAPABILITIES, Fault, FaultParams, Victim
from faultlab.fault_api.context import (
    CONTEXT_CAPABILITIES,
    ContextCapability,
    FaultContext,
    NodeFreezer,
    NodeMachine,
    NodeNetwork,
    NodeRestart,
    Services,
    SlurmController,
    not_offered,
    require,
)
from faultlab.fault_api.registry import ENTRY_POINT_GROUP, fault_types, get_fault_type

__all__ = ["CAPABILITIES", "CONTEXT_CAPABILITIES", "ENTRY_POINT_GROUP", "ContextCapability",
           "Fault", "FaultContext", "FaultParams", "NodeFreezer", "NodeMachine", "NodeNetwork",
           "NodeRestart", "Services", "SlurmController", "Victim", "fault_types",
           "get_fault_type", "not_offered", "require"]
