"""The NVML sampler against a stand-in pynvml: fixed interval, refusals recorded as None, no crash;
and where NVML is absent (this machine) it says so.

The sampler's threads run for real, on virtual time (tests/fakes/clock.py): the sampler's clock is
the test's, and its waits pass virtual time, so each tick lands exactly where the sampler's own
arithmetic puts it, however loaded the machine. How fast real sampling is: benchmarks/bench_sampler_gpu.py.
Runs end off the tick grid (0.625 s at 0.05 s), so stopping never ties with a tick.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from gpunode.bench import sampler as sampler_mod
from gpunode.bench.sampler import NvmlSampler, SampleSet, UnavailableSampler, open_sampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.clock import VirtualClock, VirtualEvent  # noqa: E402 - tests/ put on the path just above
from fakes.nvml import fake_nvml  # noqa: E402

INTERVAL_S = 0.05


def grid(count: int, start: int = 0) -> list[float]:
    """The tick times a fixed grid gives: k * interval."""
    return [round(k * INTERVAL_S, 4) for k in range(start, start + count)]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> VirtualClock:
    """Virtual time as the sampler module's ``time`` (monotonic, perf_counter, time)."""
    virtual = VirtualClock()
    monkeypatch.setattr(sampler_mod, "time", virtual)
    return virtual


def run_for(sampler: NvmlSampler, clock: VirtualClock, seconds: float) -> SampleSet:
    """Start, let ``seconds`` of virtual time pass, stop."""
    clock.adopt([threading.current_thread()])  # hold time back until this thread sleeps
    sampler._stop = VirtualEvent(clock)  # the sampler waits on its stop event: on the same clock
    sampler.start()
    clock.adopt(sampler._threads)
    clock.sleep(seconds)
    # Set before leaving the clock (stop() sets it again): no tick can slip in between.
    sampler._stop.set()
    clock.leave()
    return sampler.stop()


def test_samples_every_gpu_at_the_interval(clock: VirtualClock) -> None:
    result = run_for(NvmlSampler(INTERVAL_S, fake_nvml(2)), clock, 0.625)
    assert result.available and result.driver_version == "580.159.04"
    assert [g.name for g in result.gpus] == ["NVIDIA H200", "NVIDIA H200"]
    assert result.gpus[0].power_limit_w == 700.0 and result.gpus[1].uuid == "GPU-1"
    assert result.gpus[0].max_sm_clock_mhz == 1980 and result.gpus[0].memory_total_mib == 141 * 1024
    # Every GPU at every tick of the grid, the first at once: 0, 0.05, ... 0.6.
    assert [(s.t, s.gpu) for s in result.samples] == [(t, gpu) for t in grid(13) for gpu in (0, 1)]
    first = result.samples[0]
    assert (first.power_w, first.power_instant_w, first.util_gpu, first.util_mem, first.sm_clock_mhz,
            first.mem_used_mib, first.temp_c, first.reasons) == (350.0, 650.0, 100, 40, 1755, 2048.0, 51, 0x4)
    assert result.reason_names(first) == ["sw_power_cap"]
    assert result.pcie and result.pcie[0].rx_mbps == 1000.0 and result.pcie[0].tx_mbps == 2.0
    assert sorted({p.t for p in result.pcie}) == grid(13)  # quick PCIe reads: at the tick interval too
    assert result.unsupported == {} and result.errors == []
    assert "power" in result.call_ms and result.duration_s == 0.625


def test_a_slow_read_skips_ticks_instead_of_bunching_them(clock: VirtualClock) -> None:
    """The third power read takes 0.12 s (0.1 to 0.22): the ticks at 0.15 and 0.2 are missed, the
    next is the grid's 0.25, and the grid never drifts by the read time."""
    nvml = fake_nvml(1, sleep=clock.sleep, slow={("power", 3): 0.12})
    result = run_for(NvmlSampler(INTERVAL_S, nvml, pcie=False), clock, 0.425)
    assert [s.t for s in result.samples] == grid(3) + grid(4, start=5)
    assert result.errors == []


def test_not_supported_is_none_and_not_asked_again(clock: VirtualClock) -> None:
    nvml = fake_nvml(1, unsupported={"pcie", "temperature", "power_limit"}, instant_refused=True)
    result = run_for(NvmlSampler(INTERVAL_S, nvml), clock, 0.425)
    assert result.available and [s.t for s in result.samples] == grid(9)
    assert all(s.temp_c is None and s.power_instant_w is None for s in result.samples)
    assert all(s.power_w == 350.0 for s in result.samples)
    assert result.gpus[0].power_limit_w is None
    assert set(result.unsupported) == {"gpu0.pcie_throughput", "gpu0.temperature", "gpu0.power_limit",
                                       "gpu0.power_instant"}
    assert result.unsupported["gpu0.temperature"] == "Not Supported"
    assert nvml.calls["temperature"] == 1 and nvml.calls["pcie"] == 1  # asked once, then left alone
    assert nvml.calls["fields"] == 1  # a field value refused once is not asked for again either
    assert result.pcie == [] and result.errors == []


def test_other_errors_are_counted_and_sampling_goes_on(clock: VirtualClock) -> None:
    result = run_for(NvmlSampler(INTERVAL_S, fake_nvml(1, flaky={"power"}, raise_other={"clock"})), clock, 0.425)
    # Every other read lost (NVML's GPU-is-lost), the rest kept, at every tick.
    assert [s.power_w for s in result.samples] == [350.0, None] * 4 + [350.0]
    assert all(s.sm_clock_mhz is None for s in result.samples)
    lost = [e for e in result.errors if "GPU is lost" in e]
    broke = [e for e in result.errors if "binding broke" in e]
    assert len(lost) == 4 and len(broke) == 9 and len(result.errors) == 13
    assert not result.unsupported


def test_a_missing_function_is_unsupported(clock: VirtualClock) -> None:
    nvml = fake_nvml(1)
    del nvml.nvmlDeviceGetFieldValues
    del nvml.nvmlDeviceGetCurrentClocksEventReasons  # an older library: the Throttle name is tried
    nvml.nvmlDeviceGetCurrentClocksThrottleReasons = lambda handle: 0x1
    result = run_for(NvmlSampler(INTERVAL_S, nvml), clock, 0.225)
    assert result.unsupported["gpu0.power_instant"] == "not in this nvidia-ml-py"
    assert len(result.samples) == 5 and all(s.reasons == 0x1 for s in result.samples)


def test_slow_pcie_reads_do_not_slow_the_ticks(clock: VirtualClock) -> None:
    # NVML's PCIe counter takes ~20 ms a call: 2 GPUs x 2 calls x 60 ms here, longer than a tick.
    nvml = fake_nvml(2, pcie_delay_s=0.06, sleep=clock.sleep)
    result = run_for(NvmlSampler(INTERVAL_S, nvml), clock, 0.625)
    assert sorted({s.t for s in result.samples}) == grid(13)  # every tick, on the grid
    # On its own thread, GPU after GPU, each read 2 x 60 ms; the one under way at the stop is finished.
    assert [(p.t, p.gpu) for p in result.pcie] == [(0.0, 0), (0.12, 1), (0.24, 0), (0.36, 1), (0.48, 0), (0.6, 1)]
    assert result.call_ms["pcie_throughput"] == 60.0 and result.errors == []


def test_restartable_between_levels(clock: VirtualClock) -> None:
    sampler = NvmlSampler(INTERVAL_S, fake_nvml(1))
    first, second = run_for(sampler, clock, 0.225), run_for(sampler, clock, 0.225)
    assert first is not second
    # The clock restarts per level: the second set's ticks are the same grid, from 0.
    assert [s.t for s in first.samples] == [s.t for s in second.samples] == grid(5)
    assert second.started_at > first.started_at


def test_init_failure_is_a_set_that_says_why(clock: VirtualClock) -> None:
    result = run_for(NvmlSampler(INTERVAL_S, fake_nvml(1, init_error=12)), clock, 0.0)
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


def test_without_nvidia_ml_py(monkeypatch: pytest.MonkeyPatch, clock: VirtualClock) -> None:
    def missing() -> Any:
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(sampler_mod, "import_nvml", missing)
    chosen = open_sampler()
    assert isinstance(chosen, UnavailableSampler) and "nvidia-ml-py" in chosen.reason
    result = run_for(NvmlSampler(INTERVAL_S), clock, 0.0)
    assert not result.available and "nvidia-ml-py" in result.reason


def test_json_round_trip_and_window(clock: VirtualClock) -> None:
    result = run_for(NvmlSampler(INTERVAL_S, fake_nvml(1)), clock, 0.325)
    again = SampleSet.from_json(result.to_json())
    assert again == result
    part = again.window(0.1, 0.2)
    assert [s.t for s in part.samples] == [0.1, 0.15]  # from t0, up to but not including t1
    assert [p.t for p in part.pcie] == [0.1, 0.15] and part.duration_s == pytest.approx(0.1)
    with pytest.raises(ValueError):
        SampleSet.from_json({"schema": "other"})
