"""chaosfaultlab: the Chaos Toolkit extension of faultlab.

Activities (Python providers, ``"module": "chaosfaultlab.actions"`` / ``"chaosfaultlab.probes"``):

- actions: ``inject_fault`` (any installed faultlab fault type), the shortcuts ``kill_rank``,
  ``kill_node``, ``hang_rank``, ``hang_node``; ``start_training`` / ``stop_training``; the
  rollbacks ``undo_faults`` and ``continue_all``;
- probes: ``training_is_progressing``, ``current_step``, ``recovered_within``,
  ``latest_checkpoint_valid``, ``final_digest_matches_golden``, ``wait_for_completion``.

Control (``"module": "chaosfaultlab.control"``): a faultlab run context that launches the job
before the experiment (or attaches to a running one) and always undoes every fault and reaps
the job afterwards. ``chaos discover chaosfaultlab`` lists every activity with its arguments.
"""

from __future__ import annotations

from typing import Any

from faultlab import __version__

__all__ = ["__version__", "discover"]

ACTIVITY_MODULES = ("chaosfaultlab.actions", "chaosfaultlab.probes")


def discover(discover_system: bool = True) -> dict[str, Any]:
    """What Chaos Toolkit's ``chaos discover chaosfaultlab`` reports: every action and probe
    (the functions in each module's ``__all__``) with its arguments. ``discover_system`` adds
    the fault types installed on this host (faultlab's registry, third-party ones included)."""
    from chaoslib.discovery.discover import (
        discover_actions,
        discover_probes,
        initialize_discovery_result,
    )

    discovery = initialize_discovery_result("chaosfaultlab", __version__, "faultlab")
    discovery["activities"].extend(discover_actions("chaosfaultlab.actions"))
    discovery["activities"].extend(discover_probes("chaosfaultlab.probes"))
    if discover_system:
        from faultlab.faults import fault_types

        discovery["system"] = {"fault_types": {
            name: {"family": cls.family, "targets": list(cls.targets),
                   "reversible": cls.reversible, "summary": cls.summary(),
                   "params": list(cls.Params.model_fields)}
            for name, cls in fault_types().items()}}
    return discovery
