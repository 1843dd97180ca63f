"""The NVML view of a gpu fault: ``pynvml`` inside the job's processes sees what a health check
would see on a failing GPU.

The bootstrap (``bootstrap/sitecustomize.py``) calls :func:`apply` right after ``pynvml`` is
imported, in every Python process of a node whose environment names a GPU state file
(``FAULTLAB_GPU_STATE``, set by faultlab when the experiment has a gpu fault): the ranks, and
any health-check script they or the node start. It replaces functions of the ``pynvml`` module
(nvidia-ml-py) in place, before any other module can ``from pynvml import`` them:

- **no GPU** (the real ``nvmlInit`` fails: no library, no driver): a faked device per local
  rank (``FAULTLAB_GPU_COUNT``), an H100 80GB as NVML reports one, healthy while no fault
  strikes it. Every function the overlay does not emulate raises ``NVMLError_NotSupported``.
- **a GPU**: the real NVML, overlaid for the victim devices only.

What a device under a fault reports comes from the ``nvml`` view of the state file's entries
for that device, which the fault writes on faultlab's side (the overlay knows no fault type):

- ``lost`` (``gpu_error`` xid 79): every call on the device raises ``NVMLError_GpuIsLost``,
  from ``nvmlDeviceGetHandleByIndex`` on;
- ``xid_event`` (every ``gpu_error``): an ``nvmlEventTypeXidCriticalError`` event with the Xid
  as data from ``nvmlEventSetWait`` (once per event set); ``recovery_action``:
  ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` as the driver sets it for that Xid
  (``faultlab.runtime.gpu.XIDS``: GPU_RESET for ECC, NODE_REBOOT for 79; an application error,
  13/31/43, leaves NONE, as on a real GPU);
- ``ecc_uncorrected`` (ECC xids 48/94/95): ``nvmlDeviceGetTotalEccErrors`` uncorrected counts
  rise by one per injection;
- ``free_mib`` (``gpu_oom``): ``nvmlDeviceGetMemoryInfo`` shows only that much free;
- ``throttled`` (``gpu_slow``), while its schedule is on (``faultlab.runtime.throttle``: a
  steady fault until undone, an episodic one only during its slow episodes):
  ``nvmlDeviceGetCurrentClocksThrottleReasons`` (and ``...EventReasons``) report HwSlowdown |
  SwThermalSlowdown | HwThermalSlowdown (0x68), the temperature is 92 C and
  ``nvmlDeviceGetClockInfo`` gives the SM and graphics clocks at their maximum divided by the
  fault's ``clock_factor`` (memory and video clocks unchanged); between episodes and after the
  undo, the healthy readings (41 C and the maximum clocks on the faked device).

Not covered: programs that link ``libnvidia-ml`` directly (C, Go, DCGM) and ``nvidia-smi``
see the real NVML (or none); other Python NVML bindings are not overlaid.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

from faultlab.runtime.gpu import FAKE_MEMORY_MIB, device_entries, pci_bus_id, read_state
from faultlab.runtime.throttle import (
    HEALTHY_TEMP_C,
    THROTTLED_TEMP_C,
    clock_mhz,
    throttle_factor,
    throttled_now,
)

__all__ = ["FAKE_NAME", "THROTTLE_SLOW", "Overlay", "apply"]

FAKE_NAME = "NVIDIA H100 80GB HBM3"
THROTTLE_SLOW = 0x08 | 0x20 | 0x40  # HwSlowdown | SwThermalSlowdown | HwThermalSlowdown
_EVENT_XID = 0x0000000000000008  # nvmlEventTypeXidCriticalError


class FakeHandle:
    """A faked device's handle (there is no GPU)."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<faultlab fake NVML device {self.index}>"


class FakeEventSet:
    def __init__(self) -> None:
        self.devices: dict[int, tuple[Any, int]] = {}  # index -> (handle, event types)
        self.delivered: set[str] = set()
        self.real: Any = None


class Overlay:
    """The overlay's state in one process."""

    def __init__(self, nvml: ModuleType, state_path: Path, count: int) -> None:
        self.nvml = nvml
        self.state_path = state_path
        self.count = count
        self.fake: bool | None = None  # decided by nvmlInit
        self.orig: dict[str, Callable[..., Any]] = {}

    # --- the state --------------------------------------------------------------------------

    def entries(self, index: int | None) -> list[dict[str, Any]]:
        if index is None:
            return []
        return device_entries(read_state(self.state_path), index)

    def index_of(self, handle: Any) -> int | None:
        if isinstance(handle, FakeHandle):
            return handle.index
        try:
            return int(self.orig["nvmlDeviceGetIndex"](handle))
        except Exception:  # noqa: BLE001 - not a device we can place: leave it alone
            return None

    def handle(self, index: int) -> Any:
        """The real handle of device ``index`` (a GPU host only)."""
        return self.orig["nvmlDeviceGetHandleByIndex"](index)

    def error(self, code: int) -> BaseException:
        return self.nvml.NVMLError(code)

    def check_lost(self, index: int | None) -> None:
        if any(_view(e).get("lost") for e in self.entries(index)):
            raise self.error(self.nvml.NVML_ERROR_GPU_IS_LOST)


def apply(nvml: ModuleType, env: Mapping[str, str] | None = None) -> Overlay | None:
    """Overlay ``nvml`` (the imported ``pynvml`` module) in place; None when this process's
    environment names no GPU state file. Idempotent."""
    env = os.environ if env is None else env
    if getattr(nvml, "_faultlab_overlay", None) is not None:
        return nvml._faultlab_overlay
    path = env.get("FAULTLAB_GPU_STATE")
    if not path:
        return None
    count = int(env.get("FAULTLAB_GPU_COUNT") or env.get("LOCAL_WORLD_SIZE") or 1)
    ov = Overlay(nvml, Path(path), max(1, count))
    for name, make in _WRAPPERS.items():
        orig = getattr(nvml, name, None)
        if orig is None:
            continue
        ov.orig[name] = orig
        setattr(nvml, name, make(ov, orig))
    ov.orig["_nvmlGetFunctionPointer"] = nvml._nvmlGetFunctionPointer

    def pointer(name: str) -> Any:
        if ov.fake:  # no library behind the faked device: not emulated means not supported
            raise nvml.NVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)
        return ov.orig["_nvmlGetFunctionPointer"](name)

    for name, value in (("_nvmlGetFunctionPointer", pointer), ("_faultlab_overlay", ov)):
        setattr(nvml, name, value)  # a module's attributes: mypy knows only their reads
    return ov


# --- the wrappers: name -> (overlay, original) -> replacement ------------------------------

def _init(ov: Overlay, orig: Callable[..., Any]) -> Callable[..., Any]:
    def init(*args: Any, **kwargs: Any) -> Any:
        ov.fake = None
        try:
            result = orig(*args, **kwargs)  # nvmlInit calls nvmlInitWithFlags: both wrapped
            if ov.fake is None:
                ov.fake = False
            return result
        except ov.nvml.NVMLError:
            ov.fake = True  # no GPU here: the faked devices
            return None
    return init


def _shutdown(ov: Overlay, orig: Callable[..., Any]) -> Callable[..., Any]:
    def shutdown() -> Any:
        return None if ov.fake else orig()
    return shutdown


def _fake_only(value: Callable[[Overlay], Any]) -> Callable[[Overlay, Callable[..., Any]],
                                                            Callable[..., Any]]:
    def make(ov: Overlay, orig: Callable[..., Any]) -> Callable[..., Any]:
        def fn(*args: Any, **kwargs: Any) -> Any:
            return value(ov) if ov.fake else orig(*args, **kwargs)
        return fn
    return make


def _device(fake: Callable[[Overlay, int, tuple[Any, ...]], Any],
            overlay: Callable[[Overlay, int, Any, tuple[Any, ...]], Any] | None = None,
            ) -> Callable[[Overlay, Callable[..., Any]], Callable[..., Any]]:
    """A per-device function: the faked value without a GPU; with one, the real value,
    replaced by ``overlay(ov, index, real, args)`` on a device under a fault."""
    def make(ov: Overlay, orig: Callable[..., Any]) -> Callable[..., Any]:
        def fn(handle: Any, *args: Any) -> Any:
            index = ov.index_of(handle)
            ov.check_lost(index)
            if ov.fake:
                return fake(ov, index or 0, args)
            real = orig(handle, *args)
            if overlay is None or index is None or not ov.entries(index):
                return real
            return overlay(ov, index, real, args)
        return fn
    return make


def _handle_by_index(ov: Overlay, orig: Callable[..., Any]) -> Callable[..., Any]:
    def fn(index: int) -> Any:
        if ov.fake and not 0 <= index < ov.count:
            raise ov.error(ov.nvml.NVML_ERROR_INVALID_ARGUMENT)
        ov.check_lost(index)
        return FakeHandle(index) if ov.fake else orig(index)
    return fn


def _memory(ov: Overlay, index: int, args: tuple[Any, ...]) -> Any:
    total = FAKE_MEMORY_MIB * 2**20
    left = _free_mib(ov, index)
    free = left * 2**20 if left is not None else total - 2**29
    return SimpleNamespace(total=total, free=free, used=total - free, reserved=0)


def _memory_overlay(ov: Overlay, index: int, real: Any, args: tuple[Any, ...]) -> Any:
    left = _free_mib(ov, index)
    if left is not None:
        free = left * 2**20
        return SimpleNamespace(total=real.total, free=free, used=real.total - free,
                               reserved=getattr(real, "reserved", 0))
    return real


def _view(entry: Mapping[str, Any]) -> dict[str, Any]:
    """What NVML shows of a device under this entry's fault: the entry's ``nvml``, written by
    the fault on faultlab's side (``faultlab.faults.gpu.GpuFault._entry`` lists the keys)."""
    view = entry.get("nvml")
    return view if isinstance(view, dict) else {}


def _free_mib(ov: Overlay, index: int) -> int | None:
    left = [int(_view(e)["free_mib"]) for e in ov.entries(index)
            if _view(e).get("free_mib") is not None]
    return min(left) if left else None


def _slowdown(ov: Overlay, index: int) -> float:
    """How many times slower the device runs now: 1.0 when no ``throttled`` entry's schedule
    is on (``faultlab.runtime.throttle``: between episodes, after the undo)."""
    now = time.time()
    factors = [throttle_factor(_view(e)) for e in ov.entries(index)
               if throttled_now(e, _view(e), ov.state_path, index, now)]
    return max(factors, default=1.0)


def _slow(ov: Overlay, index: int) -> bool:
    return any(throttled_now(e, _view(e), ov.state_path, index, time.time())
               for e in ov.entries(index))


_CLOCK_KINDS = ("graphics", "sm", "mem", "video")  # NVML_CLOCK_GRAPHICS .. NVML_CLOCK_VIDEO


def _clock_kind(args: tuple[Any, ...]) -> str:
    kind = int(args[0]) if args else 0
    return _CLOCK_KINDS[kind] if 0 <= kind < len(_CLOCK_KINDS) else "graphics"


def _clock(ov: Overlay, index: int, args: tuple[Any, ...]) -> int:
    return clock_mhz(_clock_kind(args), _slowdown(ov, index))


def _clock_overlay(ov: Overlay, index: int, real: Any, args: tuple[Any, ...]) -> Any:
    factor = _slowdown(ov, index)
    if factor <= 1.0:
        return real
    top = ov.orig["nvmlDeviceGetMaxClockInfo"](ov.handle(index), *args) \
        if "nvmlDeviceGetMaxClockInfo" in ov.orig else real
    return clock_mhz(_clock_kind(args), factor, current=real, maximum=top)


def _ecc_count(ov: Overlay, index: int, args: tuple[Any, ...]) -> int:
    error_type = args[0] if args else 1
    if error_type != ov.nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
        return 0
    return sum(1 for e in ov.entries(index) if _view(e).get("ecc_uncorrected"))


def _recovery_action(ov: Overlay, index: int) -> int:
    actions = [int(_view(e)["recovery_action"]) for e in ov.entries(index)
               if _view(e).get("recovery_action") is not None]
    return max(actions, default=ov.nvml.NVML_GPU_RECOVERY_ACTION_NONE)


def _field_values(ov: Overlay, orig: Callable[..., Any]) -> Callable[..., Any]:
    nvml = ov.nvml

    def fn(handle: Any, field_ids: list[Any]) -> Any:
        index = ov.index_of(handle)
        ov.check_lost(index)
        if ov.fake:
            values = (nvml.c_nvmlFieldValue_t * len(field_ids))()
            for i, fid in enumerate(field_ids):
                values[i].fieldId = fid[0] if isinstance(fid, tuple) else fid
                values[i].nvmlReturn = nvml.NVML_ERROR_NOT_SUPPORTED
        else:
            values = orig(handle, field_ids)
            if index is None or not ov.entries(index):
                return values
        for v in values:
            if v.fieldId == nvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
                v.nvmlReturn = nvml.NVML_SUCCESS
                v.valueType = nvml.NVML_VALUE_TYPE_UNSIGNED_INT
                v.value.uiVal = _recovery_action(ov, index or 0)
                v.timestamp = int(time.time() * 1e6)
        return values
    return fn


def _event_set_create(ov: Overlay, orig: Callable[..., Any]) -> Callable[..., Any]:
    def fn() -> Any:
        s = FakeEventSet()
        if not ov.fake:
            s.real = orig()
        return s
    return fn


def _register_events(ov: Overlay, orig: Callable[..., Any]) -> Callable[..., Any]:
    def fn(handle: Any, event_types: int, event_set: Any) -> Any:
        index = ov.index_of(handle)
        ov.check_lost(index)
        if isinstance(event_set, FakeEventSet):
            if index is not None:
                event_set.devices[index] = (handle, int(event_types))
            if event_set.real is not None:
                try:
                    return orig(handle, event_types, event_set.real)
                except ov.nvml.NVMLError:  # a device without events: ours still arrive
                    return None
            return None
        return orig(handle, event_types, event_set)
    return fn


def _event_set_wait(ov: Overlay, orig: Callable[..., Any]) -> Callable[..., Any]:
    def fn(event_set: Any, timeout_ms: int) -> Any:
        if not isinstance(event_set, FakeEventSet):
            return orig(event_set, timeout_ms)
        deadline = time.monotonic() + max(0, timeout_ms) / 1000
        while True:
            for index, (handle, types) in event_set.devices.items():
                if not types & _EVENT_XID:
                    continue
                for e in ov.entries(index):
                    key = f"{e.get('id')}/{index}"
                    xid = _view(e).get("xid_event")
                    if xid is not None and key not in event_set.delivered:
                        event_set.delivered.add(key)
                        return SimpleNamespace(device=handle, eventType=_EVENT_XID,
                                               eventData=int(xid),
                                               gpuInstanceId=0xFFFFFFFF,
                                               computeInstanceId=0xFFFFFFFF)
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                raise ov.error(ov.nvml.NVML_ERROR_TIMEOUT)
            if event_set.real is not None:  # a real event arrives through the real set
                try:
                    return orig(event_set.real, int(min(left_s, 0.1) * 1000))
                except ov.nvml.NVMLError_Timeout:
                    continue
            time.sleep(min(left_s, 0.05))
    return fn


def _event_set_free(ov: Overlay, orig: Callable[..., Any]) -> Callable[..., Any]:
    def fn(event_set: Any) -> Any:
        if isinstance(event_set, FakeEventSet):
            return None if event_set.real is None else orig(event_set.real)
        return orig(event_set)
    return fn


def _pci(ov: Overlay, index: int, args: tuple[Any, ...]) -> Any:
    bus = pci_bus_id(index)
    return SimpleNamespace(busId=f"0000{bus}.0".encode(), busIdLegacy=f"{bus}.0".encode(),
                           domain=0, bus=0x1b + 0x10 * index, device=0, pciDeviceId=0x233010DE,
                           pciSubSystemId=0x16C110DE)


_THROTTLE = _device(lambda ov, i, a: THROTTLE_SLOW if _slow(ov, i) else 0,
                    lambda ov, i, real, a: (real | THROTTLE_SLOW) if _slow(ov, i) else real)
_WRAPPERS: dict[str, Callable[[Overlay, Callable[..., Any]], Callable[..., Any]]] = {
    "nvmlInit": _init,
    "nvmlInitWithFlags": _init,
    "nvmlShutdown": _shutdown,
    "nvmlSystemGetDriverVersion": _fake_only(lambda ov: "faultlab-fake"),
    "nvmlSystemGetCudaDriverVersion": _fake_only(lambda ov: 13000),
    "nvmlDeviceGetCount": _fake_only(lambda ov: ov.count),
    "nvmlDeviceGetHandleByIndex": _handle_by_index,
    "nvmlDeviceGetIndex": _device(lambda ov, i, a: i),
    "nvmlDeviceGetName": _device(lambda ov, i, a: FAKE_NAME),
    "nvmlDeviceGetUUID": _device(lambda ov, i, a: f"GPU-fa017ab0-0000-4000-8000-{i:012d}"),
    "nvmlDeviceGetPciInfo": _device(_pci),
    "nvmlDeviceGetPciInfo_v3": _device(_pci),
    "nvmlDeviceGetMemoryInfo": _device(_memory, _memory_overlay),
    "nvmlDeviceGetTemperature": _device(
        lambda ov, i, a: THROTTLED_TEMP_C if _slow(ov, i) else HEALTHY_TEMP_C,
        lambda ov, i, real, a: THROTTLED_TEMP_C if _slow(ov, i) else real),
    "nvmlDeviceGetClockInfo": _device(_clock, _clock_overlay),
    "nvmlDeviceGetMaxClockInfo": _device(lambda ov, i, a: clock_mhz(_clock_kind(a), 1.0)),
    "nvmlDeviceGetCurrentClocksThrottleReasons": _THROTTLE,
    "nvmlDeviceGetCurrentClocksEventReasons": _THROTTLE,
    "nvmlDeviceGetTotalEccErrors": _device(lambda ov, i, a: _ecc_count(ov, i, a),
                                           lambda ov, i, real, a: real + _ecc_count(ov, i, a)),
    "nvmlDeviceGetFieldValues": _field_values,
    "nvmlEventSetCreate": _event_set_create,
    "nvmlDeviceRegisterEvents": _register_events,
    "nvmlEventSetWait": _event_set_wait,
    "nvmlEventSetWait_v2": _event_set_wait,
    "nvmlEventSetFree": _event_set_free,
}
