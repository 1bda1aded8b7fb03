"""A stand-in pynvml with the calls gpunode.bench.sampler makes, for its tests
(tests/unit/test_bench_sampler.py) and for benchmarks/sampler_ticks.py."""

from __future__ import annotations

import threading
import types
from collections.abc import Callable, Collection
from typing import Any


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {3: "Not Supported", 15: "GPU is lost", 12: "NVML Shared Library Not Found"}.get(self.value, "Unknown")


def fake_nvml(gpus: int = 2, *, unsupported: Collection[str] = (), flaky: Collection[str] = (),
              init_error: int | None = None, pcie_delay_s: float = 0.0, instant_refused: bool = False,
              raise_other: Collection[str] = (), sleep: Callable[[float], None] | None = None,
              slow: dict[tuple[str, int], float] | None = None) -> Any:
    """A pynvml with the calls the sampler makes. ``unsupported`` names raise Not Supported,
    ``flaky`` raise GPU-is-lost every other call, ``raise_other`` raise a non-NVML error. A PCIe read
    takes ``pcie_delay_s`` and ``slow[(name, n)]`` makes the n-th call of ``name`` take that long,
    both through ``sleep`` (the tests' virtual clock's; time.sleep for real time)."""
    if (pcie_delay_s or slow) and sleep is None:
        raise ValueError("a delay needs a sleep function")
    calls: dict[str, int] = {}
    lock = threading.Lock()

    def api(name: str, result: Any) -> Any:
        def fn(*args: Any) -> Any:
            with lock:
                calls[name] = calls.get(name, 0) + 1
                count = calls[name]
            if slow and (name, count) in slow:
                sleep(slow[(name, count)])  # type: ignore[misc] - checked above
            if name in unsupported:
                raise NVMLError(3)
            if name in raise_other:
                raise RuntimeError("binding broke")
            if name in flaky and count % 2 == 0:
                raise NVMLError(15)
            return result(*args) if callable(result) else result
        return fn

    def init() -> None:
        if init_error is not None:
            raise NVMLError(init_error)

    def pcie(handle: int, kind: int) -> int:
        if pcie_delay_s:
            sleep(pcie_delay_s)  # type: ignore[misc] - checked above
        return 1_000_000 if kind == 1 else 2000  # KB/s: RX 1 GB/s, TX 2 MB/s

    def fields(handle: int, ids: list[int]) -> list[Any]:
        value = types.SimpleNamespace(uiVal=650_000, dVal=0.0)
        return [types.SimpleNamespace(nvmlReturn=3 if instant_refused else 0, valueType=1, value=value)]

    module = types.SimpleNamespace(
        NVMLError=NVMLError, NVML_ERROR_NOT_SUPPORTED=3, NVML_ERROR_FUNCTION_NOT_FOUND=13, NVML_CLOCK_SM=1,
        NVML_TEMPERATURE_GPU=0, NVML_PCIE_UTIL_TX_BYTES=0, NVML_PCIE_UTIL_RX_BYTES=1, NVML_FI_DEV_POWER_INSTANT=186,
        nvmlInit=init, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: gpus,
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlSystemGetDriverVersion=api("driver", "580.159.04"),
        nvmlDeviceGetName=api("name", "NVIDIA H200"), nvmlDeviceGetUUID=api("uuid", lambda h: f"GPU-{h}"),
        nvmlDeviceGetPciInfo=api("pci", lambda h: types.SimpleNamespace(busId=f"00000000:0{h}:00.0")),
        nvmlDeviceGetEnforcedPowerLimit=api("power_limit", 700_000),
        nvmlDeviceGetMaxClockInfo=api("max_clock", 1980),
        nvmlDeviceGetMemoryInfo=api("memory", types.SimpleNamespace(total=141 * 2**30, used=2 * 2**30)),
        nvmlDeviceGetPowerUsage=api("power", 350_000),
        nvmlDeviceGetFieldValues=api("fields", fields),
        nvmlDeviceGetUtilizationRates=api("utilization", types.SimpleNamespace(gpu=100, memory=40)),
        nvmlDeviceGetClockInfo=api("clock", 1755),
        nvmlDeviceGetTemperature=api("temperature", 51),
        nvmlDeviceGetCurrentClocksEventReasons=api("reasons", 0x4),
        nvmlDeviceGetPcieThroughput=api("pcie", pcie),
    )
    module.calls = calls
    return module
