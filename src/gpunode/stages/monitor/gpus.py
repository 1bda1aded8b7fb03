"""The node's GPUs as Prometheus metrics, read from NVML at each scrape (issue 37).

A ``prometheus_client`` collector (the official library's custom-collector interface, not a
hand-written exposition): every scrape asks NVML for each GPU's temperature, power and limit, SM
clock and its maximum, memory, utilisation, clock-event ("throttle") reasons, PCIe link generation
and width against their maxima, ECC and row-remapping health; a thread waits on NVML's critical-Xid
events and counts them. What a GPU's driver refuses (``Not Supported``: ECC on a board without it,
row remapping before Ampere) is exported as ``gpunode_gpu_reading_unsupported`` once, never as a
made-up number. A GPU NVML can no longer reach (fallen off the bus: ``GPU is lost``) is counted out
of ``gpunode_gpus_visible``, which the alert rules hold against ``gpunode_gpus_expected``, the
host file's count.

Run on the node by the monitor role (``python -m gpunode.stages.monitor.gpus --listen ADDR:PORT
--expected N``); imports only the standard library, prometheus_client, pynvml and the clock-event
reason names of ``gpunode.stages.p2p.topology`` (standard library only).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gpunode.stages.p2p.topology import CLOCK_EVENT_REASONS, Reader, clock_event_reasons, nvml_text

PREFIX = "gpunode_gpu"
XID_WAIT_MS = 1000  # one NVML event wait; the thread checks for a stop between waits
DEFAULT_PORT = 9835


@dataclass
class XidCounts:
    """Critical Xid events per GPU index since the exporter started, and each GPU's last Xid. Every
    watched GPU's count starts at 0, so that Prometheus' increase() sees the first event."""

    counts: dict[int, int] = field(default_factory=dict)
    last: dict[int, int] = field(default_factory=dict)
    supported: dict[int, str] = field(default_factory=dict)  # GPU index -> "" or NVML's refusal
    lock: threading.Lock = field(default_factory=threading.Lock)

    def watch(self, gpu: int) -> None:
        with self.lock:
            self.counts.setdefault(gpu, 0)
            self.supported[gpu] = ""

    def add(self, gpu: int, xid: int) -> None:
        with self.lock:
            self.counts[gpu] = self.counts.get(gpu, 0) + 1
            self.last[gpu] = xid

    def snapshot(self) -> tuple[dict[int, int], dict[int, int]]:
        with self.lock:
            return dict(self.counts), dict(self.last)


class GpuCollector:
    """Reads every GPU at each ``collect()`` (prometheus_client calls it once per scrape)."""

    def __init__(self, nvml: Any, expected: int | None = None) -> None:
        self.nvml = nvml
        self.expected = expected
        self.started = False
        self.start_error = ""
        self.xids = XidCounts()
        self._stop = threading.Event()
        self._xid_thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- NVML's lifetime ------------------------------------------------------------------------
    def start(self) -> bool:
        """NVML initialised (again after a failure: a scrape retries); False with the reason kept."""
        with self._lock:
            if self.started:
                return True
            try:
                self.nvml.nvmlInit()
            except self.nvml.NVMLError as exc:
                self.start_error = str(exc)
                return False
            self.started, self.start_error = True, ""
        self._start_xid_thread()
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._xid_thread is not None:
            self._xid_thread.join(XID_WAIT_MS / 1000 * 3)
        with self._lock:
            if self.started:
                with contextlib.suppress(self.nvml.NVMLError):
                    self.nvml.nvmlShutdown()
            self.started = False

    def _start_xid_thread(self) -> None:
        if self._xid_thread is not None:
            return
        nvml = self.nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
            count = int(nvml.nvmlDeviceGetCount())
        except (nvml.NVMLError, AttributeError) as exc:
            self.xids.supported[-1] = str(exc)
            return
        watched: dict[Any, int] = {}
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
                self.xids.watch(index)
                watched[nvml_text(nvml.nvmlDeviceGetUUID(handle))] = index
            except nvml.NVMLError as exc:
                self.xids.supported[index] = str(exc)
        if not watched:
            return
        self._xid_thread = threading.Thread(target=self._wait_xids, args=(event_set, watched), daemon=True,
                                            name="nvml-xid-events")
        self._xid_thread.start()

    def _wait_xids(self, event_set: Any, watched: dict[str, int]) -> None:
        nvml = self.nvml
        timeout = getattr(nvml, "NVML_ERROR_TIMEOUT", 10)
        while not self._stop.is_set():
            try:
                data = nvml.nvmlEventSetWait_v2(event_set, XID_WAIT_MS)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) == timeout:
                    continue
                time.sleep(XID_WAIT_MS / 1000)  # a lost GPU answers at once; do not spin
                continue
            try:
                gpu = watched.get(nvml_text(nvml.nvmlDeviceGetUUID(data.device)), -1)
            except nvml.NVMLError:
                gpu = -1
            self.xids.add(gpu, int(data.eventData))
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlEventSetFree(event_set)

    # -- one scrape -----------------------------------------------------------------------------
    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        nvml = self.nvml
        up = GaugeMetricFamily("gpunode_nvml_up", "1 when NVML answered this scrape (0: no driver, or it failed)",
                               labels=["error"])
        expected = GaugeMetricFamily("gpunode_gpus_expected", "GPUs the host file gives this node")
        visible = GaugeMetricFamily("gpunode_gpus_visible", "GPUs NVML reached this scrape (a lost GPU is left out)")
        if self.expected is not None:
            expected.add_metric([], self.expected)
        if not self.start():
            up.add_metric([self.start_error[:200]], 0)
            visible.add_metric([], 0)
            yield from (up, expected, visible)
            return
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            up.add_metric([str(exc)[:200]], 0)
            visible.add_metric([], 0)
            yield from (up, expected, visible)
            return
        up.add_metric([""], 1)
        labels = ["gpu", "uuid"]
        info = GaugeMetricFamily(f"{PREFIX}_info", "A GPU NVML reaches, with its name and PCI bus id",
                                 labels=[*labels, "name", "pci_bus_id"])
        gauges = {key: GaugeMetricFamily(f"{PREFIX}_{key}", text, labels=labels) for key, text in (
            ("temperature_celsius", "GPU core temperature"),
            ("power_watts", "Board power draw (NVML's one-second average)"),
            ("power_limit_watts", "The enforced power limit"),
            ("sm_clock_hertz", "SM clock"),
            ("sm_clock_max_hertz", "The SM clock's maximum"),
            ("memory_used_bytes", "Device memory in use"),
            ("memory_total_bytes", "Device memory"),
            ("utilization_ratio", "Share of the last sample period a kernel ran"),
            ("pcie_link_generation", "The PCIe link's current generation (it drops at idle)"),
            ("pcie_link_generation_max", "The highest generation the GPU and its slot reach together"),
            ("pcie_link_width", "The PCIe link's current lanes"),
            ("pcie_link_width_max", "The most lanes the GPU and its slot reach together"),
            ("remapped_rows_pending", "1: a row remap waits for the GPU's reset"),
            ("remapped_rows_failed", "1: a row remap failed (the GPU needs service)"))}
        ecc = CounterMetricFamily(f"{PREFIX}_ecc_uncorrected_errors", "Uncorrected ECC errors since the driver loaded",
                                  labels=labels)
        reasons = GaugeMetricFamily(f"{PREFIX}_clock_event_active",
                                    "1 while the clock-event (throttle) reason holds the clocks down",
                                    labels=[*labels, "reason"])
        refused = GaugeMetricFamily(f"{PREFIX}_reading_unsupported", "1: NVML refused this reading on this GPU",
                                    labels=[*labels, "reading", "error"])
        xid = CounterMetricFamily(f"{PREFIX}_xid_errors", "Critical Xid events NVML delivered since the exporter started",
                                  labels=["gpu"])
        xid_last = GaugeMetricFamily(f"{PREFIX}_xid_last", "1, labelled with the last critical Xid NVML delivered",
                                     labels=["gpu", "xid"])
        reached = 0
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = nvml_text(nvml.nvmlDeviceGetUUID(handle))
            except nvml.NVMLError:
                continue  # lost, or not reachable: out of gpunode_gpus_visible
            reached += 1
            gpu = [str(index), uuid]
            # Name and bus id label the GPU; a refusal of either shows as "?" or "" there.
            ident = Reader(nvml, {})
            name, pci = ident("name", nvml.nvmlDeviceGetName, handle), ident("pci", nvml.nvmlDeviceGetPciInfo, handle)
            info.add_metric([*gpu, nvml_text(name or "?"), nvml_text(pci.busId) if pci else ""], 1)
            unavailable: dict[str, str] = {}
            for key, value, scale in self._readings(handle, Reader(nvml, unavailable)):
                if value is None:
                    continue  # named below, with NVML's message
                if key == "ecc_uncorrected_errors":
                    ecc.add_metric(gpu, float(value))
                elif key == "clock_event_reasons":
                    for bit, reason in CLOCK_EVENT_REASONS.items():
                        reasons.add_metric([*gpu, reason], 1 if int(value) & bit else 0)
                elif key == "remapped_rows":
                    _, _, pending, failed = value
                    gauges["remapped_rows_pending"].add_metric(gpu, 1 if pending else 0)
                    gauges["remapped_rows_failed"].add_metric(gpu, 1 if failed else 0)
                elif key == "memory":
                    gauges["memory_used_bytes"].add_metric(gpu, float(value.used))
                    gauges["memory_total_bytes"].add_metric(gpu, float(value.total))
                elif key == "utilization":
                    gauges["utilization_ratio"].add_metric(gpu, float(value.gpu) / 100)
                else:
                    gauges[key].add_metric(gpu, float(value) * scale)
            for key, message in unavailable.items():
                refused.add_metric([*gpu, key, message[:200]], 1)
        visible.add_metric([], reached)
        counts, last = self.xids.snapshot()
        for index, events in sorted(counts.items()):
            xid.add_metric([str(index)], events)
        for index, code in sorted(last.items()):
            xid_last.add_metric([str(index), str(code)], 1)
        for index, error in sorted(self.xids.supported.items()):
            if error:
                refused.add_metric([str(index), "", "xid_events", error[:200]], 1)
        yield from (up, expected, visible, info, *gauges.values(), ecc, reasons, xid, xid_last, refused)

    def _readings(self, handle: Any, read: Reader) -> Iterator[tuple[str, Any, float]]:
        """(metric key, NVML's answer or None when refused, factor to the metric's unit), each
        reading through ``read``, which keeps a refusal's message under the key."""
        nvml = self.nvml
        yield ("temperature_celsius",
               read("temperature_celsius", nvml.nvmlDeviceGetTemperature, handle,
                    getattr(nvml, "NVML_TEMPERATURE_GPU", 0)), 1.0)
        for key, fn, scale in (("power_watts", nvml.nvmlDeviceGetPowerUsage, 1e-3),
                               ("power_limit_watts", nvml.nvmlDeviceGetEnforcedPowerLimit, 1e-3)):
            yield key, read(key, fn, handle), scale
        for key, fn in (("sm_clock_hertz", nvml.nvmlDeviceGetClockInfo),
                        ("sm_clock_max_hertz", nvml.nvmlDeviceGetMaxClockInfo)):
            yield key, read(key, fn, handle, nvml.NVML_CLOCK_SM), 1e6
        for key, fn in (("pcie_link_generation", nvml.nvmlDeviceGetCurrPcieLinkGeneration),
                        ("pcie_link_generation_max", nvml.nvmlDeviceGetMaxPcieLinkGeneration),
                        ("pcie_link_width", nvml.nvmlDeviceGetCurrPcieLinkWidth),
                        ("pcie_link_width_max", nvml.nvmlDeviceGetMaxPcieLinkWidth)):
            yield key, read(key, fn, handle), 1.0
        # The one place that knows 'ClocksEvent' replaced 'ClocksThrottle' (p2p.topology).
        yield "clock_event_reasons", clock_event_reasons(nvml, handle, read), 1.0
        yield ("ecc_uncorrected_errors",
               read("ecc_uncorrected_errors", nvml.nvmlDeviceGetTotalEccErrors, handle,
                    nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC), 1.0)
        yield "remapped_rows", read("remapped_rows", nvml.nvmlDeviceGetRemappedRows, handle), 1.0
        yield "memory", read("memory", nvml.nvmlDeviceGetMemoryInfo, handle), 1.0
        yield "utilization", read("utilization", nvml.nvmlDeviceGetUtilizationRates, handle), 1.0


def exposition(collector: GpuCollector) -> bytes:
    """One scrape's text, as Prometheus reads it."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        return generate_latest(registry)
    finally:
        registry.unregister(collector)


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"--listen wants ADDRESS:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpunode-gpu-exporter", description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", type=_listen, default=("127.0.0.1", DEFAULT_PORT), metavar="ADDRESS:PORT")
    parser.add_argument("--expected", type=int, default=None, help="GPUs the host file gives this node")
    parser.add_argument("--once", action="store_true", help="print one scrape and exit")
    parser.add_argument("--nvml-module", default="pynvml", metavar="MODULE",
                        help="the NVML binding to read through: nvidia-ml-py's pynvml (a lab's stand-in image "
                             "names its replay of a recorded GPU)")
    args = parser.parse_args(argv)
    import importlib

    from prometheus_client import CollectorRegistry, start_http_server

    collector = GpuCollector(importlib.import_module(args.nvml_module), expected=args.expected)
    if args.once:
        sys.stdout.write(exposition(collector).decode())
        collector.stop()
        return 0
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    address, port = args.listen
    server, thread = start_http_server(port, addr=address, registry=registry)
    done = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: done.set())
    done.wait()
    server.shutdown()
    thread.join(5)
    collector.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
