"""The GPU's state beside a timing (grader/speed/gpu_state.py) without a GPU: a fake NVML library with the same C
function names, answering through the ctypes byref arguments as libnvidia-ml does; the reasons decoded, which
throttles count as unfair, the device found by UUID or index, and sample() never raising."""

from __future__ import annotations

import ctypes
import json
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from grader.speed import gpu_state
from grader.speed.gpu_state import GpuState

ERROR_INVALID_ARGUMENT, ERROR_NOT_SUPPORTED, ERROR_NOT_FOUND = 2, 3, 6
HANDLE = 0x5A5A  # the device's handle in the fake
TORCH_UUID = gpu_state._torch_uuid  # the real one: the tests replace it with what torch would say


class FakeNvml:
    """libnvidia-ml.so.1 for one device (UUID ``GPU-1234``, NVML index 3): each function answers NVML's return code
    and writes its result into the ctypes object behind the byref argument. ``unsupported`` functions answer
    NVML_ERROR_NOT_SUPPORTED, ``missing`` ones do not exist (an older driver: AttributeError, as from ctypes.CDLL)."""

    def __init__(self, *, reasons: int = 0x4, init_rc: int = 0) -> None:
        self.reasons, self.init_rc = reasons, init_rc
        self.unsupported: set[str] = set()
        self.missing: set[str] = set()
        self.calls: list[tuple[str, Any]] = []

    def __getattribute__(self, name: str) -> Any:
        if name in object.__getattribute__(self, "missing"):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    def _answer(self, name: str, handle: ctypes.c_void_p, ref: Any, value: int) -> int:
        self.calls.append((name, None))
        if name in self.unsupported:
            return ERROR_NOT_SUPPORTED
        if handle.value != HANDLE:
            return ERROR_INVALID_ARGUMENT
        ref._obj.value = value
        return 0

    def nvmlInit_v2(self) -> int:
        self.calls.append(("nvmlInit_v2", None))
        return self.init_rc

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes, ref: Any) -> int:
        self.calls.append(("nvmlDeviceGetHandleByUUID", uuid))
        if uuid != b"GPU-1234":
            return ERROR_NOT_FOUND
        ref._obj.value = HANDLE
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, index: int, ref: Any) -> int:
        self.calls.append(("nvmlDeviceGetHandleByIndex_v2", index))
        if index != 3:
            return ERROR_INVALID_ARGUMENT
        ref._obj.value = HANDLE
        return 0

    def nvmlDeviceGetClockInfo(self, handle: ctypes.c_void_p, clock: int, ref: Any) -> int:
        return self._answer("nvmlDeviceGetClockInfo", handle, ref, {1: 1980, 2: 3201}[clock])

    def nvmlDeviceGetTemperature(self, handle: ctypes.c_void_p, sensor: int, ref: Any) -> int:
        assert sensor == 0
        return self._answer("nvmlDeviceGetTemperature", handle, ref, 41)

    def nvmlDeviceGetPowerUsage(self, handle: ctypes.c_void_p, ref: Any) -> int:
        return self._answer("nvmlDeviceGetPowerUsage", handle, ref, 312_400)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: ctypes.c_void_p, ref: Any) -> int:
        assert isinstance(ref._obj, ctypes.c_ulonglong)  # the mask is 64 bits wide
        return self._answer("nvmlDeviceGetCurrentClocksEventReasons", handle, ref, self.reasons)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: ctypes.c_void_p, ref: Any) -> int:
        return self._answer("nvmlDeviceGetCurrentClocksThrottleReasons", handle, ref, self.reasons)

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts as a new process would: NVML not initialised, no handle, no CUDA_VISIBLE_DEVICES."""
    monkeypatch.setattr(gpu_state, "_pid", None)
    monkeypatch.setattr(gpu_state, "_lib", None)
    monkeypatch.setattr(gpu_state, "_handles", {})
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(gpu_state, "_torch_uuid", lambda index: None)


def install(monkeypatch: pytest.MonkeyPatch, fake: FakeNvml, *, torch_uuid: str | None = "1234") -> FakeNvml:
    monkeypatch.setattr(gpu_state, "_nvml", lambda: fake)
    monkeypatch.setattr(gpu_state, "_torch_uuid", lambda index: torch_uuid if index == 0 else None)
    return fake


def test_decode_reasons():
    assert gpu_state.decode_reasons(0) == []
    assert gpu_state.decode_reasons(0x4) == ["SwPowerCap"]
    assert gpu_state.decode_reasons(0x1 | 0x40 | 0x80) == ["GpuIdle", "HwThermalSlowdown", "HwPowerBrakeSlowdown"]
    assert gpu_state.decode_reasons(0x1FF) == list(gpu_state.REASONS.values())
    assert gpu_state.decode_reasons(0x8 | 0x1000) == ["HwSlowdown", "0x1000"]  # a newer driver's bit, still shown


def test_sample_reads_every_field_from_the_device_torch_uses(monkeypatch: pytest.MonkeyPatch):
    fake = install(monkeypatch, FakeNvml(reasons=0x4 | 0x20))
    state = gpu_state.sample()
    assert state == GpuState(1980, 3201, 41, 312.4, ["SwPowerCap", "SwThermalSlowdown"])
    # torch prints the UUID bare; NVML is asked for "GPU-<uuid>", and the index is never needed
    assert ("nvmlDeviceGetHandleByUUID", b"GPU-1234") in fake.calls
    assert "nvmlDeviceGetHandleByIndex_v2" not in fake.names()


def test_sample_initialises_nvml_and_finds_the_device_once_per_process(monkeypatch: pytest.MonkeyPatch):
    fake = install(monkeypatch, FakeNvml())
    first, second = gpu_state.sample(), gpu_state.sample()
    assert first == second and first is not None
    assert fake.names().count("nvmlInit_v2") == 1
    assert fake.names().count("nvmlDeviceGetHandleByUUID") == 1
    monkeypatch.setattr(gpu_state.os, "getpid", lambda: -1)  # as in a forked child
    assert gpu_state.sample() == first
    assert fake.names().count("nvmlInit_v2") == 2


def test_sample_maps_the_index_through_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch):
    fake = install(monkeypatch, FakeNvml(), torch_uuid=None)  # no UUID from torch (CUDA not used yet)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,0")
    assert gpu_state.sample(0) is not None
    assert ("nvmlDeviceGetHandleByIndex_v2", 3) in fake.calls  # torch's device 0 is NVML's device 3


def test_sample_finds_the_device_named_by_uuid_in_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch):
    fake = install(monkeypatch, FakeNvml(), torch_uuid=None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1234")
    assert gpu_state.sample(0) is not None
    assert "nvmlDeviceGetHandleByIndex_v2" not in fake.names()


def test_sample_gives_none_rather_than_another_gpus_state(monkeypatch: pytest.MonkeyPatch):
    fake = install(monkeypatch, FakeNvml(), torch_uuid="ffff")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-ffff")  # a UUID NVML does not know
    assert gpu_state.sample(0) is None
    assert "nvmlDeviceGetHandleByIndex_v2" not in fake.names()  # index 0 would be some other GPU
    assert "nvmlDeviceGetClockInfo" not in fake.names()


def test_sample_is_none_without_nvml(monkeypatch: pytest.MonkeyPatch):
    def missing() -> Any:
        raise OSError("libnvidia-ml.so.1: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(gpu_state, "_nvml", missing)
    assert gpu_state.sample() is None


def test_sample_is_none_when_nvml_does_not_initialise(monkeypatch: pytest.MonkeyPatch):
    fake = install(monkeypatch, FakeNvml(init_rc=9))  # NVML_ERROR_DRIVER_NOT_LOADED
    assert gpu_state.sample() is None
    assert gpu_state.sample() is None
    assert fake.names() == ["nvmlInit_v2"]  # the failure is remembered: no device is looked for, no retry


def test_a_reading_the_gpu_does_not_support_is_none(monkeypatch: pytest.MonkeyPatch):
    fake = install(monkeypatch, FakeNvml())
    fake.unsupported.add("nvmlDeviceGetPowerUsage")
    state = gpu_state.sample()
    assert state == GpuState(1980, 3201, 41, None, ["SwPowerCap"])
    assert gpu_state.describe(state) == "1980 MHz SM, 3201 MHz memory, 41 °C, ? W, reasons: SwPowerCap"


def test_an_old_driver_gives_the_reasons_under_their_old_name(monkeypatch: pytest.MonkeyPatch):
    fake = install(monkeypatch, FakeNvml(reasons=0x40))
    fake.missing.add("nvmlDeviceGetCurrentClocksEventReasons")
    state = gpu_state.sample()
    assert state is not None and state.reasons == ["HwThermalSlowdown"]
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" in fake.names()


def test_sample_never_raises(monkeypatch: pytest.MonkeyPatch):
    fake = install(monkeypatch, FakeNvml())

    def broken(handle: ctypes.c_void_p, sensor: int, ref: Any) -> int:
        raise ctypes.ArgumentError("argument 2: wrong type")

    fake.nvmlDeviceGetTemperature = broken  # type: ignore[method-assign]
    assert gpu_state.sample() is None


@pytest.mark.parametrize("reason", ["SwThermalSlowdown", "HwThermalSlowdown", "HwSlowdown", "HwPowerBrakeSlowdown"])
def test_thermal_and_hardware_slowdowns_make_a_timing_unfair(reason: str):
    before = GpuState(1980, 3201, 41, 120.0, ["GpuIdle"])
    after = GpuState(1410, 3201, 88, 690.0, ["SwPowerCap", reason])
    line = gpu_state.throttled([before, None, after])
    assert line is not None and "\n" not in line
    assert f"({reason})" in line and "sample 3 of 3" in line
    assert gpu_state.describe(after) in line
    assert gpu_state.throttled([after, before]) is not None


@pytest.mark.parametrize("reasons", [["SwPowerCap"], ["GpuIdle"], ["ApplicationsClocksSetting", "SyncBoost"],
                                     ["DisplayClockSetting"], [], None])
def test_power_cap_idle_and_clock_settings_are_not_throttling(reasons: list[str] | None):
    state = GpuState(1755, 3201, 62, 698.0, reasons)
    assert gpu_state.throttled([state, state]) is None


def test_throttled_without_any_state():
    assert gpu_state.throttled([]) is None
    assert gpu_state.throttled([None, None]) is None


def test_describe():
    state = GpuState(1980, 3201, 41, 312.4, ["SwPowerCap"])
    assert gpu_state.describe(state) == "1980 MHz SM, 3201 MHz memory, 41 °C, 312 W, reasons: SwPowerCap"
    assert gpu_state.describe(GpuState(1980, 3201, 41, 312.4, [])).endswith("reasons: none")
    assert gpu_state.describe(GpuState(None, None, None, None, None)) == (
        "? MHz SM, ? MHz memory, ? °C, ? W, reasons: unknown")
    assert "unknown" in gpu_state.describe(None)


@pytest.mark.parametrize("state", [GpuState(1980, 3201, 41, 312.4, ["SwPowerCap", "HwSlowdown"]),
                                   GpuState(None, None, None, None, None), GpuState(1410, 2619, 90, None, [])])
def test_state_round_trips_through_json(state: GpuState):
    data = json.loads(json.dumps(state.to_dict()))
    assert data["sm_mhz"] == state.sm_mhz and data["reasons"] == state.reasons
    assert GpuState.from_dict(data) == state


def test_from_dict_tolerates_a_result_without_some_fields():
    assert GpuState.from_dict({"sm_mhz": "1980", "power_w": 300}) == GpuState(1980, None, None, 300.0, None)


def test_torch_uuid_only_where_this_process_already_uses_cuda(monkeypatch: pytest.MonkeyPatch):
    initialised = [False]
    props = SimpleNamespace(uuid="58ddf6f9-4ad3-6af4-b07b-bfda8a7c7f8d")
    cuda = SimpleNamespace(is_initialized=lambda: initialised[0], get_device_properties=lambda index: props)
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=cuda))
    assert TORCH_UUID(0) is None  # no CUDA context is created just to read the GPU's state
    initialised[0] = True
    assert TORCH_UUID(0) == "58ddf6f9-4ad3-6af4-b07b-bfda8a7c7f8d"


def test_the_profile_says_the_gpus_state_around_the_rounds_as_before_and_after_where_it_moved():
    before = {"sm_mhz": 1980, "mem_mhz": 3201, "temperature_c": 44, "power_w": 401.0, "reasons": []}
    after = {**before, "temperature_c": 51, "reasons": ["HwSlowdown"]}
    assert gpu_state.describe_span([before, dict(before)]) == (
        "1980 MHz SM, 3201 MHz memory, 44 °C, 401 W, reasons: none")
    assert gpu_state.describe_span([before, after]) == (
        "1980 MHz SM, 3201 MHz memory, 44 °C, 401 W, reasons: none → "
        "1980 MHz SM, 3201 MHz memory, 51 °C, 401 W, reasons: HwSlowdown")
