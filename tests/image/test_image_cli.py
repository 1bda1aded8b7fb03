"""`gpunode image build|verify` through the CLI, on the image the tests build."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpunode.stages.image import BuildResult

pytestmark = pytest.mark.image
ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "inventory" / "lab" / "host.yml"


def test_build_is_a_no_op_when_the_tag_exists(gpunode, built: BuildResult) -> None:
    result = gpunode("image", "build", str(LAB), "--local", timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{built.tag} (present, not rebuilt)"


def test_verify_names_exactly_the_toolchain_gaps(gpunode, built: BuildResult) -> None:
    # The lab's debootstrap image has no nvcc: no SM120 kernels in FlashInfer, none built ahead of
    # time, and nothing to compile them with. Every other finding passes.
    result = gpunode("image", "verify", built.tag, "--hosts", str(LAB), "--json", timeout=600)
    assert result.returncode == 1
    failed = {f["name"] for f in json.loads(result.stdout)["findings"] if not f["ok"]}
    assert failed == {"nvcc", "nvcc compiles for 12.0a", "flashinfer aot", "kernels flashinfer"}
