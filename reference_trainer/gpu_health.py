"""The GPU health check each rank runs at start (so after every restart) and when an
accelerator error strikes: is the GPU this rank drives still fit to train on?

It reads NVML through ``pynvml`` (nvidia-ml-py) the way a node health agent does:

- ``NVMLError_GpuIsLost`` anywhere (a GPU that fell off the bus, Xid 79): unhealthy;
- ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` other than NONE (the driver asks for a GPU reset or
  a reboot): unhealthy;
- volatile uncorrected ECC errors: unhealthy;
- no NVML (no library, no driver: a CPU machine): "not_available" — never a crash, never a
  reason to leave. A query the device does not support is skipped, not held against it.

An unhealthy GPU does not heal by restarting the process, so the trainer does not restart in
place on it: the node leaves the job (exit code ``gpu_unhealthy``) and the job shrinks to its
minimum number of nodes, as it does after a preemption. Under faultlab, the NVML that pynvml
reads may be faultlab's overlay (``faultlab.runtime.nvml_overlay``); this module does not know
and does not care: it imports nothing of faultlab.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["GpuHealth", "check_gpu", "is_accelerator_error"]


@dataclass(frozen=True, slots=True)
class GpuHealth:
    status: str
    """``healthy``, ``unhealthy`` or ``not_available`` (no NVML on this machine)."""
    device: int
    reasons: list[str] = field(default_factory=list)
    """Why it is unhealthy (or why NVML is not available)."""
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def unhealthy(self) -> bool:
        return self.status == "unhealthy"


def check_gpu(device: int) -> GpuHealth:
    """Check the GPU with NVML index ``device`` (the rank's local rank)."""
    try:
        import pynvml
    except ImportError as e:
        return GpuHealth("not_available", device, [f"pynvml not installed: {e}"])
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return GpuHealth("not_available", device, [f"NVML: {e}"])
    reasons: list[str] = []
    detail: dict[str, Any] = {}
    try:
        if device >= pynvml.nvmlDeviceGetCount():
            return GpuHealth("not_available", device, [f"NVML sees no device {device}"])
        handle = pynvml.nvmlDeviceGetHandleByIndex(device)
        detail["name"] = _text(pynvml.nvmlDeviceGetName(handle))
        try:
            [value] = pynvml.nvmlDeviceGetFieldValues(
                handle, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
            if value.nvmlReturn == pynvml.NVML_SUCCESS:
                detail["recovery_action"] = int(value.value.uiVal)
                if value.value.uiVal != pynvml.NVML_GPU_RECOVERY_ACTION_NONE:
                    reasons.append(f"recovery action {value.value.uiVal} (not NONE)")
        except pynvml.NVMLError_NotSupported:
            pass
        try:
            ecc = pynvml.nvmlDeviceGetTotalEccErrors(
                handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
            detail["ecc_uncorrected"] = int(ecc)
            if ecc:
                reasons.append(f"{ecc} uncorrected ECC error(s)")
        except pynvml.NVMLError_NotSupported:
            pass
        try:
            detail["throttle_reasons"] = hex(
                pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
            detail["temperature_c"] = int(pynvml.nvmlDeviceGetTemperature(
                handle, pynvml.NVML_TEMPERATURE_GPU))
        except pynvml.NVMLError_NotSupported:
            pass
    except pynvml.NVMLError_GpuIsLost as e:
        reasons.append(f"GPU is lost ({type(e).__name__})")
    except pynvml.NVMLError as e:
        reasons.append(f"NVML error {type(e).__name__}: {e}")
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    return GpuHealth("unhealthy" if reasons else "healthy", device, reasons, detail)


def is_accelerator_error(error: BaseException) -> bool:
    """A CUDA/accelerator error (the device failed), not an out-of-memory or a user bug."""
    import torch

    accel = getattr(torch, "AcceleratorError", None)
    if accel is not None and isinstance(error, accel):
        return True
    return (isinstance(error, RuntimeError) and not isinstance(error, torch.OutOfMemoryError)
            and str(error).startswith("CUDA error"))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
