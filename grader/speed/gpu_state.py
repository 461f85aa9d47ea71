"""The GPU's state beside a timing: SM and memory clocks, temperature, power draw and the clock-throttle ("clocks
event") reasons, read before and after a part's timed rounds so that a result can say the GPU throttled while timed.

NVML through ctypes on ``libnvidia-ml.so.1``, the driver's own library, so nothing is added to the dependencies.
Everything is best effort: :func:`sample` gives None where there is no NVML (a CPU machine, an AMD GPU, a sandbox
without the library) and None for a field the GPU does not report, and it never raises: a timing must never fail
for want of a thermometer. NVML reports the *current* reasons only, so a throttle that comes and goes between two
samples is not seen.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

LIBRARY = "libnvidia-ml.so.1"
_SUCCESS = 0
_CLOCK_SM, _CLOCK_MEM = 1, 2  # nvmlClockType_t
_TEMPERATURE_GPU = 0  # nvmlTemperatureSensors_t

# nvmlClocksEventReason* bits (nvml.h), in the order they are listed
REASONS: dict[int, str] = {
    0x1: "GpuIdle",
    0x2: "ApplicationsClocksSetting",
    0x4: "SwPowerCap",
    0x8: "HwSlowdown",
    0x10: "SyncBoost",
    0x20: "SwThermalSlowdown",
    0x40: "HwThermalSlowdown",
    0x80: "HwPowerBrakeSlowdown",
    0x100: "DisplayClockSetting",
}
# The reasons that slow a kernel down for causes outside it (heat, a hardware or power-supply brake): see throttled()
UNFAIR = frozenset({"HwSlowdown", "SwThermalSlowdown", "HwThermalSlowdown", "HwPowerBrakeSlowdown"})


@dataclass
class GpuState:
    sm_mhz: int | None
    mem_mhz: int | None
    temperature_c: int | None
    power_w: float | None
    reasons: list[str] | None  # None: NVML did not say; []: nothing holds the clocks back

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuState:
        def whole(key: str) -> int | None:
            return None if data.get(key) is None else int(data[key])

        power, reasons = data.get("power_w"), data.get("reasons")
        return cls(whole("sm_mhz"), whole("mem_mhz"), whole("temperature_c"),
                   None if power is None else float(power), None if reasons is None else [str(r) for r in reasons])


def decode_reasons(mask: int) -> list[str]:
    """The names of the bits set in an NVML clocks-event mask; a bit this module does not know is named in hex."""
    names = [name for bit, name in REASONS.items() if mask & bit]
    rest = mask & ~sum(REASONS)
    return [*names, f"0x{rest:x}"] if rest else names


def _nvml() -> Any:
    """The NVML library, not yet initialised (OSError where there is none). The tests replace it with a fake."""
    return ctypes.CDLL(LIBRARY)


# Per process: NVML is initialised once and each device's handle looked up once (a forked child starts again).
_lock = threading.Lock()
_pid: int | None = None
_lib: Any = None  # the initialised library; False once it failed in this process
_handles: dict[int, ctypes.c_void_p | None] = {}


def _library() -> Any:
    global _pid, _lib
    if _pid != os.getpid():
        _pid, _lib = os.getpid(), None
        _handles.clear()
    if _lib is None:
        try:
            lib = _nvml()
            init = getattr(lib, "nvmlInit_v2", None) or lib.nvmlInit
            _lib = lib if init() == _SUCCESS else False
        except (OSError, AttributeError):
            _lib = False
    return _lib or None


def _torch_uuid(device_index: int) -> str | None:
    """The UUID of torch's device ``device_index``, only where this process already uses CUDA: importing torch or
    creating a CUDA context (seconds, and memory on the GPU) just to read a thermometer would cost more than it says."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    uuid = getattr(torch.cuda.get_device_properties(device_index), "uuid", None)
    return str(uuid) if uuid else None


def _find(lib: Any, device_index: int) -> ctypes.c_void_p | None:
    """The NVML handle of torch's device ``device_index``. CUDA numbers the devices after CUDA_VISIBLE_DEVICES and
    (by default) fastest first, NVML by PCI bus: the UUID is the one name both agree on, the index the last resort."""
    visible = [e.strip() for e in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if e.strip()]
    entry = visible[device_index] if device_index < len(visible) else None
    uuids = []
    if uuid := _torch_uuid(device_index):  # torch prints it bare, NVML wants "GPU-..." (or "MIG-..." for a slice)
        uuids += [uuid] if uuid.startswith(("GPU-", "MIG-")) else [f"GPU-{uuid}", f"MIG-{uuid}"]
    if entry is not None and entry.startswith(("GPU-", "MIG-")):
        uuids.append(entry)
    handle = ctypes.c_void_p()
    for name in uuids:
        if lib.nvmlDeviceGetHandleByUUID(name.encode(), ctypes.byref(handle)) == _SUCCESS:
            return handle
    if entry is not None and not entry.isdigit():
        return None  # named by a UUID NVML does not know: the index would be another GPU's
    index = int(entry) if entry is not None else device_index
    return handle if lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) == _SUCCESS else None


def _query(lib: Any, names: Sequence[str], handle: ctypes.c_void_p, *args: int,
           ctype: type[ctypes.c_uint] | type[ctypes.c_ulonglong] = ctypes.c_uint) -> int | None:
    """One NVML reading through the first of ``names`` the driver has; None where it has none or it fails
    (NVML_ERROR_NOT_SUPPORTED for power on some boards, clocks on a MIG slice)."""
    for name in names:
        function = getattr(lib, name, None)
        if function is not None:
            value = ctype()
            return int(value.value) if function(handle, *args, ctypes.byref(value)) == _SUCCESS else None
    return None


def sample(device_index: int = 0) -> GpuState | None:
    """The state of torch's CUDA device ``device_index`` now; None where NVML cannot tell. Never raises."""
    try:
        with _lock:
            lib = _library()
            if lib is None:
                return None
            if device_index not in _handles:
                _handles[device_index] = _find(lib, device_index)
            handle = _handles[device_index]
        if handle is None:
            return None
        reasons = _query(lib, ["nvmlDeviceGetCurrentClocksEventReasons",  # the name since driver 535
                               "nvmlDeviceGetCurrentClocksThrottleReasons"], handle, ctype=ctypes.c_ulonglong)
        power_mw = _query(lib, ["nvmlDeviceGetPowerUsage"], handle)
        return GpuState(sm_mhz=_query(lib, ["nvmlDeviceGetClockInfo"], handle, _CLOCK_SM),
                        mem_mhz=_query(lib, ["nvmlDeviceGetClockInfo"], handle, _CLOCK_MEM),
                        temperature_c=_query(lib, ["nvmlDeviceGetTemperature"], handle, _TEMPERATURE_GPU),
                        power_w=None if power_mw is None else power_mw / 1000,
                        reasons=None if reasons is None else decode_reasons(reasons))
    except Exception:  # a broken driver or library must never cost the timing it would only annotate
        return None


def throttled(states: Sequence[GpuState | None]) -> str | None:
    """Why the GPU was slowed down for causes outside the kernel in one of ``states``, in one line; None if in none.

    Only thermal slowdowns (SW or HW), HW slowdown and the HW power brake count, never SwPowerCap, which is how
    H100/H200 boost clocks are routinely managed under heavy tensor-core load, nor GpuIdle or the application,
    sync-boost and display clock settings, which do not slow a running kernel down unfairly.
    """
    for i, state in enumerate(states):
        unfair = [r for r in (state.reasons or []) if r in UNFAIR] if state is not None else []
        if unfair:
            return f"the GPU throttled ({', '.join(unfair)}) in sample {i + 1} of {len(states)}: {describe(state)}"
    return None


def describe(state: GpuState | None) -> str:
    """A short line, e.g. "1980 MHz SM, 3201 MHz memory, 41 °C, 312 W, reasons: SwPowerCap"."""
    if state is None:
        return "GPU state unknown (no NVML)"

    def shown(value: float | None, unit: str) -> str:
        return f"{'?' if value is None else f'{value:.0f}'} {unit}"

    reasons = "unknown" if state.reasons is None else ", ".join(state.reasons) or "none"
    return (f"{shown(state.sm_mhz, 'MHz SM')}, {shown(state.mem_mhz, 'MHz memory')}, "
            f"{shown(state.temperature_c, '°C')}, {shown(state.power_w, 'W')}, reasons: {reasons}")


def describe_span(states: Sequence[dict[str, Any]]) -> str:
    """The states sampled around a part's rounds (as details.json keeps them), "before → after" where they differ."""
    decoded = [GpuState.from_dict(d) for d in states]
    lines = [describe(state) for state in decoded]
    return lines[0] if len(set(lines)) == 1 else " → ".join(lines)
