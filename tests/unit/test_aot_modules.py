"""FlashInfer ahead of time: the module list per profile, the plan, verify's judgement, the H200 reading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpunode import derive

from gpunode.derive import plan

from gpunode.catalogue import profiles, stacks
from gpunode.hostfile import HostFileError, load
from gpunode.catalogue import aot
from gpunode.stages.image.verify import aot_findings, judge, nvcc_compile_finding, sm_of

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "image" / "aot-h200" / "aot_h200.json"
PROFILE = profiles.load("glm5-nvfp4-sm120")
SEEDS = stacks.load(PROFILE.stack)
MLA = "batch_mla_attention_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_head_dim_ckv_512_head_dim_kpe_64_profiler_False"
PREFILL = ("batch_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_head_dim_qk_256_"
           "head_dim_vo_256_posenc_0_use_swa_False_use_logits_cap_False_f16qk_False")


def names(overrides: dict) -> list[str]:
    return [m.name for m in aot.profile_modules(SEEDS, PROFILE, overrides)]


def test_the_seeds_profile_builds_attention_fp4_quantization_and_moe() -> None:
    # cuDNN FP4 GEMM (no FlashInfer module, no nvcc), bf16 KV, TP 8.
    assert names({}) == [MLA, PREFILL, "fp4_quantization_120", "fused_moe_120"]
    groups = [group for group, _ in aot.plan_for(aot.gpu_arch("RTX PRO 6000 Blackwell"),
                                                  aot.profile_modules(SEEDS, PROFILE, {}), "profile", True, "x").groups()]
    assert groups == ["attention", "fp4", "moe"]


def test_flashinfer_cutlass_fp4_gemm_adds_its_sm120_module() -> None:
    assert names({"--fp4-gemm-backend": "flashinfer_cutlass"}) == [
        MLA, PREFILL, "fp4_quantization_120", "fp4_gemm_cutlass_sm120", "fused_moe_120"]


def test_tp_size_and_kv_dtype_do_not_enter_any_module_name() -> None:
    # No FlashInfer URI holds a head count, and sglang 0.5.9 passes the model dtype as the MLA
    # backend's KV dtype (flashinfer_mla_backend.py:666, 776-777).
    assert names({"--tp-size": 1}) == names({}) == names({"--kv-cache-dtype": "fp8_e4m3"})


def test_other_backends_build_nothing_of_theirs() -> None:
    assert names({"--attention-backend": "triton"}) == ["fp4_quantization_120", "fused_moe_120"]
    assert names({"--moe-runner-backend": "triton", "--attention-backend": "triton"}) == ["fp4_quantization_120"]
    assert names({"--quantization": False, "--attention-backend": "triton"}) == []


DTYPE_NAMES = {"bfloat16": "bf16", "float8_e4m3fn": "e4m3", "int32": "i32"}  # flashinfer/jit/utils.py


def uri(prefix: str, kwargs: dict, fields: list[tuple[str, str]]) -> str:
    """FlashInfer 0.6.3's get_batch_mla_uri / get_batch_prefill_uri (jit/attention/modules.py 89-107,
    371-395): each field as <label>_<value>, dtypes by their short names, _sm90 for fa3."""
    def shown(value: object) -> str:
        return DTYPE_NAMES[value[len("dtype:"):]] if isinstance(value, str) and value.startswith("dtype:") else str(value)
    return prefix + "_".join(f"{label}_{shown(kwargs[key])}" for label, key in fields) + (
        "_sm90" if kwargs["backend"] == "fa3" else "")


def test_the_stacks_attention_names_follow_flashinfers_uri_rules() -> None:
    dtypes = [("dtype_q", "dtype_q"), ("dtype_kv", "dtype_kv"), ("dtype_o", "dtype_o"), ("dtype_idx", "dtype_idx")]
    rules = {rule.generator.split(":")[1]: rule for rule in SEEDS.flashinfer_modules}
    mla = rules["gen_batch_mla_module"]
    assert mla.name == uri("batch_mla_attention_", dict(mla.kwargs), dtypes + [
        ("head_dim_ckv", "head_dim_ckv"), ("head_dim_kpe", "head_dim_kpe"), ("profiler", "use_profiler")])
    prefill = rules["gen_batch_prefill_module"]
    assert prefill.name == uri("batch_prefill_with_kv_cache_", dict(prefill.kwargs), dtypes + [
        ("head_dim_qk", "head_dim_qk"), ("head_dim_vo", "head_dim_vo"), ("posenc", "pos_encoding_mode"),
        ("use_swa", "use_sliding_window"), ("use_logits_cap", "use_logits_soft_cap"), ("f16qk", "use_fp16_qk_reduction")])


def test_gpu_models_map_to_arch_specific_targets() -> None:
    assert aot.gpu_arch("RTX PRO 6000 Blackwell").cuda_arch == "12.0a"
    assert aot.gpu_arch("RTX PRO 6000 Blackwell").sm == "sm_120a"
    assert aot.gpu_arch("H200").sm == "sm_90a"
    assert sm_of("12.0a") == "sm_120"


def test_modules_json_reads_back_with_dtypes_as_names() -> None:
    entries = json.loads(aot.modules_json(aot.profile_modules(SEEDS, PROFILE, {})))
    assert entries[0]["kwargs"]["dtype_q"] == "dtype:bfloat16" and entries[0]["kwargs"]["head_dim_ckv"] == 512
    assert entries[3] == {"name": "fused_moe_120", "generator": "flashinfer.jit.fused_moe:gen_cutlass_fused_moe_sm120_module",
                          "kwargs": {"use_fast_build": False}}


def edited(tmp_path: Path, old: str, new: str, source: str = "example") -> Path:
    text = (ROOT / "inventory" / source / "host.yml").read_text()
    assert old in text
    path = tmp_path / "host.yml"
    path.write_text(text.replace(old, new))
    return path


def test_the_example_plans_every_module_for_12_0a_with_the_devel_base() -> None:
    host = load(ROOT / "inventory" / "example" / "host.yml").hosts[0]
    planned = derive.aot_plan(host)
    assert planned.arch.cuda_arch == "12.0a" and [m.name for m in planned.modules] == names({})
    section = plan.image_section(host)
    assert section["toolchain"].startswith("cuda-12.8: CUDA 12.8 at /usr/local/cuda")
    assert section["base_digest"].startswith("unpinned tag")
    assert all(m["ahead_of_time"] for m in section["flashinfer_aot"])


def test_without_a_toolchain_nothing_is_built_and_the_plan_says_why() -> None:
    lab = load(ROOT / "inventory" / "lab" / "host.yml").hosts[0]
    planned = derive.aot_plan(lab)
    assert planned.modules == () and len(planned.wanted) == 4
    assert "base debootstrap has no CUDA toolchain (nvcc)" in planned.note
    assert plan.image_section(lab)["toolchain"].startswith("none: base debootstrap has no nvcc")


def test_a_subset_must_come_from_the_profile(tmp_path: Path) -> None:
    path = edited(tmp_path, "      flashinfer_aot: profile ", "      flashinfer_aot: [page] ")
    with pytest.raises(HostFileError, match="image.flashinfer_aot: page not among the profile's FlashInfer modules"):
        load(path)


def test_the_lab_toolchain_is_refused_outside_the_lab(tmp_path: Path) -> None:
    path = edited(tmp_path, "      flashinfer_aot: profile ", "      toolchain: pypi-cuda-13.0\n      flashinfer_aot: profile ")
    with pytest.raises(HostFileError, match="image.toolchain pypi-cuda-13.0 is a lab stand-in"):
        load(path)


def test_a_gpu_model_of_another_arch_than_the_profile_is_refused(tmp_path: Path) -> None:
    path = edited(tmp_path, "gpu_model: RTX PRO 6000 Blackwell", "gpu_model: H200")
    with pytest.raises(HostFileError, match="image.gpu_model H200 is sm_90a, but profile glm5-nvfp4-sm120 is for sm_120"):
        load(path)


# ---- verify's judgement (pure) --------------------------------------------------------------

ENTRY = {"name": MLA, "generator": "g:f", "kwargs": {}}
GOOD = {"spec_name": MLA, "aot_path": f"/site/flashinfer/data/aot/{MLA}/{MLA}.so", "is_aot": True,
        "library": f"/site/flashinfer/data/aot/{MLA}/{MLA}.so", "sass": ["sm_120a"], "ptx": [], "size": 9, "errors": []}


def test_a_module_in_the_aot_directory_with_target_sass_passes() -> None:
    (finding,) = aot_findings({MLA: GOOD}, [ENTRY], "12.0a", nvcc=True)
    assert finding.ok and finding.code == f"flashinfer aot {MLA}" and "SASS sm_120a, target sm_120" in finding.message


@pytest.mark.parametrize(("fact", "words"), [
    ({**GOOD, "is_aot": False, "library": "/jit/x.so"}, "not in FlashInfer's AOT directory"),
    ({**GOOD, "sass": ["sm_90a"]}, "SASS sm_90a, target sm_120"),
    ({**GOOD, "spec_name": "other"}, "FlashInfer names this module other"),
    ({"error": "RuntimeError: boom"}, "FlashInfer cannot make its spec: RuntimeError: boom"),
])
def test_a_module_that_a_launch_would_not_find_fails(fact: dict, words: str) -> None:
    (finding,) = aot_findings({MLA: fact}, [ENTRY], "12.0a", nvcc=True)
    assert not finding.ok and words in finding.message


def test_no_modules_and_no_nvcc_is_a_failure_with_the_reason() -> None:
    (none,) = aot_findings({}, [], "12.0a", nvcc=False)
    assert not none.ok and "no nvcc to compile one at first use" in none.message
    assert aot_findings({}, [], "12.0a", nvcc=True)[0].ok


def test_nvcc_compile_finding() -> None:
    assert nvcc_compile_finding({"ok": True, "sass": ["sm_120"]}, "12.0a").ok
    assert not nvcc_compile_finding({"ok": True, "sass": ["sm_90"]}, "12.0a").ok
    failed = nvcc_compile_finding({"ok": False, "error": "no nvcc"}, "12.0a")
    assert not failed.ok and failed.code == "nvcc compiles for 12.0a"


def test_a_missing_nvcc_names_the_reason_and_the_fix() -> None:
    findings = {f.code: f for f in judge({"tools": {"nvcc": {"path": None}}}, stacks.load(stacks.DEFAULT).versions(), stacks.load(stacks.DEFAULT), [], "sm_120",
                                         cuda_arch="12.0a")}
    assert findings["nvcc"].message.startswith("no nvcc in the image (FlashInfer compiles its SM120 kernels with "
                                              "$CUDA_HOME/bin/nvcc at the first request")
    assert "Fix: image.base nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04" in findings["nvcc"].message


def test_the_toolchains_cuda_is_what_nvcc_is_judged_against() -> None:
    tools = {"nvcc": {"path": "/usr/local/cuda/bin/nvcc", "version": "Cuda compilation tools, release 13.0, V13.0.88"}}
    assert {f.code: f for f in judge({"tools": tools}, stacks.load(stacks.DEFAULT).versions(), stacks.load(stacks.DEFAULT), [], "sm_120", tool_cuda="13.0")}["nvcc"].ok
    assert not {f.code: f for f in judge({"tools": tools}, stacks.load(stacks.DEFAULT).versions(), stacks.load(stacks.DEFAULT), [], "sm_120")}["nvcc"].ok


# ---- the H200 reading: a module built ahead of time ran with JIT disabled ----------------------

@pytest.mark.recording
def test_the_h200_reading_shows_the_mechanism_end_to_end() -> None:
    """Recorded by scripts/aot_h200.py on an H200 (README beside the fixture): built for 9.0a with
    FlashInfer's generator, copied where FlashInfer's lookup looks (what flashinfer_aot.py does in
    the image), loaded in a fresh process with FLASHINFER_DISABLE_JIT=1, equal to PyTorch."""
    reading = json.loads(FIXTURE.read_text())
    build, check = reading["build"], reading["check"]
    assert reading["versions"]["gpu"] == "NVIDIA H200" and reading["arch_list"] == "9.0a"
    assert reading["negative"]["raised"] == "MissingJITCacheError"  # JIT disabled and no module: an error
    assert build["aot_path"] == f"{build['aot_dir']}/{build['name']}/{build['name']}.so"
    assert reading["cuobjdump"]["archs"] == ["sm_90a"]
    assert check["lookup"]["get_library_path"] == build["aot_path"] and check["lookup"]["is_aot"]
    assert check["loaded_so"] == [build["aot_path"]]
    assert check["max_abs_err"] == 0.0 and reading["pass"] and all(reading["conditions"].values())
