"""The environment a report was measured in: the journal's, plus CUDA, NCCL and the driver.

GPU facts come from NVML (``import pynvml``, the ``nvidia-ml-py`` distribution). Without a GPU
``nvmlInit()`` raises ``NVMLError_LibraryNotFound``; every such failure becomes "not available"
with the reason — collecting the environment never fails a run.
"""

from __future__ import annotations

from typing import Any

from faultlab.report.journal import environment

__all__ = ["gpu_environment", "suite_environment"]

NOT_AVAILABLE = "not available"


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _nccl_version() -> str:
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_nccl_available():
        return f"{NOT_AVAILABLE} (this torch build has no NCCL)"
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError) as e:
        return f"{NOT_AVAILABLE} ({type(e).__name__}: {e})"
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _nvml() -> dict[str, Any]:
    try:
        import pynvml
    except ImportError:
        return {"driver": f"{NOT_AVAILABLE} (nvidia-ml-py is not installed)", "gpus": []}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:  # NVMLError_LibraryNotFound on a host without a GPU
        return {"driver": f"{NOT_AVAILABLE} (NVML: {e})", "gpus": []}
    try:
        out: dict[str, Any] = {"driver": _text(pynvml.nvmlSystemGetDriverVersion()), "gpus": []}
        try:
            cuda = pynvml.nvmlSystemGetCudaDriverVersion()
            out["cuda_driver"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        except pynvml.NVMLError:
            pass
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            out["gpus"].append({"index": i, "name": _text(pynvml.nvmlDeviceGetName(handle)),
                                "memory_gib": round(memory.total / 2**30, 1)})
        return out
    except pynvml.NVMLError as e:
        return {"driver": f"{NOT_AVAILABLE} (NVML: {e})", "gpus": []}
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def gpu_environment() -> dict[str, Any]:
    """CUDA runtime of torch, NCCL version, NVIDIA driver and GPUs; never raises."""
    import torch

    return {"cuda_runtime": torch.version.cuda or f"{NOT_AVAILABLE} (CPU build of torch)",
            "nccl": _nccl_version(), **_nvml()}


def suite_environment() -> dict[str, Any]:
    """``journal.environment()`` (faultlab, torch, Python, platform, host, CPUs, git sha)
    with ``gpu_environment()``."""
    return {**environment(), **gpu_environment()}
