"""FlashInfer's kernels ahead of time: which modules a server profile's launch compiles, for which arch.

On SM120 FlashInfer 0.6.3 ships no cubins (flashinfer-cubin has sm_100/103 only), so every
FlashInfer kernel the launch touches is JIT-compiled with nvcc at first use (FIELD-NOTES s8). The
image build compiles them instead, for the host file's GPU arch, into FlashInfer's AOT directory
(``flashinfer/data/aot/<name>/<name>.so``), where FlashInfer looks before it compiles.

The list is derived from the launch flags (attention backend, FP4 GEMM backend, MoE runner, KV
dtype, TP size) by the rules of SGLang 0.5.9, each rule citing the source that makes it; a module
is described by FlashInfer's own generator and arguments, so the image build and ``image verify``
ask FlashInfer itself for the spec. ``name`` is FlashInfer's URI for it, computed here the way
FlashInfer computes it (flashinfer/jit/attention/modules.py get_batch_*_uri), and checked against
FlashInfer's generators in the built image. Pure: no torch, no FlashInfer import.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from gpunode.profiles import FlagValue, Profile, merged_flags


@dataclass(frozen=True)
class GpuArch:
    model: str
    cuda_arch: str  # FLASHINFER_CUDA_ARCH_LIST / TORCH_CUDA_ARCH_LIST form: "12.0a"

    @property
    def sm(self) -> str:
        """The SASS target as cuobjdump names it: ``sm_120a``."""
        major, minor = self.cuda_arch.rstrip("af").split(".")
        return f"sm_{major}{minor}{self.cuda_arch[-1] if self.cuda_arch[-1] in 'af' else ''}"


# The arch-specific ("a") targets: FlashInfer's SM120 GEMM/MoE/FP4 kernels use sm_120a features.
GPU_ARCHS: dict[str, GpuArch] = {model: GpuArch(model, arch) for model, arch in (
    ("RTX PRO 6000 Blackwell", "12.0a"),
    ("RTX 5090", "12.0a"),
    ("B200", "10.0a"),
    ("H200", "9.0a"),
    ("H100", "9.0a"),
)}


def gpu_arch(model: str) -> GpuArch:
    return GPU_ARCHS[model]


# FlashInfer's dtype spellings in module names (flashinfer/jit/utils.py filename_safe_dtype_map).
DTYPE_NAMES = {"float16": "f16", "bfloat16": "bf16", "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2",
               "int32": "i32", "int64": "i64", "uint8": "u8"}


@dataclass(frozen=True)
class AotModule:
    """One FlashInfer JIT module: its name, the build step (group) it is compiled in, and how to
    ask FlashInfer for its spec: ``generator`` (``module:function``) called with ``kwargs``, where a
    value ``"dtype:<name>"`` stands for ``torch.<name>``."""

    name: str
    group: str
    generator: str
    why: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "generator": self.generator, "kwargs": dict(self.kwargs)}


def modules_json(modules: list[AotModule]) -> str:
    """The modules as the in-image builder and the probe read them: compact JSON, no quotes to escape."""
    text = json.dumps([m.as_json() for m in modules], separators=(",", ":"), sort_keys=True)
    assert "'" not in text  # it goes into a single-quoted shell word
    return text


def _dtype(name: str) -> str:
    return f"dtype:{name}"


# ---- FlashInfer's module names (URIs), as FlashInfer 0.6.3 computes them -----------------------

def batch_mla_name(dtype_q: str, dtype_kv: str, dtype_o: str, dtype_idx: str, head_dim_ckv: int,
                   head_dim_kpe: int, use_profiler: bool, backend: str) -> str:
    """flashinfer/jit/attention/modules.py get_batch_mla_uri (0.6.3, lines 89-107)."""
    d = DTYPE_NAMES
    return (f"batch_mla_attention_dtype_q_{d[dtype_q]}_dtype_kv_{d[dtype_kv]}_dtype_o_{d[dtype_o]}_"
            f"dtype_idx_{d[dtype_idx]}_head_dim_ckv_{head_dim_ckv}_head_dim_kpe_{head_dim_kpe}_"
            f"profiler_{use_profiler}") + ("_sm90" if backend == "fa3" else "")


def batch_prefill_name(dtype_q: str, dtype_kv: str, dtype_o: str, dtype_idx: str, head_dim_qk: int,
                       head_dim_vo: int, pos_encoding_mode: int, use_sliding_window: bool,
                       use_logits_soft_cap: bool, use_fp16_qk_reduction: bool, backend: str) -> str:
    """flashinfer/jit/attention/modules.py get_batch_prefill_uri (0.6.3, lines 371-395)."""
    d = DTYPE_NAMES
    return (f"batch_prefill_with_kv_cache_dtype_q_{d[dtype_q]}_dtype_kv_{d[dtype_kv]}_dtype_o_{d[dtype_o]}_"
            f"dtype_idx_{d[dtype_idx]}_head_dim_qk_{head_dim_qk}_head_dim_vo_{head_dim_vo}_"
            f"posenc_{pos_encoding_mode}_use_swa_{use_sliding_window}_use_logits_cap_{use_logits_soft_cap}_"
            f"f16qk_{use_fp16_qk_reduction}") + ("_sm90" if backend == "fa3" else "")


@dataclass(frozen=True)
class AotPlan:
    """What the image build compiles ahead of time: ``modules`` (empty with ``note`` saying why)
    out of ``wanted``, the profile's list, for ``arch``."""

    arch: GpuArch
    wanted: tuple[AotModule, ...]
    modules: tuple[AotModule, ...]
    note: str = ""

    def groups(self) -> list[tuple[str, list[AotModule]]]:
        """Modules by build step, in first-seen order: one image layer per group."""
        out: dict[str, list[AotModule]] = {}
        for module in self.modules:
            out.setdefault(module.group, []).append(module)
        return list(out.items())


def plan_for(arch: GpuArch, wanted: list[AotModule], choice: str | list[str], has_toolchain: bool,
             base: str) -> AotPlan:
    """The modules to build: the profile's (``profile``), none, or the named subset; none at all
    without a toolchain, and the note says so."""
    if choice == "none":
        return AotPlan(arch, tuple(wanted), (), "image.flashinfer_aot is none: FlashInfer compiles them at first use")
    chosen = [m for m in wanted if choice == "profile" or m.name in choice]
    if not has_toolchain:
        return AotPlan(arch, tuple(wanted), (), f"base {base} has no CUDA toolchain (nvcc): nothing can be built "
                       "ahead of time, and FlashInfer cannot compile them at first use either")
    note = "" if len(chosen) == len(wanted) else f"{len(chosen)} of the profile's {len(wanted)} (image.flashinfer_aot)"
    return AotPlan(arch, tuple(wanted), tuple(chosen), note)


# ---- the rules: which modules a launch compiles (sglang 0.5.9 + FlashInfer 0.6.3, on SM120) --------
# GLM-5's attention (transformers 5.2 GlmMoeDsaConfig defaults, which name zai-org/GLM-5): MLA with
# kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 192, v_head_dim 256; weights in bf16.
GLM5_MLA = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 192, "v_head_dim": 256}
MODEL_DTYPE = "bfloat16"


def _attention(flags: Mapping[str, FlagValue]) -> list[AotModule]:
    """``--attention-backend flashinfer`` for GlmMoeDsaForCausalLM builds FlashInferMLAAttnBackend
    (sglang layers/attention/attention_registry.py:23-45); on SM120 FlashInfer's "auto" is fa2
    (flashinfer utils.py:561 determine_mla_backend, prefill.py:2832). Decode and paged prefill run
    BatchMLAPagedAttentionWrapper (mla.py:137-139), ragged and chunked prefill
    BatchPrefillWithRaggedKVCacheWrapper (prefill.py:395-407). sglang passes the model dtype as the
    KV dtype to both (flashinfer_mla_backend.py:666, 776-777), so ``--kv-cache-dtype`` does not
    change their names, and no name holds a head count, so neither does the TP size."""
    if flags.get("--attention-backend") != "flashinfer":
        return []
    mla, dtype = GLM5_MLA, MODEL_DTYPE
    decode = {"backend": "fa2", "dtype_q": dtype, "dtype_kv": dtype, "dtype_o": dtype, "dtype_idx": "int32",
              "head_dim_ckv": mla["kv_lora_rank"], "head_dim_kpe": mla["qk_rope_head_dim"], "use_profiler": False}
    head_dim_qk = mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]
    prefill = {"backend": "fa2", "dtype_q": dtype, "dtype_kv": dtype, "dtype_o": dtype, "dtype_idx": "int32",
               "head_dim_qk": head_dim_qk, "head_dim_vo": mla["v_head_dim"], "pos_encoding_mode": 0,
               "use_sliding_window": False, "use_logits_soft_cap": False, "use_fp16_qk_reduction": False}
    return [
        AotModule(batch_mla_name(**decode), "attention", "flashinfer.jit.attention.modules:gen_batch_mla_module",
                  "MLA decode and paged prefill (BatchMLAPagedAttentionWrapper, fa2)",
                  {k: _dtype(v) if k.startswith("dtype") else v for k, v in decode.items()}),
        AotModule(batch_prefill_name(**prefill), "attention", "flashinfer.jit.attention.modules:gen_batch_prefill_module",
                  "ragged and chunked prefill (BatchPrefillWithRaggedKVCacheWrapper, fa2)",
                  {k: _dtype(v) if k.startswith("dtype") else v for k, v in prefill.items()}),
    ]


def _fp4(flags: Mapping[str, FlagValue]) -> list[AotModule]:
    """NVFP4 linear layers on SM120 quantize activations with FlashInfer's fp4_quantize (sglang
    modelopt_quant.py:70-80, 1290; FlashInfer fp4_quantization.py:629-690). Their GEMM runs in
    cuDNN for ``flashinfer_cudnn`` (no FlashInfer module, no nvcc; gemm_base.py:2936-2950) or in
    FlashInfer's SM120 CUTLASS module for ``flashinfer_cutlass``, 0.5.9's default
    (server_args.py:456; jit/gemm/core.py:164-207)."""
    if flags.get("--quantization") != "modelopt_fp4":
        return []
    modules = [AotModule("fp4_quantization_120", "fp4",
                         "flashinfer.jit.fp4_quantization:gen_fp4_quantization_sm120_module",
                         "NVFP4 activation quantization of the FP4 linear layers")]
    if flags.get("--fp4-gemm-backend", "flashinfer_cutlass") == "flashinfer_cutlass":
        modules.append(AotModule("fp4_gemm_cutlass_sm120", "fp4", "flashinfer.jit.gemm.core:gen_gemm_sm120_module_cutlass_fp4",
                                 "NVFP4 GEMM of the linear layers (--fp4-gemm-backend flashinfer_cutlass)"))
    return modules


def _moe(flags: Mapping[str, FlagValue]) -> list[AotModule]:
    """``--moe-runner-backend flashinfer_cutlass`` with NVFP4 experts runs FlashInfer's CUTLASS
    fused MoE (sglang modelopt_quant.py:1740-1795 ModelOptNvFp4FusedMoEMethod.apply), on SM120 its
    sm120 module (jit/fused_moe.py:33-48): 89 sources, the longest build of all."""
    if flags.get("--moe-runner-backend") != "flashinfer_cutlass" or flags.get("--quantization") != "modelopt_fp4":
        return []
    return [AotModule("fused_moe_120", "moe", "flashinfer.jit.fused_moe:gen_cutlass_fused_moe_sm120_module",
                      "the NVFP4 experts (--moe-runner-backend flashinfer_cutlass)", {"use_fast_build": False})]


def profile_modules(profile: Profile, overrides: Mapping[str, FlagValue]) -> list[AotModule]:
    """The FlashInfer modules the profile's launch (with the host file's flag overrides) compiles on
    SM120. What it does not compile there: sampling, norms, activation and merge-state run in
    sgl_kernel; MoE top-k falls through to torch for GLM-5's single expert group (topk.py:751-790);
    the all-reduce fusion is SM90/SM100 only (communicator.py:91-101), at any TP size."""
    flags = {flag: value for flag, value in merged_flags(profile, overrides).items() if value is not False}
    return _attention(flags) + _fp4(flags) + _moe(flags)
