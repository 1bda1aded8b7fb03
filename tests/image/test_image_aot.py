"""FlashInfer's kernels ahead of time, for real: the lab's stand-in toolchain variant of the image.

The stack's toolchain is CUDA 12.8's nvcc from NVIDIA's devel base, which this machine cannot pull.
The lab variant layers PyPI's CUDA 13.0 toolchain (image.toolchain: pypi-cuda-13.0) on the
debootstrap image and compiles one module of the profile's list for 12.0a (RTX PRO 6000) at build
time: the same Dockerfile steps, in-image builder and verify as a real site's build. The module is
the cheapest of the list (batch MLA, 3 sources, ~15 s here); the others build the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import docker
import pytest
from rich.console import Console

from gpunode import derive

from gpunode.catalogue import profiles, stacks
from gpunode.hostfile import Host, load
from gpunode.stages.image import BuildResult, VerifyReport, build, verify
from gpunode.catalogue.aot import AotPlan, modules_json, profile_modules
from gpunode.derive.imagecontext import AOT_BUILDER, AOT_SCRIPT, LABEL_PREFIX, images_dir

pytestmark = pytest.mark.image

ROOT = Path(__file__).resolve().parents[2]
QUIET = Console(stderr=True, force_terminal=False, width=160)
MLA = "batch_mla_attention_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_head_dim_ckv_512_head_dim_kpe_64_profiler_False"


@pytest.fixture(scope="module")
def aot_host(tmp_path_factory: pytest.TempPathFactory, make_lab_host: Callable[..., Host]) -> Host:
    return make_lab_host(tmp_path_factory.mktemp("aot"), toolchain="pypi-cuda-13.0", flashinfer_aot=[MLA])


@pytest.fixture(scope="module")
def aot_plan(aot_host: Host) -> AotPlan:
    return derive.aot_plan(aot_host)


@pytest.fixture(scope="module")
def aot_built(built: BuildResult, aot_host: Host, aot_plan: AotPlan) -> BuildResult:
    """The variant, on top of the cached server image's layers (minutes cold; kept as cache)."""
    return build(aot_host.image, None, QUIET, aot=aot_plan)


@pytest.fixture(scope="module")
def aot_report(aot_built: BuildResult, aot_host: Host, aot_plan: AotPlan) -> VerifyReport:
    # The library scan (torch's 1 GB) is the main image's test; here the toolchain and the module.
    return verify(aot_built.tag, list(derive.server_launch(aot_host).argv), None, aot=aot_plan, kernels=False)


def test_the_variant_plans_one_module_of_the_profile_for_12_0a(aot_plan: AotPlan) -> None:
    assert aot_plan.arch.cuda_arch == "12.0a"
    assert [m.name for m in aot_plan.modules] == [MLA]
    assert len(aot_plan.wanted) == 4 and aot_plan.note == "1 of the profile's 4 (image.flashinfer_aot)"


def test_verify_passes_on_the_variant(aot_report: VerifyReport) -> None:
    print(aot_report.to_json())
    assert aot_report.ok, [f for f in aot_report.failed()]


def test_the_toolchain_is_cuda_13_and_compiles_for_sm_120a(aot_report: VerifyReport) -> None:
    found = {f.code: f for f in aot_report.findings}
    assert found["nvcc"].message.startswith("/usr/local/cuda/bin/nvcc: CUDA 13.0.")
    assert found["nvcc compiles for 12.0a"].ok and "target sm_120" in found["nvcc compiles for 12.0a"].message


def test_the_module_is_found_by_flashinfers_lookup_with_sm120_sass(aot_report: VerifyReport) -> None:
    module = next(f for f in aot_report.findings if f.code == f"flashinfer aot {MLA}")
    assert module.ok
    assert f"/flashinfer/data/aot/{MLA}/{MLA}.so" in module.message
    assert "SASS sm_120" in module.message


def test_the_labels_record_what_verify_checks(aot_built: BuildResult, engine: docker.DockerClient,
                                              aot_plan: AotPlan) -> None:
    labels = engine.images.get(aot_built.tag).labels
    assert labels[f"{LABEL_PREFIX}.toolchain"] == "pypi-cuda-13.0"
    assert labels[f"{LABEL_PREFIX}.aot.arch"] == "12.0a"
    assert json.loads(labels[f"{LABEL_PREFIX}.aot.modules"]) == json.loads(modules_json(list(aot_plan.modules)))
    assert labels[f"{LABEL_PREFIX}.base"].startswith("gpunode/base:bookworm-minbase-")


def test_verify_by_tag_alone_reads_the_modules_from_the_labels(aot_built: BuildResult, aot_host: Host) -> None:
    report = verify(aot_built.tag, list(derive.server_launch(aot_host).argv), None, kernels=False)
    assert [f.code for f in report.findings if f.code.startswith("flashinfer aot")] == [f"flashinfer aot {MLA}"]
    assert report.ok


def test_a_module_missing_from_the_aot_directory_fails_verify(aot_built: BuildResult, tmp_path: Path,
                                                              make_lab_host: Callable[..., Host]) -> None:
    """Asked for a module it was not built with, verify says it is not in FlashInfer's AOT directory
    (a launch with JIT disabled would fail there)."""
    other = make_lab_host(tmp_path, toolchain="pypi-cuda-13.0", flashinfer_aot=["fp4_quantization_120"])
    report = verify(aot_built.tag, list(derive.server_launch(other).argv), None, aot=derive.aot_plan(other), kernels=False)
    missing = next(f for f in report.findings if f.code == "flashinfer aot fp4_quantization_120")
    assert not missing.ok and "not in FlashInfer's AOT directory" in missing.message


@pytest.mark.parametrize("flags", [{}, {"--fp4-gemm-backend": "flashinfer_cutlass"}, {"--tp-size": 1}],
                         ids=["profile", "fp4-cutlass", "tp1"])
def test_module_names_are_flashinfers_own(built: BuildResult, engine: docker.DockerClient, flags: dict) -> None:
    """gpunode computes FlashInfer's module names without FlashInfer; FlashInfer 0.6.3's generators,
    in the built image, must name every module of the list the same."""
    profile = profiles.load("glm5-nvfp4-sm120")
    modules = profile_modules(stacks.load(profile.stack), profile, flags)
    # The spec comes through the image build's own builder (mounted: the plain image has none).
    script = (f"import json, runpy, sys; spec_of = runpy.run_path({AOT_BUILDER!r})['spec_of']; "
              "print(json.dumps([spec_of(e).name for e in json.loads(sys.argv[1])]))")
    output = engine.containers.run(built.tag, ["python3", "-c", script, modules_json(modules)], remove=True,
                                   network_disabled=True, environment={"FLASHINFER_CUDA_ARCH_LIST": "12.0a",
                                                                       "FLASHINFER_WORKSPACE_BASE": "/tmp/fi"},
                                   volumes={str(images_dir() / AOT_SCRIPT): {"bind": AOT_BUILDER, "mode": "ro"}})
    assert json.loads(output.decode().strip().splitlines()[-1]) == [m.name for m in modules]
