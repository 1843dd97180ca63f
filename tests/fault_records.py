"""What the engine copies into a ``FaultRecord`` from the fault's class, for tests that build
records by hand: the capabilities the class declares (``Fault.capabilities()``)."""

from __future__ import annotations

from faultlab.faults import fault_types


def declared(type_: str) -> tuple[str, ...]:
    """The capabilities fault type ``type_`` declares; none for a type not registered (as an
    older journal's record has none)."""
    cls = fault_types().get(type_)
    return cls.capabilities() if cls else ()
