"""Sample every GPU through NVML at a fixed interval while a benchmark level runs.

``NvmlSampler.start()`` initialises NVML, reads what does not change (name, UUID, power limit, max
SM clock, memory size) and starts two daemon threads:

- the tick thread reads, for every GPU, every ``interval_s``: power (``nvmlDeviceGetPowerUsage``,
  which Ampere and newer average over about a second, and the instantaneous
  ``NVML_FI_DEV_POWER_INSTANT`` field where the driver has it), utilisation (GPU and memory), SM
  clock, memory used, temperature and the clock-event ("throttle") reasons bitmask. A tick that
  falls behind is skipped, never bunched up.
- the PCIe thread reads ``nvmlDeviceGetPcieThroughput`` TX and RX GPU after GPU. NVML counts bytes
  over a 20 ms window inside each call, so two calls per GPU cost ~40 ms: on 8 GPUs a round takes
  ~320 ms, more than a 0.1 s tick, which is why it has its own thread and cadence.

A reading NVML refuses is recorded as ``None``. ``NotSupported`` (and a function the installed
library lacks) is remembered per GPU and reading, with NVML's message in ``unsupported``, and not
asked again; other errors are counted in ``errors``. Nothing in a sampling thread raises out of it.

``stop()`` returns a ``SampleSet`` (JSON with ``to_json``/``from_json``: recorded sets drive the unit
tests). Where NVML is absent (no driver, no nvidia-ml-py) ``open_sampler`` returns an
``UnavailableSampler`` whose sets say why, and a sweep still runs.

Imports only the standard library, ``gpunode.stages.p2p.topology`` (standard library) and, lazily, pynvml.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from gpunode.stages.p2p.topology import nvml_text, reason_names

SCHEMA = "gpunode.bench.samples/1"
DEFAULT_INTERVAL_S = 0.1
STOP_JOIN_S = 2.0  # beyond the longest NVML call we make (a PCIe read is ~20 ms)


@dataclass
class GpuInfo:
    index: int  # NVML index
    name: str
    uuid: str
    pci_bus_id: str = ""
    power_limit_w: float | None = None  # the enforced limit: what the board holds power to ("TDP" here)
    max_sm_clock_mhz: int | None = None
    memory_total_mib: int | None = None


@dataclass
class Sample:
    """One GPU at one tick. ``t`` is seconds since the sampler started (monotonic clock)."""

    t: float
    gpu: int
    power_w: float | None = None  # nvmlDeviceGetPowerUsage
    power_instant_w: float | None = None  # NVML_FI_DEV_POWER_INSTANT
    util_gpu: int | None = None  # % of the interval in which a kernel was running
    util_mem: int | None = None  # % of the interval in which device memory was read or written
    sm_clock_mhz: int | None = None
    mem_used_mib: float | None = None
    temp_c: int | None = None
    reasons: int | None = None  # clock-event reasons bitmask (gpunode.stages.p2p.topology.CLOCK_EVENT_REASONS)


@dataclass
class PcieSample:
    t: float  # when the TX read began
    gpu: int
    tx_mbps: float | None = None  # decimal MB/s (NVML reports KB/s)
    rx_mbps: float | None = None


@dataclass
class SampleSet:
    available: bool
    reason: str = ""  # why not available
    interval_s: float = DEFAULT_INTERVAL_S
    started_at: float = 0.0  # epoch seconds
    duration_s: float = 0.0
    driver_version: str | None = None
    gpus: list[GpuInfo] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    pcie: list[PcieSample] = field(default_factory=list)
    unsupported: dict[str, str] = field(default_factory=dict)  # "gpu0.power_instant" -> NVML's message
    errors: list[str] = field(default_factory=list)
    call_ms: dict[str, float] = field(default_factory=dict)  # mean duration of each NVML call
    schema: str = SCHEMA

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SampleSet:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} document (schema: {data.get('schema')!r})")
        plain = {k: v for k, v in data.items() if k not in ("gpus", "samples", "pcie")}
        return cls(**plain, gpus=[GpuInfo(**g) for g in data.get("gpus", [])],
                   samples=[Sample(**s) for s in data.get("samples", [])],
                   pcie=[PcieSample(**p) for p in data.get("pcie", [])])

    def window(self, t0: float | None = None, t1: float | None = None) -> SampleSet:
        """The samples with ``t0 <= t < t1`` (a phase of a recording)."""
        lo = float("-inf") if t0 is None else t0
        hi = float("inf") if t1 is None else t1
        return SampleSet(self.available, self.reason, self.interval_s, self.started_at,
                         max(0.0, min(hi, self.duration_s) - max(lo, 0.0)), self.driver_version, list(self.gpus),
                         [s for s in self.samples if lo <= s.t < hi], [p for p in self.pcie if lo <= p.t < hi],
                         dict(self.unsupported), list(self.errors), dict(self.call_ms))

    def reason_names(self, sample: Sample) -> list[str]:
        return reason_names(sample.reasons)


class Sampler(Protocol):
    """What a sweep needs: start before a level, stop after it."""

    def start(self) -> None: ...

    def stop(self) -> SampleSet: ...


class UnavailableSampler:
    """No NVML here: every level's set says so, and why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self._began = 0.0

    def start(self) -> None:
        self._began = time.time()

    def stop(self) -> SampleSet:
        return SampleSet(available=False, reason=self.reason, started_at=self._began,
                         duration_s=max(0.0, time.time() - self._began))


def import_nvml() -> Any:
    import pynvml  # the nvidia-ml-py distribution (FIELD-NOTES s7)

    return pynvml


def open_sampler(interval_s: float = DEFAULT_INTERVAL_S, nvml: Any = None) -> NvmlSampler | UnavailableSampler:
    """An NVML sampler when NVML starts here, else one that says why not."""
    if nvml is None:
        try:
            nvml = import_nvml()
        except ImportError:
            return UnavailableSampler("the nvidia-ml-py package is not installed")
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return UnavailableSampler(f"NVML did not start: {exc} (no NVIDIA driver on this machine)")
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except nvml.NVMLError as exc:
        return UnavailableSampler(f"NVML could not count the GPUs: {exc}")
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
    if count == 0:
        return UnavailableSampler("NVML sees no GPU")
    return NvmlSampler(interval_s, nvml)


def field_value(value: Any) -> float | None:
    """A ``c_nvmlFieldValue_t``'s number by its valueType, or None when NVML refused it."""
    if int(getattr(value, "nvmlReturn", 1)) != 0:
        return None
    kind = int(value.valueType)
    member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(kind)
    return None if member is None else float(getattr(value.value, member))


class _Calls:
    """NVML calls that never raise: a refusal becomes None, remembered per GPU and reading."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.unsupported: dict[str, str] = {}
        self.errors: list[str] = []
        self.error_count = 0
        self.seconds: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()
        not_supported = getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3)
        not_found = getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13)
        self.permanent = {not_supported, not_found}

    def __call__(self, gpu: int, name: str, fn: Callable[..., Any] | None, *args: Any) -> Any:
        key = f"gpu{gpu}.{name}"
        if key in self.unsupported:
            return None
        if fn is None:
            self.unsupported[key] = "not in this nvidia-ml-py"
            return None
        began = time.perf_counter()
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code in self.permanent:
                self.unsupported[key] = str(exc)
            else:
                with self.lock:
                    self.error_count += 1
                    if len(self.errors) < 20:
                        self.errors.append(f"{key}: {exc}")
            return None
        except Exception as exc:  # a broken binding must not kill the sampler
            with self.lock:
                self.error_count += 1
                if len(self.errors) < 20:
                    self.errors.append(f"{key}: {type(exc).__name__}: {exc}")
            return None
        finally:
            spent = time.perf_counter() - began
            with self.lock:
                self.seconds[name] = self.seconds.get(name, 0.0) + spent
                self.counts[name] = self.counts.get(name, 0) + 1

    def mean_ms(self) -> dict[str, float]:
        return {name: round(self.seconds[name] / self.counts[name] * 1000, 3) for name in sorted(self.seconds)}


class NvmlSampler:
    """Samples every GPU NVML sees, from ``start()`` to ``stop()``; reusable for the next level."""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, nvml: Any = None, pcie: bool = True) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be positive, got {interval_s!r}")
        self.interval_s = float(interval_s)
        self.nvml = nvml
        self.pcie_enabled = pcie
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._set: SampleSet | None = None
        self._calls: _Calls | None = None
        self._handles: list[Any] = []
        self._t0 = 0.0
        self._initialised = False

    def now(self) -> float:
        """Seconds on the samples' clock (since the last ``start()``): to mark phases of a recording."""
        return time.monotonic() - self._t0

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        if self._threads:
            raise RuntimeError("the sampler is already running")
        nvml = self.nvml
        if nvml is None:
            try:
                nvml = self.nvml = import_nvml()
            except ImportError:
                self._set = SampleSet(available=False, reason="the nvidia-ml-py package is not installed",
                                      interval_s=self.interval_s, started_at=time.time())
                return
        self._stop.clear()
        self._t0 = time.monotonic()
        began = time.time()
        try:
            nvml.nvmlInit()
            self._initialised = True
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(int(nvml.nvmlDeviceGetCount()))]
        except nvml.NVMLError as exc:
            self._shutdown()
            self._set = SampleSet(available=False, reason=f"NVML did not start: {exc}", interval_s=self.interval_s,
                                  started_at=began)
            return
        calls = self._calls = _Calls(nvml)
        driver = calls(-1, "driver_version", getattr(nvml, "nvmlSystemGetDriverVersion", None))
        self._set = SampleSet(available=bool(self._handles), reason="" if self._handles else "NVML sees no GPU",
                              interval_s=self.interval_s, started_at=began,
                              driver_version=nvml_text(driver) if driver is not None else None,
                              gpus=[self._info(i, h) for i, h in enumerate(self._handles)])
        if not self._handles:
            return
        self._threads = [threading.Thread(target=self._guard, args=(self._tick_loop,), name="nvml-sampler",
                                          daemon=True)]
        if self.pcie_enabled:
            self._threads.append(threading.Thread(target=self._guard, args=(self._pcie_loop,),
                                                  name="nvml-pcie-sampler", daemon=True))
        for thread in self._threads:
            thread.start()

    def stop(self) -> SampleSet:
        result = self._set or SampleSet(available=False, reason="the sampler was not started")
        self._stop.set()
        for thread in self._threads:
            thread.join(STOP_JOIN_S)
            if thread.is_alive():
                result.errors.append(f"{thread.name} did not stop within {STOP_JOIN_S} s (an NVML call hung)")
        self._threads = []
        if self._calls is not None:
            result.unsupported = dict(self._calls.unsupported)
            result.errors.extend(self._calls.errors)
            if self._calls.error_count > len(self._calls.errors):
                result.errors.append(f"... {self._calls.error_count - len(self._calls.errors)} more NVML errors")
            result.call_ms = self._calls.mean_ms()
        if result.available:
            result.duration_s = round(time.monotonic() - self._t0, 3)
        self._shutdown()
        self._set = None
        self._calls = None
        return result

    def _shutdown(self) -> None:
        if self._initialised and self.nvml is not None:
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()
        self._initialised = False
        self._handles = []

    def _guard(self, loop: Callable[[SampleSet, _Calls], None]) -> None:
        result, calls = self._set, self._calls
        if result is None or calls is None:
            return
        try:
            loop(result, calls)
        except Exception as exc:  # recorded, never raised: the benchmark goes on without samples
            result.errors.append(f"{threading.current_thread().name} stopped: {type(exc).__name__}: {exc}")

    # -- readings ------------------------------------------------------------------------------
    def _info(self, index: int, handle: Any) -> GpuInfo:
        nvml, calls = self.nvml, self._calls
        assert calls is not None
        pci = calls(index, "pci_info", nvml.nvmlDeviceGetPciInfo, handle)
        limit = calls(index, "power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        memory = calls(index, "memory_info", nvml.nvmlDeviceGetMemoryInfo, handle)
        name = calls(index, "name", nvml.nvmlDeviceGetName, handle)
        uuid = calls(index, "uuid", nvml.nvmlDeviceGetUUID, handle)
        return GpuInfo(index=index, name=nvml_text(name) if name is not None else "?",
                       uuid=nvml_text(uuid) if uuid is not None else "?",
                       pci_bus_id=nvml_text(pci.busId) if pci is not None else "",
                       power_limit_w=None if limit is None else limit / 1000.0,
                       max_sm_clock_mhz=calls(index, "max_sm_clock", nvml.nvmlDeviceGetMaxClockInfo, handle,
                                              nvml.NVML_CLOCK_SM),
                       memory_total_mib=None if memory is None else int(memory.total) // 2**20)

    def _read(self, index: int, handle: Any, t: float, calls: _Calls) -> Sample:
        nvml = self.nvml
        power = calls(index, "power", nvml.nvmlDeviceGetPowerUsage, handle)
        instant = None
        fields = calls(index, "power_instant", getattr(nvml, "nvmlDeviceGetFieldValues", None), handle,
                       [getattr(nvml, "NVML_FI_DEV_POWER_INSTANT", 186)])
        if fields is not None:
            milliwatts = field_value(fields[0])
            if milliwatts is None:
                calls.unsupported.setdefault(f"gpu{index}.power_instant",
                                             f"field value refused (nvmlReturn {int(fields[0].nvmlReturn)})")
            else:
                instant = milliwatts / 1000.0
        util = calls(index, "utilization", nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = calls(index, "memory_info", nvml.nvmlDeviceGetMemoryInfo, handle)
        reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        reasons = calls(index, "clock_event_reasons", reasons_fn, handle)
        return Sample(
            t=round(t, 4), gpu=index,
            power_w=None if power is None else power / 1000.0,
            power_instant_w=instant,
            util_gpu=None if util is None else int(util.gpu),
            util_mem=None if util is None else int(util.memory),
            sm_clock_mhz=calls(index, "sm_clock", nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
            mem_used_mib=None if memory is None else round(int(memory.used) / 2**20, 1),
            temp_c=calls(index, "temperature", nvml.nvmlDeviceGetTemperature, handle,
                         getattr(nvml, "NVML_TEMPERATURE_GPU", 0)),
            reasons=None if reasons is None else int(reasons),
        )

    def _tick_loop(self, result: SampleSet, calls: _Calls) -> None:
        tick = 0
        while not self._stop.is_set():
            t = time.monotonic() - self._t0
            for index, handle in enumerate(self._handles):
                result.samples.append(self._read(index, handle, t, calls))
            # The next tick on the fixed grid; ticks missed while NVML was slow are skipped.
            tick = max(tick + 1, int((time.monotonic() - self._t0) / self.interval_s) + 1)
            self._stop.wait(max(0.0, self._t0 + tick * self.interval_s - time.monotonic()))

    def _pcie_loop(self, result: SampleSet, calls: _Calls) -> None:
        nvml = self.nvml
        tx_kind = getattr(nvml, "NVML_PCIE_UTIL_TX_BYTES", 0)
        rx_kind = getattr(nvml, "NVML_PCIE_UTIL_RX_BYTES", 1)
        while not self._stop.is_set():
            round_began = time.monotonic()
            for index, handle in enumerate(self._handles):
                if self._stop.is_set():
                    return
                t = time.monotonic() - self._t0
                tx = calls(index, "pcie_throughput", nvml.nvmlDeviceGetPcieThroughput, handle, tx_kind)
                rx = calls(index, "pcie_throughput", nvml.nvmlDeviceGetPcieThroughput, handle, rx_kind)
                if tx is None and rx is None and f"gpu{index}.pcie_throughput" in calls.unsupported:
                    continue
                result.pcie.append(PcieSample(t=round(t, 4), gpu=index,
                                              tx_mbps=None if tx is None else tx / 1000.0,
                                              rx_mbps=None if rx is None else rx / 1000.0))
            if all(f"gpu{i}.pcie_throughput" in calls.unsupported for i in range(len(self._handles))):
                return
            # No faster than the tick interval, when the calls themselves are quick.
            self._stop.wait(max(0.0, round_began + self.interval_s - time.monotonic()))
