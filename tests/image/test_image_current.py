"""The current stack's image (sglang 0.5.23 on CUDA 13.0), built here from PyPI and Debian alone and
verified to the last step: pins, torch's CUDA, nvcc compiling for the target, SM120 SASS in
sglang-kernel's common ops, FlashInfer's modules built ahead of time and found with JIT disabled,
DeepGEMM's SM120 indexer, each JIT user finding nvcc, and the profile's flags in 0.5.23's parser."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import docker
import pytest

from gpunode import derive

from gpunode.catalogue import profiles, stacks
from gpunode.hostfile import Host
from gpunode.stages.image import BuildResult, VerifyReport, verify
from gpunode.catalogue.aot import modules_json, profile_modules
from gpunode.derive.imagecontext import LABEL_PREFIX
from gpunode_lab.contract import STANDIN

pytestmark = pytest.mark.image

FAKES = STANDIN  # the stand-in server the lab ships


@pytest.fixture(scope="module")
def report(current_built: BuildResult, current_host: Host) -> VerifyReport:
    return verify(current_built.tag, list(derive.server_launch(current_host).argv), None,
                  aot=derive.aot_plan(current_host), kernels=True)


def test_verify_passes_on_the_current_stack(report: VerifyReport) -> None:
    print(report.to_json())
    assert report.ok, report.failed()
    names = {f.code for f in report.findings}
    # Every part the stack names was checked, not skipped.
    assert {"pin sglang", "pin sgl-deep-gemm", "torch CUDA", "nvcc", "ptxas", "nvcc compiles for 12.0f",
            "kernels sgl_kernel", "server flags", "GLM-5 support", "symbols deep_gemm/_C.so",
            "entry point deep_gemm:fp8_paged_mqa_logits"} <= names


def test_each_jit_user_finds_the_images_nvcc(report: VerifyReport) -> None:
    found = {f.code: f for f in report.findings}
    for library in ("flashinfer", "deep_gemm", "sglang"):
        finding = found[f"nvcc found by {library}"]
        assert finding.ok and "/usr/local/cuda-13.0/bin/nvcc: CUDA 13.0." in finding.message, finding


def test_the_prebuilt_modules_hold_sm120_code_and_load_without_jit(report: VerifyReport,
                                                                    current_built: BuildResult) -> None:
    found = {f.code: f for f in report.findings}
    for name in ("sparse_mla_sm120", "fp4_quantization_120f"):
        finding = found[f"flashinfer aot {name}"]
        assert finding.ok and "SASS sm_120" in finding.message and "/flashinfer/data/aot/" in finding.message
    assert "sm_120a arch-specific" in found["kernels sgl_kernel"].message
    assert found["torch CUDA"].message.startswith("torch 2.14.1") and "CUDA 13.0" in found["torch CUDA"].message


def test_the_stacks_module_names_are_flashinfers_own(current_built: BuildResult, engine: docker.DockerClient) -> None:
    """Every module of the current profile, with FlashInfer 0.7.2's generators in the image."""
    stack = stacks.load("sglang-0.5.23-cu130")
    modules = profile_modules(stack, profiles.load(stack.profile), {})
    script = ("import json, runpy, sys; spec_of = runpy.run_path('/opt/gpunode/flashinfer_aot.py')['spec_of']; "
              "print(json.dumps([spec_of(e).name for e in json.loads(sys.argv[1])]))")
    out = engine.containers.run(current_built.tag, ["python3", "-c", script, modules_json(modules)], remove=True,
                                network_disabled=True, stderr=False, environment={"FLASHINFER_CUDA_ARCH_LIST": "12.0f"})
    assert json.loads(out.decode().strip().splitlines()[-1]) == [m.name for m in modules]


def test_the_image_records_its_stack(current_built: BuildResult, engine: docker.DockerClient) -> None:
    labels = engine.images.get(current_built.tag).labels
    assert labels[f"{LABEL_PREFIX}.stack"] == "sglang-0.5.23-cu130"
    assert labels[f"{LABEL_PREFIX}.pin.deep_gemm"] == "0.2.3.post2"
    assert labels[f"{LABEL_PREFIX}.toolchain"] == "stack-cuda-13.0" and labels[f"{LABEL_PREFIX}.aot.arch"] == "12.0f"


def test_the_seeds_flags_are_rejected_by_0_5_23(current_built: BuildResult, engine: docker.DockerClient) -> None:
    """The seeds' profile does not start on the current stack: its --nsa-* flags are gone."""
    seeds = profiles.load("glm5-nvfp4-sm120")
    container = engine.containers.create(current_built.tag, ["python3", "-m", "sglang.launch_server", "--model-path",
                                         "/m", "--nsa-decode-backend", str(seeds.flag_value("--nsa-decode-backend"))],
                                         network_disabled=True)
    try:
        container.start()
        status = container.wait(timeout=300)["StatusCode"]
        last = container.logs(stdout=False, stderr=True).decode().strip().splitlines()[-1]
    finally:
        container.remove(force=True)
    assert (status, last) == (2, "sglang serve: error: unrecognized arguments: --nsa-decode-backend trtllm")
    # The stand-in, taking 0.5.23's flags, fails the same way.
    fake = subprocess.run([sys.executable, str(FAKES / "sglang_server.py"), "--model-path", "/m",
                           "--nsa-decode-backend", "trtllm"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "FAKE_SGLANG_VERSION": "0.5.23"})
    assert (fake.returncode, fake.stderr.strip().splitlines()[-1]) == (status, last)
