"""The node's GPU exporter (gpunode.stages.monitor.gpus), driven by what NVML answered on a real GPU
(gpunode_lab's recorded/h200/nvml: an H200 on the device machine, driver 580.159.04, recorded with
tests/fixtures/monitor/record.py; the lab's stand-in image answers from the same recording). The replayed scrape must be, byte for byte, the one the real run
printed; then the answers a real fleet also gives: refusals, a lost GPU, no driver, a Xid event."""

from __future__ import annotations

import json
import time

import pynvml
import pytest

from gpunode.ground.metrics import samples
from gpunode.stages.monitor import gpus

from gpunode_lab.contract import NVML_RECORDING as RECORDED
from gpunode_lab.standin.nvml_replay import ReplayNvml

CALLS = RECORDED / "nvml_calls.json"


def scrape(nvml: ReplayNvml, expected: int | None = 1) -> tuple[gpus.GpuCollector, str]:
    collector = gpus.GpuCollector(nvml, expected=expected)
    return collector, gpus.exposition(collector).decode()


def value(text: str, name: str, **labels: str) -> float | None:
    found = [v for got, v in samples(text, name) if all(got.get(k) == want for k, want in labels.items())]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


def test_a_replayed_scrape_is_the_real_runs_scrape_byte_for_byte() -> None:
    collector, text = scrape(ReplayNvml(CALLS))
    try:
        assert text == (RECORDED / "scrape.txt").read_text()
    finally:
        collector.stop()
    assert value(text, "gpunode_gpus_visible") == value(text, "gpunode_gpus_expected") == 1
    assert value(text, "gpunode_gpu_pcie_link_generation_max", gpu="0") == 5  # the H200's Gen5 x16
    assert value(text, "gpunode_gpu_clock_event_active", gpu="0", reason="gpu_idle") == 1
    assert value(text, "gpunode_gpu_xid_errors_total", gpu="0") == 0  # watched, none yet: increase() sees the first


def test_a_reading_nvml_refuses_is_named_never_made_up() -> None:
    nvml = ReplayNvml(CALLS, refuse={("nvmlDeviceGetTotalEccErrors", 0): pynvml.NVML_ERROR_NOT_SUPPORTED,
                                     ("nvmlDeviceGetRemappedRows", 0): pynvml.NVML_ERROR_NOT_SUPPORTED})
    collector, text = scrape(nvml)
    collector.stop()
    assert value(text, "gpunode_gpu_ecc_uncorrected_errors_total", gpu="0") is None
    assert value(text, "gpunode_gpu_remapped_rows_pending", gpu="0") is None
    assert value(text, "gpunode_gpu_reading_unsupported", gpu="0", reading="ecc_uncorrected_errors",
                 error="Not Supported") == 1
    assert value(text, "gpunode_gpu_reading_unsupported", gpu="0", reading="remapped_rows") == 1
    recorded = next(c["result"] for c in json.loads(CALLS.read_text()) if c["fn"] == "nvmlDeviceGetTemperature")
    assert value(text, "gpunode_gpu_temperature_celsius", gpu="0") == recorded  # the rest still read


def test_a_lost_gpu_is_counted_out_of_the_visible_ones() -> None:
    collector, text = scrape(ReplayNvml(CALLS, gpus=8, lost={3}), expected=8)
    collector.stop()
    assert value(text, "gpunode_gpus_visible") == 7 and value(text, "gpunode_gpus_expected") == 8
    assert value(text, "gpunode_gpu_info", gpu="3") is None and value(text, "gpunode_gpu_info", gpu="7") == 1
    # The lost GPU could not be watched for Xid events either, and that is said.
    assert value(text, "gpunode_gpu_reading_unsupported", gpu="3", reading="xid_events", error="GPU is lost") == 1


def test_no_driver_reads_as_nvml_down_and_a_later_scrape_retries() -> None:
    nvml = ReplayNvml(CALLS, init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    collector, text = scrape(nvml, expected=8)
    assert value(text, "gpunode_nvml_up", error="Driver Not Loaded") == 0
    assert value(text, "gpunode_gpus_visible") == 0 and value(text, "gpunode_gpus_expected") == 8
    nvml.init_error = None  # the driver came back (a reboot, a module load)
    again = gpus.exposition(collector).decode()
    collector.stop()
    assert value(again, "gpunode_nvml_up", error="") == 1 and value(again, "gpunode_gpus_visible") == 1


def test_a_critical_xid_is_counted_with_its_code() -> None:
    nvml = ReplayNvml(CALLS)
    collector, text = scrape(nvml)
    try:
        nvml.deliver(0, 79)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and value(text, "gpunode_gpu_xid_errors_total", gpu="0") != 1:
            time.sleep(0.02)
            text = gpus.exposition(collector).decode()
    finally:
        collector.stop()
    assert value(text, "gpunode_gpu_xid_errors_total", gpu="0") == 1
    assert value(text, "gpunode_gpu_xid_last", gpu="0", xid="79") == 1


def test_the_listen_address_is_checked_before_anything_runs(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("9835", "host:", "host:99999", "[::1]:x"):
        with pytest.raises(SystemExit) as refused:
            gpus.main(["--listen", bad, "--once"])
        assert refused.value.code == 2
        assert f"--listen wants ADDRESS:PORT, got {bad!r}" in capsys.readouterr().err
    assert gpus._listen("[::1]:9835") == ("::1", 9835) and gpus._listen(":9835") == ("127.0.0.1", 9835)
