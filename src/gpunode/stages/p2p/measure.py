"""Copy bandwidth and latency through CUDA, via PyTorch, measured the way nvbandwidth measures them.

For every measurement:

- the source holds a known pattern (int32 ``i + seed``, a different seed per source GPU) and the
  destination is poisoned (-1) before each sample;
- warm-up copies first, then ``samples`` timed loops of back-to-back copies between two CUDA events.
  A short spin kernel holds the stream while Python queues the loop, so the events time the copies,
  not Python's launch rate;
- the result is the median of the samples in decimal GB/s (1e9 bytes per second) of bytes copied:
  a device-local copy of N bytes counts N, not the 2N read and written;
- after every sample the destination is compared element by element with the pattern (on the GPU
  for a device destination, on the CPU for host memory). A P2P capability flag is no proof: a copy
  can complete and lose its data under a translating IOMMU.

Host buffers are plain pages registered with ``cudaHostRegister`` (pinned) by the measuring
thread after it is pinned to the GPU's NUMA-local CPUs, so the pages land on that GPU's node.

PyTorch is imported lazily (``import_torch``): the package imports without it.
"""

from __future__ import annotations

import ctypes
import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

GB = 1e9
ELEMENT_BYTES = 4  # int32 pattern
POISON = -1
MAX_SIZE_MB = 4096  # int32 pattern indices stay below 2**31
# NVLink multicast can put a shared host's GPUs out of service: keep it off in this process and in
# anything it starts (FIELD-NOTES; the device machine's rules).
SAFE_ENVIRONMENT: dict[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
CUDA_ERROR_NAMES: dict[int, str] = {
    0: "CUDA_SUCCESS",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    34: "CUDA_ERROR_STUB_LIBRARY",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    304: "CUDA_ERROR_OPERATING_SYSTEM",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    999: "CUDA_ERROR_UNKNOWN",
}


def apply_safe_environment(environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
    for name, value in SAFE_ENVIRONMENT.items():
        environ[name] = value


@dataclass
class Method:
    """How every measurement is made; recorded with the results."""

    size_bytes: int
    warmup_copies: int = 2
    samples: int = 7
    min_sample_s: float = 0.02  # each timed loop lasts at least this long
    max_copies_per_sample: int = 64
    latency_bytes: int = ELEMENT_BYTES
    latency_copies: int = 100
    latency_samples: int = 5
    load_s: float = 0.25  # how long copies run while NVML reads the link under load
    step_timeout_s: float = 60.0  # a single measurement longer than this is a hang


def method_for(size_mb: int, quick: bool) -> Method:
    if quick:
        return Method(size_bytes=size_mb * 2**20, warmup_copies=1, samples=3, min_sample_s=0.01,
                      latency_copies=50, latency_samples=3, load_s=0.15)
    return Method(size_bytes=size_mb * 2**20)


@dataclass
class Bandwidth:
    kind: str  # h2d, d2h, d2d, p2p, p2p_bidir
    src: str  # "host" or "cuda:N" (CUDA ordinal)
    dst: str
    bytes_per_copy: int
    copies_per_sample: int
    samples_gbps: list[float]
    median_gbps: float
    verified: bool  # every sample's destination matched the source pattern
    mismatched_elements: int
    seconds: float  # wall time of the whole measurement: warm-up, samples, checks
    path: str | None = None  # pairs only: "p2p" (peer access) or "staged" (through host memory)
    forward_gbps: float | None = None  # bidirectional only: src->dst while dst->src ran
    reverse_gbps: float | None = None


@dataclass
class Latency:
    """Time per small copy, back to back on one stream: copy-engine latency, not a load latency."""

    kind: str
    src: str
    dst: str
    bytes_per_copy: int
    copies_per_sample: int
    samples_us: list[float]
    median_us: float
    verified: bool
    seconds: float
    path: str | None = None


@dataclass
class GpuMeasurements:
    nvml_index: int
    cuda_ordinal: int
    pinned_cpus: list[int] = field(default_factory=list)
    pinning: str = ""
    host_memory: str = ""
    h2d: Bandwidth | None = None
    d2h: Bandwidth | None = None
    d2d: Bandwidth | None = None
    h2d_latency: Latency | None = None
    d2h_latency: Latency | None = None
    d2d_latency: Latency | None = None
    load_seconds: float | None = None
    errors: dict[str, str] = field(default_factory=dict)


@dataclass
class PairMeasurements:
    src: int  # NVML indices
    dst: int
    cuda_src: int
    cuda_dst: int
    peer_access: bool | None = None  # torch.cuda.can_device_access_peer
    uni: Bandwidth | None = None
    bidir: Bandwidth | None = None
    latency: Latency | None = None
    errors: dict[str, str] = field(default_factory=dict)


@dataclass
class DriverProbe:
    """cuInit through libcuda directly, before PyTorch: its exact error code names the cause."""

    library: str | None
    code: int | None
    name: str


@dataclass
class Measurements:
    torch_version: str | None = None
    cuda_runtime: str | None = None
    cuda_device_count: int = 0
    gpus: list[GpuMeasurements] = field(default_factory=list)
    pairs: list[PairMeasurements] = field(default_factory=list)
    hung_step: str | None = None  # the measurement that did not finish within step_timeout_s
    seconds: float = 0.0


@dataclass
class Target:
    """A GPU to measure: NVML index, the CUDA ordinal of the same device, its NUMA-local CPUs."""

    nvml_index: int
    cuda_ordinal: int
    local_cpus: list[int]


def probe_cuda_driver() -> DriverProbe:
    for library in ("libcuda.so.1", "libcuda.so"):
        try:
            lib = ctypes.CDLL(library)
        except OSError:
            continue
        code = int(lib.cuInit(0))
        name = ctypes.c_char_p()
        if lib.cuGetErrorName(code, ctypes.byref(name)) == 0 and name.value:
            text = name.value.decode()
        else:
            text = CUDA_ERROR_NAMES.get(code, f"CUDA error {code}")
        return DriverProbe(library=library, code=code, name=text)
    return DriverProbe(library=None, code=None, name="libcuda.so.1 not found (no NVIDIA driver user-space here)")


def import_torch() -> Any:
    import torch  # lazily: the server image has it, the provisioning host need not

    return torch


def normalise_uuid(text: str) -> str:
    text = text.strip().lower()
    for prefix in ("gpu-", "mig-"):
        if text.startswith(prefix):
            text = text[len(prefix):]
    return text


def cuda_bus_id(props: Any) -> str | None:
    if not all(hasattr(props, name) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
        return None
    return f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"


def cuda_ordinals(torch: Any, nvml_gpus: list[tuple[int, str, str]]) -> dict[int, int]:
    """NVML index -> CUDA ordinal, matched by UUID, else by PCI bus id (the orders can differ)."""
    by_uuid = {normalise_uuid(uuid): index for index, uuid, _ in nvml_gpus}
    by_bus = {bus.lower(): index for index, _, bus in nvml_gpus}
    mapping: dict[int, int] = {}
    for ordinal in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(ordinal)
        index = by_uuid.get(normalise_uuid(str(getattr(props, "uuid", ""))))
        if index is None:
            index = by_bus.get(cuda_bus_id(props) or "")
        if index is not None:
            mapping[index] = ordinal
    return mapping


class Progress:
    """The measurement in progress, shared with the watchdog in the calling thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._step: str | None = None
        self._started = 0.0

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        with self._lock:
            self._step, self._started = name, time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                self._step = None

    def overdue(self, timeout_s: float) -> str | None:
        with self._lock:
            if self._step is not None and time.monotonic() - self._started > timeout_s:
                return self._step
        return None


class _Pinner:
    """Pins the calling (measuring) thread to a GPU's NUMA-local CPUs, within what is allowed."""

    def __init__(self) -> None:
        self.allowed = sorted(os.sched_getaffinity(0))

    def pin(self, local_cpus: list[int]) -> tuple[list[int], str]:
        if not local_cpus:
            os.sched_setaffinity(0, self.allowed)
            return self.allowed, "unpinned: NVML gave no CPU affinity for this GPU"
        usable = sorted(set(local_cpus) & set(self.allowed))
        if not usable:
            os.sched_setaffinity(0, self.allowed)
            return self.allowed, "unpinned: none of this GPU's NUMA-local CPUs may be used by this process"
        os.sched_setaffinity(0, usable)  # pid 0: this thread only
        return usable, "numa-local"

    def restore(self) -> None:
        os.sched_setaffinity(0, self.allowed)


class HostBuffer:
    """Page-locked host memory, first touched (by cudaHostRegister) on the calling thread's node.

    PyTorch's own pinned allocator caches blocks across GPUs, so a block first touched for one
    GPU's node could be handed to the next GPU: registering fresh pages avoids that. If
    registering fails, torch's pinned memory is used and ``how`` says so."""

    def __init__(self, torch: Any, elements: int) -> None:
        self.torch = torch
        self.registered = False
        self.tensor = torch.empty(elements, dtype=torch.int32)
        try:
            # flag 1 = cudaHostRegisterPortable: page-locked for every CUDA context
            result = torch.cuda.cudart().cudaHostRegister(self.tensor.data_ptr(), elements * ELEMENT_BYTES, 1)
            torch.cuda.check_error(result)
            self.registered = True
            self.how = "cudaHostRegister, first touched by the pinned thread"
        except Exception as exc:
            self.tensor = torch.empty(elements, dtype=torch.int32, pin_memory=True)
            self.how = f"torch pinned memory (cudaHostRegister failed: {exc})"

    def release(self) -> None:
        if self.registered:
            self.torch.cuda.check_error(self.torch.cuda.cudart().cudaHostUnregister(self.tensor.data_ptr()))
            self.registered = False


def _pattern(torch: Any, elements: int, seed: int, device: Any = None, out: Any = None) -> Any:
    """int32 ``i + seed``: every element differs, so a dropped, stale or shifted block shows."""
    if out is not None:
        torch.arange(elements, dtype=torch.int32, out=out)
        return out.add_(seed)
    return torch.arange(elements, dtype=torch.int32, device=device).add_(seed)


def _seed(cuda_ordinal: int) -> int:
    return (cuda_ordinal + 1) * 0x01000193  # distinct per source GPU, far from the poison value


def _mismatches(torch: Any, dst: Any, expected: Any) -> int:
    if torch.equal(dst, expected):
        return 0
    return int((dst != expected).sum().item())


class _Hold:
    """A spin kernel queued ahead of a timed loop so the copies start back to back after it."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.sleep = getattr(torch.cuda, "_sleep", None)  # private but long-standing; optional
        self.clock_khz: dict[int, int] = {}

    def __call__(self, stream: Any, seconds: float) -> None:
        if self.sleep is None:
            return
        device = stream.device.index
        if device not in self.clock_khz:
            props = self.torch.cuda.get_device_properties(device)
            self.clock_khz[device] = int(getattr(props, "clock_rate", 0) or 2_000_000)  # kHz
        cycles = int(seconds * self.clock_khz[device] * 1000)
        with self.torch.cuda.device(device), self.torch.cuda.stream(stream):
            self.sleep(cycles)


@contextmanager
def _current_streams(torch: Any, *streams: Any) -> Iterator[None]:
    """Make each stream current on its device (a cross-device copy syncs with both devices' current)."""
    previous = [torch.cuda.current_stream(stream.device) for stream in streams]
    try:
        for stream in streams:
            torch.cuda.set_stream(stream)
        yield
    finally:
        for stream in previous:
            torch.cuda.set_stream(stream)


class _Timer:
    """Times loops of copies between CUDA events, behind a hold sized from the measured queueing cost."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.hold = _Hold(torch)
        self.queue_s_per_copy = 100e-6  # first guess; replaced by the warm-up's own measurement

    def _hold_for(self, copies: int) -> float:
        return 0.3e-3 + 2.0 * copies * self.queue_s_per_copy

    def loop(self, stream: Any, enqueue: Callable[[], None], copies: int) -> float:
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.hold(stream, self._hold_for(copies))
        start.record(stream)
        queued = time.perf_counter()
        for _ in range(copies):
            enqueue()
        self.queue_s_per_copy = (time.perf_counter() - queued) / copies
        end.record(stream)
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def bidirectional(self, fwd_stream: Any, rev_stream: Any, enqueue_pair: Callable[[], None],
                      copies: int) -> tuple[float, float, float]:
        """(total, forward, reverse) seconds for ``copies`` copies each way, both ways at once."""
        torch = self.torch
        start, fwd_end, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        rev_start, rev_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.hold(fwd_stream, self._hold_for(2 * copies))
        start.record(fwd_stream)
        rev_stream.wait_event(start)  # the reverse stream is held by the same spin kernel
        rev_start.record(rev_stream)
        queued = time.perf_counter()
        for _ in range(copies):
            enqueue_pair()
        self.queue_s_per_copy = (time.perf_counter() - queued) / (2 * copies)
        fwd_end.record(fwd_stream)
        rev_end.record(rev_stream)
        fwd_stream.wait_event(rev_end)
        end.record(fwd_stream)
        end.synchronize()
        return start.elapsed_time(end) / 1e3, start.elapsed_time(fwd_end) / 1e3, rev_start.elapsed_time(rev_end) / 1e3


def _copies_per_sample(method: Method, seconds_per_copy: float) -> int:
    wanted = math.ceil(method.min_sample_s / max(seconds_per_copy, 1e-9))
    return max(1, min(method.max_copies_per_sample, wanted))


@dataclass
class _CopySpec:
    """One measurement: how to queue a copy, and how to poison and check its destination."""

    kind: str
    src: str
    dst: str
    nbytes: int
    stream: Any
    enqueue: Callable[[], None]
    poison: Callable[[], None]
    check: Callable[[], int]  # mismatched elements
    path: str | None = None


def _measure_bandwidth(timer: _Timer, method: Method, spec: _CopySpec) -> Bandwidth:
    began = time.perf_counter()
    spec.poison()
    warm = timer.loop(spec.stream, spec.enqueue, method.warmup_copies)
    copies = _copies_per_sample(method, warm / method.warmup_copies)
    samples: list[float] = []
    mismatched = spec.check()
    for _ in range(method.samples):
        spec.poison()
        seconds = timer.loop(spec.stream, spec.enqueue, copies)
        samples.append(spec.nbytes * copies / seconds / GB)
        mismatched += spec.check()
    return Bandwidth(kind=spec.kind, src=spec.src, dst=spec.dst, bytes_per_copy=spec.nbytes, copies_per_sample=copies,
                     samples_gbps=samples, median_gbps=statistics.median(samples), verified=mismatched == 0,
                     mismatched_elements=mismatched, seconds=time.perf_counter() - began, path=spec.path)


def _measure_latency(timer: _Timer, method: Method, spec: _CopySpec) -> Latency:
    began = time.perf_counter()
    timer.loop(spec.stream, spec.enqueue, method.latency_copies)  # warm-up
    samples: list[float] = []
    mismatched = 0
    for _ in range(method.latency_samples):
        spec.poison()
        seconds = timer.loop(spec.stream, spec.enqueue, method.latency_copies)
        samples.append(seconds / method.latency_copies * 1e6)
        mismatched += spec.check()
    return Latency(kind=spec.kind, src=spec.src, dst=spec.dst, bytes_per_copy=spec.nbytes,
                   copies_per_sample=method.latency_copies, samples_us=samples, median_us=statistics.median(samples),
                   verified=mismatched == 0, seconds=time.perf_counter() - began, path=spec.path)


class NodeMeasurer:
    """Runs every measurement in order on the calling thread, filling ``results`` as it goes."""

    def __init__(self, torch: Any, method: Method, progress: Progress, results: Measurements) -> None:
        self.torch = torch
        self.method = method
        self.progress = progress
        self.results = results
        self.timer = _Timer(torch)
        self.pinner = _Pinner()
        self.elements = method.size_bytes // ELEMENT_BYTES
        self.patterns: dict[int, Any] = {}  # CUDA ordinal -> device pattern with that GPU's seed
        self.scratch: dict[int, Any] = {}  # CUDA ordinal -> destination buffer

    # -- buffers -------------------------------------------------------------------------------
    def _pattern_on(self, ordinal: int) -> Any:
        if ordinal not in self.patterns:
            self.patterns[ordinal] = _pattern(self.torch, self.elements, _seed(ordinal), device=f"cuda:{ordinal}")
        return self.patterns[ordinal]

    def _scratch_on(self, ordinal: int) -> Any:
        if ordinal not in self.scratch:
            self.scratch[ordinal] = self.torch.empty(self.elements, dtype=self.torch.int32, device=f"cuda:{ordinal}")
        return self.scratch[ordinal]

    def _device_poison(self, tensor: Any) -> Callable[[], None]:
        def poison() -> None:
            tensor.fill_(POISON)
            self.torch.cuda.synchronize(tensor.device)
        return poison

    def _step(self, errors: dict[str, str], name: str, label: str, run: Callable[[], Any]) -> Any:
        with self.progress.step(label):
            try:
                return run()
            except Exception as exc:  # a failed measurement is a finding, not a crash
                errors[name] = f"{type(exc).__name__}: {exc}".strip()
                return None

    # -- one GPU -------------------------------------------------------------------------------
    def measure_gpu(self, target: Target, during_load: Callable[[int], None] | None) -> GpuMeasurements:
        torch, ordinal = self.torch, target.cuda_ordinal
        result = GpuMeasurements(nvml_index=target.nvml_index, cuda_ordinal=ordinal)
        self.results.gpus.append(result)
        result.pinned_cpus, result.pinning = self.pinner.pin(target.local_cpus)
        torch.cuda.set_device(ordinal)
        name = f"cuda:{ordinal}"
        host_src = host_dst = None
        try:
            with self.progress.step(f"{name} host buffers"):
                host_src, host_dst = HostBuffer(torch, self.elements), HostBuffer(torch, self.elements)
                _pattern(torch, self.elements, _seed(ordinal), out=host_src.tensor)
                result.host_memory = host_src.how
            self._measure_gpu_copies(result, target, host_src, host_dst, during_load)
        except Exception as exc:
            result.errors["setup"] = f"{type(exc).__name__}: {exc}"
        finally:
            for buffer in (host_src, host_dst):
                if buffer is not None:
                    buffer.release()
        return result

    def _measure_gpu_copies(self, result: GpuMeasurements, target: Target, host_src: HostBuffer,
                            host_dst: HostBuffer, during_load: Callable[[int], None] | None) -> None:
        torch, method, ordinal = self.torch, self.method, target.cuda_ordinal
        name, pattern, scratch = f"cuda:{ordinal}", self._pattern_on(ordinal), self._scratch_on(ordinal)
        stream = torch.cuda.Stream(device=ordinal)
        nbytes = self.elements * ELEMENT_BYTES

        def host_poison() -> None:
            host_dst.tensor.fill_(POISON)

        def copy_to(dst: Any, src: Any) -> Callable[[], None]:
            def enqueue() -> None:
                with torch.cuda.stream(stream):
                    dst.copy_(src, non_blocking=True)
            return enqueue

        specs = {
            "h2d": _CopySpec("h2d", "host", name, nbytes, stream, copy_to(scratch, host_src.tensor),
                             self._device_poison(scratch), lambda: _mismatches(torch, scratch, pattern)),
            "d2h": _CopySpec("d2h", name, "host", nbytes, stream, copy_to(host_dst.tensor, pattern),
                             host_poison, lambda: _mismatches(torch, host_dst.tensor, host_src.tensor)),
            "d2d": _CopySpec("d2d", name, name, nbytes, stream, copy_to(scratch, pattern),
                             self._device_poison(scratch), lambda: _mismatches(torch, scratch, pattern)),
        }
        for kind, spec in specs.items():
            setattr(result, kind, self._step(result.errors, kind, f"{name} {kind}",
                                             partial(_measure_bandwidth, self.timer, method, spec)))
        if during_load is not None and result.h2d is not None:
            result.load_seconds = self._step(result.errors, "under_load", f"{name} link under load",
                                             lambda: self._read_under_load(target, specs["h2d"], during_load))
        small = method.latency_bytes // ELEMENT_BYTES
        latency_specs = {
            "h2d_latency": _CopySpec("h2d", "host", name, small * ELEMENT_BYTES, stream,
                                     copy_to(scratch[:small], host_src.tensor[:small]),
                                     self._device_poison(scratch[:small]),
                                     lambda: _mismatches(torch, scratch[:small], pattern[:small])),
            "d2h_latency": _CopySpec("d2h", name, "host", small * ELEMENT_BYTES, stream,
                                     copy_to(host_dst.tensor[:small], pattern[:small]),
                                     lambda: host_dst.tensor[:small].fill_(POISON),
                                     lambda: _mismatches(torch, host_dst.tensor[:small], host_src.tensor[:small])),
            "d2d_latency": _CopySpec("d2d", name, name, small * ELEMENT_BYTES, stream,
                                     copy_to(scratch[:small], pattern[:small]), self._device_poison(scratch[:small]),
                                     lambda: _mismatches(torch, scratch[:small], pattern[:small])),
        }
        for kind, spec in latency_specs.items():
            setattr(result, kind, self._step(result.errors, kind, f"{name} {kind}",
                                             partial(_measure_latency, self.timer, method, spec)))

    def _read_under_load(self, target: Target, spec: _CopySpec, during_load: Callable[[int], None]) -> float:
        """Queue host-to-device copies for ``load_s`` and read NVML while they run (links idle down)."""
        began = time.perf_counter()
        seconds_per_copy = spec.nbytes / GB / max(1e-3, self._h2d_gbps(target))
        copies = max(2, math.ceil(self.method.load_s / seconds_per_copy))
        for _ in range(copies):
            spec.enqueue()
        time.sleep(min(0.05, self.method.load_s / 4))  # let the link train up to speed
        during_load(target.nvml_index)
        spec.stream.synchronize()
        return time.perf_counter() - began

    def _h2d_gbps(self, target: Target) -> float:
        gpu = next(g for g in self.results.gpus if g.nvml_index == target.nvml_index)
        return gpu.h2d.median_gbps if gpu.h2d else 10.0

    # -- pairs ---------------------------------------------------------------------------------
    def measure_pair(self, src: Target, dst: Target) -> PairMeasurements:
        torch, a, b = self.torch, src.cuda_ordinal, dst.cuda_ordinal
        result = PairMeasurements(src=src.nvml_index, dst=dst.nvml_index, cuda_src=a, cuda_dst=b)
        self.results.pairs.append(result)
        self.pinner.pin(src.local_cpus)  # the source GPU queues the copies
        label = f"cuda:{a}->cuda:{b}"
        try:
            result.peer_access = bool(torch.cuda.can_device_access_peer(a, b))
            self._measure_pair_copies(result, label)
        except Exception as exc:
            result.errors["setup"] = f"{type(exc).__name__}: {exc}"
        return result

    def _measure_pair_copies(self, result: PairMeasurements, label: str) -> None:
        torch, method = self.torch, self.method
        a, b = result.cuda_src, result.cuda_dst
        path = "p2p" if result.peer_access else "staged"
        src_a, src_b = self._pattern_on(a), self._pattern_on(b)
        dst_a, dst_b = self._scratch_on(a), self._scratch_on(b)
        # What each destination must hold afterwards: the other GPU's pattern, made on this side.
        expect_b = _pattern(torch, self.elements, _seed(a), device=f"cuda:{b}")
        expect_a = _pattern(torch, self.elements, _seed(b), device=f"cuda:{a}")
        copy_a, idle_a = torch.cuda.Stream(device=a), torch.cuda.Stream(device=a)
        copy_b, idle_b = torch.cuda.Stream(device=b), torch.cuda.Stream(device=b)
        nbytes = self.elements * ELEMENT_BYTES

        def forward() -> None:
            # torch queues a cross-device copy on the source's current stream and makes it wait for
            # the destination's current stream: an idle stream there keeps the two directions apart.
            torch.cuda.set_stream(idle_b)
            torch.cuda.set_stream(copy_a)
            dst_b.copy_(src_a)

        def reverse() -> None:
            torch.cuda.set_stream(idle_a)
            torch.cuda.set_stream(copy_b)
            dst_a.copy_(src_b)

        def both() -> None:
            forward()
            reverse()

        def check_forward() -> int:
            return _mismatches(torch, dst_b, expect_b)

        uni = _CopySpec("p2p", f"cuda:{a}", f"cuda:{b}", nbytes, copy_a, forward, self._device_poison(dst_b),
                        check_forward, path)
        with _current_streams(torch, idle_a, idle_b):
            result.uni = self._step(result.errors, "uni", f"{label} unidirectional",
                                    lambda: _measure_bandwidth(self.timer, method, uni))
            result.bidir = self._step(result.errors, "bidir", f"{label} bidirectional",
                                      lambda: self._measure_bidirectional(copy_a, copy_b, both, dst_a, dst_b,
                                                                          expect_a, expect_b, label, path))
            small = method.latency_bytes // ELEMENT_BYTES

            def forward_small() -> None:
                torch.cuda.set_stream(idle_b)
                torch.cuda.set_stream(copy_a)
                dst_b[:small].copy_(src_a[:small])

            latency = _CopySpec("p2p", f"cuda:{a}", f"cuda:{b}", small * ELEMENT_BYTES, copy_a, forward_small,
                                self._device_poison(dst_b[:small]),
                                lambda: _mismatches(torch, dst_b[:small], expect_b[:small]),
                                path)
            result.latency = self._step(result.errors, "latency", f"{label} latency",
                                        lambda: _measure_latency(self.timer, method, latency))

    def _measure_bidirectional(self, copy_a: Any, copy_b: Any, both: Callable[[], None], dst_a: Any, dst_b: Any,
                               expect_a: Any, expect_b: Any, label: str, path: str) -> Bandwidth:
        torch, method = self.torch, self.method
        began = time.perf_counter()
        nbytes = self.elements * ELEMENT_BYTES

        def poison() -> None:
            self._device_poison(dst_a)()
            self._device_poison(dst_b)()

        def check() -> int:
            return _mismatches(torch, dst_a, expect_a) + _mismatches(torch, dst_b, expect_b)

        poison()
        total, _, _ = self.timer.bidirectional(copy_a, copy_b, both, method.warmup_copies)
        copies = _copies_per_sample(method, total / method.warmup_copies)
        totals: list[float] = []
        forwards: list[float] = []
        reverses: list[float] = []
        mismatched = check()
        for _ in range(method.samples):
            poison()
            total, fwd, rev = self.timer.bidirectional(copy_a, copy_b, both, copies)
            totals.append(2 * nbytes * copies / total / GB)
            forwards.append(nbytes * copies / fwd / GB)
            reverses.append(nbytes * copies / rev / GB)
            mismatched += check()
        src, dst = label.split("->")
        return Bandwidth(kind="p2p_bidir", src=src, dst=dst, bytes_per_copy=nbytes, copies_per_sample=copies,
                         samples_gbps=totals, median_gbps=statistics.median(totals), verified=mismatched == 0,
                         mismatched_elements=mismatched, seconds=time.perf_counter() - began, path=path,
                         forward_gbps=statistics.median(forwards), reverse_gbps=statistics.median(reverses))

    def release(self) -> None:
        self.patterns.clear()
        self.scratch.clear()
        self.pinner.restore()


def measure_node(torch: Any, targets: list[Target], method: Method, progress: Progress, results: Measurements,
                 during_load: Callable[[int], None] | None = None, pairs: bool = True) -> Measurements:
    """Every GPU (host links, device-local copy) then every ordered pair. Fills ``results`` in place
    so that a watchdog can report what was done if a copy hangs."""
    began = time.perf_counter()
    measurer = NodeMeasurer(torch, method, progress, results)
    try:
        for target in targets:
            measurer.measure_gpu(target, during_load)
        if pairs:
            for src in targets:
                for dst in targets:
                    if src.nvml_index != dst.nvml_index:
                        measurer.measure_pair(src, dst)
    finally:
        measurer.release()
        results.seconds = time.perf_counter() - began
    return results
