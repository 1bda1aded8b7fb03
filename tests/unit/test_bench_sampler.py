"""The NVML sampler against a stand-in pynvml: fixed interval, refusals recorded as None, no crash;
and where NVML is absent (this machine) it says so."""

from __future__ import annotations

import itertools
import threading
import time
import types
from collections.abc import Collection
from typing import Any

import pytest

from gpunode.bench import sampler as sampler_mod
from gpunode.bench.sampler import NvmlSampler, SampleSet, UnavailableSampler, open_sampler


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {3: "Not Supported", 15: "GPU is lost", 12: "NVML Shared Library Not Found"}.get(self.value, "Unknown")


def fake_nvml(gpus: int = 2, *, unsupported: Collection[str] = (), flaky: Collection[str] = (),
              init_error: int | None = None, pcie_delay_s: float = 0.0, instant_refused: bool = False,
              raise_other: Collection[str] = ()) -> Any:
    """A pynvml with the calls the sampler makes. ``unsupported`` names raise Not Supported,
    ``flaky`` raise GPU-is-lost every other call, ``raise_other`` raise a non-NVML error."""
    calls: dict[str, int] = {}
    lock = threading.Lock()

    def api(name: str, result: Any) -> Any:
        def fn(*args: Any) -> Any:
            with lock:
                calls[name] = calls.get(name, 0) + 1
                count = calls[name]
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
        time.sleep(pcie_delay_s)
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


def run_for(sampler: NvmlSampler, seconds: float) -> SampleSet:
    sampler.start()
    time.sleep(seconds)
    return sampler.stop()


def test_samples_every_gpu_at_the_interval() -> None:
    result = run_for(NvmlSampler(0.05, fake_nvml(2)), 0.6)
    assert result.available and result.driver_version == "580.159.04"
    assert [g.name for g in result.gpus] == ["NVIDIA H200", "NVIDIA H200"]
    assert result.gpus[0].power_limit_w == 700.0 and result.gpus[1].uuid == "GPU-1"
    assert result.gpus[0].max_sm_clock_mhz == 1980 and result.gpus[0].memory_total_mib == 141 * 1024
    ticks = sorted({s.t for s in result.samples})
    assert 6 <= len(ticks) <= 14  # 0.6 s at 0.05 s (slack for a loaded machine)
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    assert max(gaps) < 0.16  # a fixed grid, not drifting by the read time
    assert {s.gpu for s in result.samples} == {0, 1}
    first = result.samples[0]
    assert (first.power_w, first.power_instant_w, first.util_gpu, first.util_mem, first.sm_clock_mhz,
            first.mem_used_mib, first.temp_c, first.reasons) == (350.0, 650.0, 100, 40, 1755, 2048.0, 51, 0x4)
    assert result.reason_names(first) == ["sw_power_cap"]
    assert result.pcie and result.pcie[0].rx_mbps == 1000.0 and result.pcie[0].tx_mbps == 2.0
    assert result.unsupported == {} and result.errors == []
    assert "power" in result.call_ms and result.duration_s >= 0.6


def test_not_supported_is_none_and_not_asked_again() -> None:
    nvml = fake_nvml(1, unsupported={"pcie", "temperature", "power_limit"}, instant_refused=True)
    result = run_for(NvmlSampler(0.05, nvml), 0.4)
    assert result.available and result.samples
    assert all(s.temp_c is None and s.power_instant_w is None for s in result.samples)
    assert all(s.power_w == 350.0 for s in result.samples)
    assert result.gpus[0].power_limit_w is None
    assert set(result.unsupported) == {"gpu0.pcie_throughput", "gpu0.temperature", "gpu0.power_limit",
                                       "gpu0.power_instant"}
    assert result.unsupported["gpu0.temperature"] == "Not Supported"
    assert nvml.calls["temperature"] == 1 and nvml.calls["pcie"] == 1  # asked once, then left alone
    assert result.pcie == [] and result.errors == []


def test_other_errors_are_counted_and_sampling_goes_on() -> None:
    result = run_for(NvmlSampler(0.05, fake_nvml(1, flaky={"power"}, raise_other={"clock"})), 0.4)
    powers = [s.power_w for s in result.samples]
    assert None in powers and 350.0 in powers  # every other read lost, the rest kept
    assert all(s.sm_clock_mhz is None for s in result.samples)
    assert any("GPU is lost" in e for e in result.errors) and any("binding broke" in e for e in result.errors)
    assert not result.unsupported


def test_a_missing_function_is_unsupported() -> None:
    nvml = fake_nvml(1)
    del nvml.nvmlDeviceGetFieldValues
    del nvml.nvmlDeviceGetCurrentClocksEventReasons  # an older library: the Throttle name is tried
    nvml.nvmlDeviceGetCurrentClocksThrottleReasons = lambda handle: 0x1
    result = run_for(NvmlSampler(0.05, nvml), 0.2)
    assert result.unsupported["gpu0.power_instant"] == "not in this nvidia-ml-py"
    assert all(s.reasons == 0x1 for s in result.samples)


def test_slow_pcie_reads_do_not_slow_the_ticks() -> None:
    # NVML's PCIe counter takes ~20 ms a call: 2 GPUs x 2 calls x 60 ms here, longer than a tick.
    result = run_for(NvmlSampler(0.05, fake_nvml(2, pcie_delay_s=0.06)), 0.6)
    ticks = sorted({s.t for s in result.samples})
    assert len(ticks) >= 6
    assert 2 <= len(result.pcie) <= 6  # one per 2 x 60 ms, on its own thread


def test_restartable_between_levels() -> None:
    sampler = NvmlSampler(0.05, fake_nvml(1))
    first, second = run_for(sampler, 0.2), run_for(sampler, 0.2)
    assert first.samples and second.samples and first is not second
    assert min(s.t for s in second.samples) < 0.05  # the clock restarts per level


def test_init_failure_is_a_set_that_says_why() -> None:
    result = run_for(NvmlSampler(0.05, fake_nvml(1, init_error=12)), 0.0)
    assert not result.available and "NVML did not start" in result.reason
    with pytest.raises(ValueError):
        NvmlSampler(0)


def test_open_sampler_here_says_unavailable() -> None:
    """This machine has nvidia-ml-py but no driver: the sweep must still run."""
    chosen = open_sampler()
    assert isinstance(chosen, UnavailableSampler)
    assert "NVML" in chosen.reason or "nvidia-ml-py" in chosen.reason
    chosen.start()
    result = chosen.stop()
    assert not result.available and result.reason == chosen.reason and result.samples == []


def test_open_sampler_paths() -> None:
    assert isinstance(open_sampler(0.1, fake_nvml(2)), NvmlSampler)
    none = open_sampler(0.1, fake_nvml(0))
    assert isinstance(none, UnavailableSampler) and none.reason == "NVML sees no GPU"
    broken = open_sampler(0.1, fake_nvml(1, init_error=12))
    assert isinstance(broken, UnavailableSampler) and "NVML did not start" in broken.reason


def test_without_nvidia_ml_py(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> Any:
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(sampler_mod, "import_nvml", missing)
    chosen = open_sampler()
    assert isinstance(chosen, UnavailableSampler) and "nvidia-ml-py" in chosen.reason
    result = run_for(NvmlSampler(0.05), 0.0)
    assert not result.available and "nvidia-ml-py" in result.reason


def test_json_round_trip_and_window() -> None:
    result = run_for(NvmlSampler(0.05, fake_nvml(1)), 0.3)
    again = SampleSet.from_json(result.to_json())
    assert again == result
    part = again.window(0.1, 0.2)
    assert part.samples and all(0.1 <= s.t < 0.2 for s in part.samples)
    with pytest.raises(ValueError):
        SampleSet.from_json({"schema": "other"})
