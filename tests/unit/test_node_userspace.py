"""User space vs host module, and the CUDA probe, from readings recorded on a real H200."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from gpunode.stages.node import userspace
from gpunode.probe import cuda_probe
from gpunode_lab.contract import HOST_FACTS_TARBALL  # the recording the lab ships

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "host" / "h200"


def recorded_banner() -> str:
    with tarfile.open(HOST_FACTS_TARBALL) as tar:
        member = tar.extractfile("sysroot/proc/driver/nvidia/version")
        assert member is not None
        return member.read().decode()


def test_module_version_from_the_recorded_banner() -> None:
    banner = recorded_banner()
    assert "Open Kernel Module" in banner
    assert userspace.module_version(banner) == "580.159.04"
    assert userspace.module_version("") == ""


@pytest.mark.parametrize("libs,needed", [
    ([], True),                                                      # nothing installed
    (["libnvidia-ml.so.580.159.04"], False),                          # matches the module
    (["libnvidia-ml.so.580.95.05"], True),                            # an older driver's user space
    (["libnvidia-ml.so.580.159.04", "libnvidia-ml.so.570.86.15"], True),  # two versions mixed
    (["libnvidia-ml.so.1", "libnvidia-ml.so.580.159.04"], False),      # the soname link is ignored
])
def test_needs_install(libs: list[str], needed: bool) -> None:
    module = userspace.module_version(recorded_banner())
    assert userspace.needs_install(module, userspace.installed_versions(libs)) is needed


def test_no_module_means_nothing_to_match() -> None:
    assert userspace.needs_install("", []) is False


def test_recorded_cuda_probe_on_the_h200() -> None:
    result = json.loads((RECORDED / "cuda_probe.json").read_text())
    assert result["ok"] and result["cuinit"] == 0 and result["driver_version"] == 13000
    assert result["devices"][0]["name"] == "NVIDIA H200" and result["devices"][0]["uuid"].startswith("GPU-")


def test_probe_names_the_hmm_fix_for_error_3() -> None:
    hint = cuda_probe.HINTS[3]
    assert "uvm_disable_hmm=1" in hint and "HOST" in hint


def test_probe_without_libcuda_says_what_is_missing(capsys: pytest.CaptureFixture[str]) -> None:
    import ctypes.util

    if ctypes.util.find_library("cuda"):
        pytest.skip("this machine has an NVIDIA driver: the no-driver path cannot be seen here")
    assert cuda_probe.main() == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and "libcuda.so.1 not loadable" in out["error"] and out["hint"]
