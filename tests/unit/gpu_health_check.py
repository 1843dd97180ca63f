"""A plain pynvml GPU health check, as a team would write one (no line of faultlab): it prints
what NVML says of every device as one JSON object. tests/unit/test_gpu_faults.py runs it as a
subprocess, with and without faultlab's NVML overlay."""

import json
import sys

import pynvml


def main() -> int:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        print(json.dumps({"nvml": f"not available: {e}"}))
        return 0
    devices = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        d = {"index": i}
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            d["name"] = pynvml.nvmlDeviceGetName(h)
            d["temperature_c"] = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
            d["throttle_reasons"] = hex(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))
            d["sm_clock_mhz"] = pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
            d["sm_max_mhz"] = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)
            d["ecc_uncorrected"] = pynvml.nvmlDeviceGetTotalEccErrors(
                h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
            [field] = pynvml.nvmlDeviceGetFieldValues(
                h, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
            d["recovery_action"] = field.value.uiVal
            d["free_mib"] = pynvml.nvmlDeviceGetMemoryInfo(h).free // 2**20
            events = pynvml.nvmlEventSetCreate()
            pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, events)
            try:
                d["xid_event"] = pynvml.nvmlEventSetWait(events, 100).eventData
            except pynvml.NVMLError_Timeout:
                d["xid_event"] = None
            pynvml.nvmlEventSetFree(events)
            d["healthy"] = (d["recovery_action"] == pynvml.NVML_GPU_RECOVERY_ACTION_NONE
                            and d["ecc_uncorrected"] == 0 and d["xid_event"] is None)
        except pynvml.NVMLError as e:
            d = {"index": i, "healthy": False, "error": f"{type(e).__name__}: {e}"}
        devices.append(d)
    pynvml.nvmlShutdown()
    print(json.dumps({"count": len(devices), "devices": devices}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
