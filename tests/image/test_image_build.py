"""The real server image: built with the local Docker engine, verified inside without a GPU.

The first run builds it (minutes, ~12 GB); the tag then exists and later runs skip the build. The
failure cases are cheap: a broken patch stops at its own step on top of cached layers, a wrong
pin and a bad flag are judged by a probe that skips the kernel scan.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import docker
import pytest
from rich.console import Console

from gpunode.hostfile import Image, ImagePins, load
from gpunode.stages.image import BuildError, BuildResult, Finding, VerifyReport, build, image_tag, verify
from gpunode.derive.imagecontext import LABEL_PREFIX, images_dir
from gpunode.stages.image.verify import TARGET_ARCH
from gpunode.derive import server_launch

pytestmark = pytest.mark.image

ROOT = Path(__file__).resolve().parents[2]
QUIET = Console(stderr=True, force_terminal=False, width=160)


def profile_argv() -> list[str]:
    """The launch the example host file asks for, as the serve stage will run it."""
    return list(server_launch(load(ROOT / "inventory" / "example" / "host.yml").hosts[0]).argv)


def with_flag(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` with ``flag``'s one argument (``--flag=value``) given ``value`` instead."""
    out = list(argv)
    out[[arg.partition("=")[0] for arg in out].index(flag)] = f"{flag}={value}"
    return out


@pytest.fixture(scope="module")
def report(built: BuildResult) -> VerifyReport:
    return verify(built.tag, profile_argv(), None)


def finding(report: VerifyReport, name: str) -> Finding:
    return next(f for f in report.findings if f.code == name)


def test_the_image_is_built_under_its_content_tag(built: BuildResult, engine: docker.DockerClient,
                                                  image_spec: Image) -> None:
    image = engine.images.get(built.tag)
    assert built.tag == image_tag(image_spec)
    assert image.labels[f"{LABEL_PREFIX}.pin.sglang"] == "0.5.9"
    assert image.labels[f"{LABEL_PREFIX}.pin.transformers"] == "5.2.0"


def test_cached_rebuild_is_skipped(built: BuildResult, image_spec: Image) -> None:
    again = build(image_spec, None, QUIET)
    assert (again.tag, again.built) == (built.tag, False)
    assert again.seconds < 15


def test_verify_passes_every_check_the_image_can_pass(report: VerifyReport) -> None:
    print(report.to_json())
    expected_ok = [f"pin {d}" for d in ("torch", "sglang", "flashinfer-python", "flashinfer-cubin", "sgl-kernel",
                                        "transformers", "nvidia-cuda-runtime-cu12", "nvidia-cuda-nvcc-cu12")]
    expected_ok += ["torch CUDA", "ptxas", "patch 0001-flashinfer-autotune-cutlass.patch", "server flags",
                    "GLM-5 support", "kernels torch", "kernels sgl_kernel"]
    failed = {f.code: f.message for f in report.findings if f.code in expected_ok and not f.ok}
    assert not failed, failed
    assert finding(report, "torch CUDA").message.startswith("torch 2.9.1")


def test_verify_reports_the_missing_nvcc_precisely(report: VerifyReport) -> None:
    # PyPI's nvidia-cuda-nvcc-cu12 12.8.93 (x86_64) ships ptxas and libnvvm but no nvcc driver, and
    # no registry this project reaches has nvcc 12.8: verify must say so, not pass it (README).
    nvcc = finding(report, "nvcc")
    assert not nvcc.ok
    assert nvcc.message == ("no nvcc in the image (FlashInfer compiles its SM120 kernels with $CUDA_HOME/bin/nvcc at "
                           "the first request, and the server stops there without it. Fix: image.base "
                           "nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04 (CUDA 12.8's toolchain))")
    # Nothing was built ahead of time either: the launch has no way to get FlashInfer's SM120 kernels.
    assert not finding(report, "nvcc compiles for 12.0a").ok
    aot = finding(report, "flashinfer aot")
    assert not aot.ok and "no nvcc to compile one at first use" in aot.message
    assert not report.ok


def test_verify_reports_sm120_per_library(report: VerifyReport) -> None:
    names = {f.code for f in report.findings if f.code.startswith("kernels ")}
    assert names == {"kernels torch", "kernels sgl_kernel", "kernels flashinfer"}
    # What these wheels really ship (README): torch has sm_120 SASS; sgl-kernel's common_ops has
    # sm_120a SASS while its FA3 and FlashMLA ops have none; flashinfer-cubin 0.6.3 ships
    # sm_100/sm_103 cubins only, so FlashInfer on SM120 depends on its JIT (and so on nvcc).
    assert f"SASS for {TARGET_ARCH}: " in finding(report, "kernels torch").message
    assert "sm_120 exact" in finding(report, "kernels torch").message
    sgl = finding(report, "kernels sgl_kernel").message
    assert "sm_120a arch-specific" in sgl and "flash_ops.abi3.so" in sgl
    flashinfer = finding(report, "kernels flashinfer")
    assert not flashinfer.ok and "SASS for sm_120: 0;" in flashinfer.message


def test_wrong_pin_is_reported_as_a_mismatch(built: BuildResult) -> None:
    wrong = verify(built.tag, profile_argv(), None, pins={"sglang": "0.5.8", "transformers": "5.3.0"},
                   kernels=False)
    assert finding(wrong, "pin sglang").message == "MISMATCH: sglang 0.5.9 installed, pinned 0.5.8"
    assert finding(wrong, "pin transformers").message == "MISMATCH: transformers 5.2.0 installed, pinned 5.3.0"
    assert finding(wrong, "pin torch").ok


def test_wrong_pin_is_refused_before_building() -> None:
    started = time.monotonic()
    with pytest.raises(BuildError, match="transformers: the lock has 5.2.0, the pins say 5.3.0"):
        build(Image(base="debootstrap", pins=ImagePins(transformers="5.3.0")), None, QUIET)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--kv-cache-dtype", "bf61", "argument --kv-cache-dtype: invalid choice: 'bf61'"),
    ("--tp-size", "8x", "argument --tensor-parallel-size/--tp-size: invalid int value: '8x'"),
    ("--moe-runner-backend", "flashinfer_cutlas", "argument --moe-runner-backend: invalid choice: 'flashinfer_cutlas'"),
])
def test_bad_profile_flag_is_rejected_by_sglangs_parser(built: BuildResult, flag: str, value: str, message: str) -> None:
    bad = verify(built.tag, with_flag(profile_argv(), flag, value), None, kernels=False)
    flags = finding(bad, "server flags")
    assert not flags.ok
    assert message in flags.message


def test_misspelt_flag_and_abbreviation(built: BuildResult) -> None:
    misspelt = verify(built.tag, profile_argv() + ["--disable-radix-cahce"], None, kernels=False)
    assert "unrecognized arguments: --disable-radix-cahce" in finding(misspelt, "server flags").message
    # --tp is accepted only as argparse's abbreviation of --tp-size (FIELD-NOTES s5): a typed int still applies.
    abbreviated = verify(built.tag, ["python3", "-m", "sglang.launch_server", "--model-path", "/m", "--tp", "8x"],
                         None, kernels=False)
    assert "invalid int value: '8x'" in finding(abbreviated, "server flags").message


def test_broken_patch_fails_at_its_own_step(built: BuildResult, image_spec: Image, tmp_path: Path,
                                            leftovers: None) -> None:
    folder = tmp_path / "sglang"
    shutil.copytree(images_dir(), folder)
    (folder / "stacks" / "sglang-0.5.9-cu128" / "patches" / "0002-broken.patch").write_text(
        "Meant to fail: its context is not in sglang 0.5.9.\n\n"
        "--- a/sglang/srt/model_executor/model_runner.py\n+++ b/sglang/srt/model_executor/model_runner.py\n"
        "@@ -1,2 +1,2 @@\n this line is not in the file\n-neither is this one\n+nor this replacement\n")
    started = time.monotonic()
    with pytest.raises(BuildError) as failure:
        build(image_spec, None, QUIET, folder=folder)
    elapsed = time.monotonic() - started
    message = str(failure.value)
    assert message.startswith("patch 0002-broken.patch does not apply")
    assert "gpunode: patch 0002-broken.patch does not apply to the installed packages" in message
    assert elapsed < 60, f"the cached layers were not reused: {elapsed:.0f} s"


def test_verify_leaves_no_container(built: BuildResult, engine: docker.DockerClient) -> None:
    verify(built.tag, profile_argv(), None, kernels=False)
    left = engine.containers.list(all=True, filters={"label": f"{LABEL_PREFIX}.probe=1"})
    assert left == []


def test_image_layer_pin_checks_read_the_built_image(built: BuildResult, image_spec: Image) -> None:
    """`gpunode check`'s image layer, through testinfra on this machine (whose engine holds the real
    image): every pin passes; a host file pinning another sglang is named."""
    import testinfra

    from gpunode.checks import test_image as image_layer

    here = testinfra.get_host("local://")
    # The inventory's gpunode_host and gpunode_derived, as far as the image layer reads them.
    host = {"image": {"lab_stand_in": None}}
    derived = {"server_image": built.tag, "pins": image_spec.pinned()}
    for pin in image_spec.pinned():
        image_layer.test_image_pin_matches(pin, here, host, derived)
    other = {**derived, "pins": {**derived["pins"], "sglang": "0.5.10"}}
    with pytest.raises(AssertionError, match=r"the image has sglang 0\.5\.9, the host file pins 0\.5\.10"):
        image_layer.test_image_pin_matches("sglang", here, host, other)
    gone = {**derived, "server_image": built.tag + "-absent"}
    with pytest.raises(pytest.fail.Exception, match="is not on the node's engine"):
        image_layer.test_server_image_present(here, gone)
