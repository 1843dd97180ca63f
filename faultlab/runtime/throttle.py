"""A throttled GPU's schedule: when a ``gpu_slow`` fault is slow, and what NVML shows of it.

One pure function of the time (or the steps) since the fault began decides whether the device
is throttled now (:func:`phase`), and both sides of the fault read it the same way:

- the rank (``faultlab.runtime.actions.gpu.GpuSlow``) stretches its compute only while the
  phase is on, and records the start and end of every slow episode it meets (``fault_struck``
  and ``fault_eased``);
- the NVML overlay (``faultlab.runtime.nvml_overlay``), in any process of the node, reports
  the lowered clocks, the high temperature and the throttle reasons exactly then
  (:func:`throttled_now`).

A steady fault (no ``episodes``) is on from its injection until undone. Episodes alternate
``on`` then ``off`` from the injection, repeating until the fault is undone:

- ``{on_s, off_s}``: in wall-clock seconds from the time the fault wrote its entry (``t``), as a
  GPU's thermal cycle goes; every process of the node computes the same phase from the clock;
- ``{on_steps, off_steps}``: in the rank's training steps from the step at which it first met
  the fault, the same on every machine whatever its speed; the rank publishes its phase in
  ``RUN_DIR/gpu/<node>/throttle/<fault id>.dev<device>.json`` for the overlay, which shows the
  device throttled until the rank has said otherwise. The rank's step is its runtime agent's
  (the reference trainer's, level 0's), else the count of its outermost forwards; a restarted
  process begins the schedule again at the first step it runs.

This module imports only the standard library.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["HEALTHY_TEMP_C", "MAX_CLOCKS_MHZ", "THROTTLED_TEMP_C", "Phase", "clock_mhz",
           "phase", "publish", "schedule_unit", "throttle_factor", "throttled_now"]

MAX_CLOCKS_MHZ = {"graphics": 1980, "sm": 1980, "mem": 2619, "video": 1545}
"""The faked device's maximum clocks (an H100 SXM as NVML reports them), by clock type."""
HEALTHY_TEMP_C = 41
THROTTLED_TEMP_C = 92
"""The faked device's temperature while healthy, and any device's while thermally throttled."""


@dataclass(frozen=True, slots=True)
class Phase:
    """Where a fault is in its schedule: slow (``on``) or not, in which episode (0-based: the
    episode under way, or the last one that ended), and since and until when, in the
    schedule's unit counted from the fault's start (``end`` None: until undone)."""

    on: bool
    episode: int
    start: float
    end: float | None


def schedule_unit(episodes: Mapping[str, Any] | None) -> str | None:
    """``"s"``, ``"steps"``, or None for a steady fault."""
    if not episodes:
        return None
    return "s" if episodes.get("on_s") is not None else "steps"


def phase(episodes: Mapping[str, Any] | None, elapsed: float) -> Phase:
    """The phase ``elapsed`` seconds or steps (per :func:`schedule_unit`) after the fault
    began; negative ``elapsed`` counts as 0."""
    unit = schedule_unit(episodes)
    if unit is None or episodes is None:
        return Phase(True, 0, 0.0, None)
    on, off = (float(episodes[f"on_{unit}"]), float(episodes[f"off_{unit}"]))
    period = on + off
    k = math.floor(max(0.0, elapsed) / period)
    start = k * period
    if max(0.0, elapsed) - start < on:
        return Phase(True, k, start, start + on)
    return Phase(False, k, start + on, start + period)


def throttle_factor(view: Mapping[str, Any]) -> float:
    """How many times slower an entry's NVML view says the device runs while throttled."""
    return float(view.get("clock_factor") or 1.0)


def _marker(state_path: Path, fault_id: str, device: int) -> Path:
    return state_path.parent / "throttle" / f"{fault_id}.dev{device}.json"


def publish(state_path: Path, fault_id: str, device: int, **fields: Any) -> None:
    """The rank's phase of a steps-scheduled fault, for the overlay (written atomically)."""
    path = _marker(state_path, fault_id, device)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(fields), encoding="utf-8")
    os.replace(tmp, path)


def throttled_now(entry: Mapping[str, Any], view: Mapping[str, Any], state_path: Path,
                  device: int, now: float) -> bool:
    """Whether ``entry`` (a node GPU state entry whose NVML ``view`` says ``throttled``)
    throttles ``device`` at wall-clock ``now``."""
    if not view.get("throttled"):
        return False
    episodes = view.get("episodes")
    unit = schedule_unit(episodes)
    if unit == "s":
        return phase(episodes, now - float(entry.get("t") or now)).on
    if unit == "steps":
        try:
            said = json.loads(_marker(state_path, str(entry.get("id")), device)
                              .read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return True  # the first episode begins at the injection: the rank has not said
        return bool(said.get("on", True))
    return True


def clock_mhz(kind: str, factor: float, *, current: float | None = None,
              maximum: float | None = None) -> int:
    """A clock of a device slowed ``factor`` times (1: not slowed): the SM and graphics
    clocks are the ``maximum`` divided by ``factor``, never above the ``current`` healthy
    reading (default both: the faked device's maximum); the memory and video clocks do not
    follow a thermal slowdown."""
    top = MAX_CLOCKS_MHZ.get(kind, MAX_CLOCKS_MHZ["graphics"]) if maximum is None else maximum
    now = top if current is None else current
    if kind in ("sm", "graphics") and factor > 1.0:
        return int(min(now, round(top / factor)))
    return int(now)
