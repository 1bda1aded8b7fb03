"""The finding logic of gpunode.stages.image.verify: facts in, named pass/fail findings out (no Docker)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpunode.catalogue import stacks
from gpunode.catalogue.patches import parse_patch
from gpunode.stages.image.verify import (
    PROBE_MARK,
    VerifyError,
    VerifyReport,
    arch_family,
    argv_finding,
    judge,
    kernels_finding,
    load_patches,
    parse_probe_output,
    pin_findings,
    pins_from_labels,
    probe_request,
    server_args_after_module,
    tool_finding,
    torch_cuda_finding,
)

SEEDS = stacks.load(stacks.DEFAULT)
PINS = SEEDS.versions()
GOOD_VERSIONS = {"torch": "2.9.1", "sglang": "0.5.9", "flashinfer-python": "0.6.3", "flashinfer-cubin": "0.6.3",
                 "sgl-kernel": "0.3.21", "transformers": "5.2.0", "nvidia-cuda-runtime-cu12": "12.8.90",
                 "nvidia-cuda-nvcc-cu12": "12.8.93"}
PTXAS_12_8 = "ptxas: NVIDIA (R) Ptx optimizing assembler\nCuda compilation tools, release 12.8, V12.8.93\nBuild cuda_12.8"


def good_facts() -> dict[str, Any]:
    patch = load_patches(SEEDS)[0]
    runner = "\n".join(line for block in patch.added_blocks["sglang/srt/model_executor/model_runner.py"] for line in block)
    return {
        "versions": dict(GOOD_VERSIONS),
        "torch": {"version": "2.9.1+cu128", "cuda": "12.8"},
        "tools": {"nvcc": {"path": "/usr/local/cuda/bin/nvcc", "version": PTXAS_12_8},
                  "ptxas": {"path": "/x/ptxas", "version": PTXAS_12_8}},
        "files": {"sglang/srt/model_executor/model_runner.py": "x\n" + runner + "\ny\n"},
        "kernels": {"torch": {"files": 10, "errors": [],
                              "binaries": {"torch/lib/libtorch_cuda.so": {"elf": ["sm_90", "sm_120"], "ptx": []}}}},
        "server_argv": {"ok": True, "values": {"tp_size": 8}},
        "model": {"transformers_glm_moe_dsa": True, "sglang_glm5_class": True},
    }


def by_name(findings: list[Any]) -> dict[str, Any]:
    return {f.code: f for f in findings}


def test_all_good_facts_pass() -> None:
    report = VerifyReport("t", judge(good_facts(), PINS, SEEDS, load_patches(SEEDS), "sm_120"))
    assert report.ok, [f for f in report.findings if not f.ok]
    names = [f.code for f in report.findings]
    assert names[:2] == ["pin torch", "pin sglang"]
    assert {"torch CUDA", "nvcc", "ptxas", "patch 0001-flashinfer-autotune-cutlass.patch", "kernels torch",
            "server flags", "GLM-5 support"} <= set(names)
    assert json.loads(report.to_json())["ok"] is True


def test_wrong_pin_is_a_named_mismatch() -> None:
    findings = by_name(pin_findings({**GOOD_VERSIONS, "sglang": "0.5.8"}, PINS, SEEDS))
    assert not findings["pin sglang"].ok
    assert findings["pin sglang"].message == "MISMATCH: sglang 0.5.8 installed, pinned 0.5.9"
    assert findings["pin torch"].ok


def test_missing_distribution_fails() -> None:
    versions = {k: v for k, v in GOOD_VERSIONS.items() if k != "flashinfer-cubin"}
    finding = by_name(pin_findings(versions, PINS, SEEDS))["pin flashinfer-cubin"]
    assert not finding.ok and "not installed" in finding.message


def test_expected_pins_come_from_labels_or_argument() -> None:
    pins = pins_from_labels({"org.gpunode.pin.sglang": "0.5.8", "org.gpunode.venv": "/opt/sglang", "other": "x"}, SEEDS)
    assert pins["sglang"] == "0.5.8" and pins["torch"] == "2.9.1"


def test_torch_cuda() -> None:
    assert torch_cuda_finding({"version": "2.9.1", "cuda": "12.8"}, PINS).ok
    assert not torch_cuda_finding({"version": "2.9.1", "cuda": "12.6"}, PINS).ok
    assert not torch_cuda_finding({"version": "2.9.1+cpu", "cuda": None}, PINS).ok
    assert "import torch failed" in torch_cuda_finding({"error": "ImportError: x"}, PINS).message


def test_tool_finding_reads_release() -> None:
    assert tool_finding("ptxas", {"path": "/p", "version": PTXAS_12_8}, "12.8", "why").ok
    other = PTXAS_12_8.replace("12.8", "13.0")
    assert not tool_finding("ptxas", {"path": "/p", "version": other}, "12.8", "why").ok
    missing = tool_finding("nvcc", {"path": None, "version": None}, "12.8", "FlashInfer's JIT")
    assert not missing.ok and missing.message == "no nvcc in the image (FlashInfer's JIT)"


def test_unapplied_patch_fails_with_its_name() -> None:
    facts = good_facts()
    facts["files"]["sglang/srt/model_executor/model_runner.py"] = '            # "flashinfer_cutlass",\n'
    finding = by_name(judge(facts, PINS, SEEDS, load_patches(SEEDS), "sm_120"))["patch 0001-flashinfer-autotune-cutlass.patch"]
    assert not finding.ok and "lacks the patched text" in finding.message
    facts["files"]["sglang/srt/model_executor/model_runner.py"] = None
    finding = by_name(judge(facts, PINS, SEEDS, load_patches(SEEDS), "sm_120"))["patch 0001-flashinfer-autotune-cutlass.patch"]
    assert "is not installed" in finding.message


@pytest.mark.parametrize(("arch", "family"), [("sm_120", "exact"), ("sm_120a", "arch-specific"),
                                              ("sm_120f", "family"), ("sm_100", None), ("sm_12", None)])
def test_arch_family(arch: str, family: str | None) -> None:
    assert arch_family("sm_120", arch) == family


def binaries(**files: tuple[list[str], list[str]]) -> dict[str, Any]:
    return {"files": len(files) + 1, "errors": [],
            "binaries": {f"lib/{name}.so": {"elf": elf, "ptx": ptx} for name, (elf, ptx) in files.items()}}


def test_kernels_pass_on_sass_for_the_target_family_and_name_the_files_without() -> None:
    facts = binaries(common=(["sm_90a", "sm_120a"], []), flash=(["sm_80", "sm_90a"], []))
    finding = kernels_finding("sgl_kernel", facts, "sm_120")
    assert finding.ok
    assert finding.message.startswith("2 binaries with device code; SASS for sm_120: 1 (sm_120a arch-specific)")
    assert "SASS per arch (binaries): sm_80 1, sm_90a 2, sm_120a 1" in finding.message
    assert "no sm_120 code in 1: flash.so" in finding.message


def test_kernels_with_ptx_only_fail_and_say_so() -> None:
    finding = kernels_finding("x", binaries(a=(["sm_90"], ["sm_120"])), "sm_120")
    assert not finding.ok
    assert "PTX only for sm_120 (driver JIT at first load): a.so" in finding.message


def test_kernels_for_other_archs_only_fail() -> None:
    facts = binaries(**{f"k{i}": (["sm_100"], []) for i in range(6)})
    finding = kernels_finding("flashinfer", facts, "sm_120")
    assert not finding.ok
    assert "SASS for sm_120: 0;" in finding.message
    assert "no sm_120 code in 6: k0.so, k1.so, k2.so, k3.so and 2 more" in finding.message


def test_kernels_without_binaries_or_with_errors_fail() -> None:
    nothing = kernels_finding("x", {"files": 3, "binaries": {}, "errors": []}, "sm_120")
    assert not nothing.ok and nothing.message == "3 files matched, none with device code"
    errored = {**binaries(a=(["sm_120"], [])), "errors": ["a.so: boom"]}
    finding = kernels_finding("x", errored, "sm_120")
    assert not finding.ok and "a.so: boom" in finding.message


def test_rejected_flag_is_quoted() -> None:
    error = "sglang.launch_server: error: argument --kv-cache-dtype: invalid choice: 'bf61'"
    finding = argv_finding({"ok": False, "error": error})
    assert not finding.ok and "invalid choice: 'bf61'" in finding.message


def test_server_args_after_module() -> None:
    assert server_args_after_module(["python3", "-m", "sglang.launch_server", "--tp-size", "8"]) == ["--tp-size", "8"]
    assert server_args_after_module(["--tp-size", "8"]) == ["--tp-size", "8"]


def test_probe_request_lists_patched_files_and_pinned_distributions() -> None:
    request = probe_request(PINS, SEEDS, load_patches(SEEDS), ["python3", "-m", "sglang.launch_server", "--port", "1"])
    assert request["files"] == ["sglang/srt/model_executor/model_runner.py"]
    assert "flashinfer-cubin" in request["distributions"]
    assert request["server_argv"] == ["--port", "1"]


def test_probe_output_is_found_after_noise() -> None:
    facts = parse_probe_output("warning: x\n" + PROBE_MARK + json.dumps({"a": 1}) + "\n")
    assert facts == {"a": 1}
    with pytest.raises(VerifyError, match="printed no result"):
        parse_probe_output("Traceback ...\nboom\n")


def test_a_patch_parsed_from_text_drives_the_files_checked() -> None:
    patch = parse_patch("p.patch", "--- a/pkg/m.py\n+++ b/pkg/m.py\n@@ -1 +1 @@\n-a\n+b\n")
    assert probe_request(PINS, SEEDS, [patch], [])["files"] == ["pkg/m.py"]
