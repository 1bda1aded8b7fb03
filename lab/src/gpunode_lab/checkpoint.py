"""A tiny, deterministic checkpoint shaped like lukealonso/GLM-5-NVFP4, for the hub stand-in (hub.py).

``make(folder)`` writes what a ModelOpt NVFP4 export of GLM-5 holds, at toy size: ``config.json``,
``generation_config.json``, ``hf_quant_config.json``, ``tokenizer.json`` (``{}``), N shards
``model-0000k-of-0000N.safetensors`` written by the real safetensors library, and
``model.safetensors.index.json``. Same arguments, same bytes, same commit (:func:`gpunode_lab.hub.commit_of`).

Where the shapes come from (none of it verified against the published files, which were not at hand):

* the config keys and GLM-5's full-size values: transformers' ``GlmMoeDsaConfig``
  (models/glm_moe_dsa/modular_glm_moe_dsa.py: MLA ranks, DSA indexer ``index_*``, 256 routed experts, 3
  dense layers); the toy keeps the keys and shrinks the numbers so the shapes below are consistent;
* the quantization: NVIDIA Model-Optimizer's export (modelopt/torch/export/convert_hf_config.py,
  ``convert_hf_quant_config_format``) writes ``quantization_config`` = {config_groups.group_0 weights and
  input_activations 4-bit float, group_size 16; ignore; quant_algo NVFP4; producer; quant_method modelopt}
  into config.json and the older ``hf_quant_config.json`` beside it; lukealonso/GLM-5-NVFP4's card says
  only the routed experts' gate/up/down projections are NVFP4, attention stays BF16 (hence the ignore list);
* a quantized linear holds ``weight`` uint8 (two FP4 per byte), ``weight_scale`` float8_e4m3fn (one per 16
  elements), ``weight_scale_2`` and ``input_scale`` float32 scalars (ModelOpt's NVFP4 layout). Note:
  numpy cannot load F8_E4M3 (``safe_open(framework="numpy").get_tensor`` fails on it); headers and
  ``safetensors.deserialize`` read it;
* the index: transformers 5's ``save_pretrained``: {"metadata": {"total_parameters", "total_size"},
  "weight_map"}, ``json.dumps(indent=2, sort_keys=True) + "\\n"``; total_size is the tensor bytes.

safetensors 0.8.0's ``serialize_file`` takes ``TensorSpec(dtype, shape, data_ptr, data_len)`` objects, not
the raw-bytes dicts of older releases; the pointers come from ctypes over bytearrays, so neither numpy
nor torch is needed.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any

import safetensors

from gpunode_lab.hub import commit_of

HIDDEN = 64               # hidden_size
VOCAB = 128               # vocab_size
HEADS = 2                 # num_attention_heads = num_key_value_heads
Q_LORA, KV_LORA = 32, 16  # q_lora_rank, kv_lora_rank
NOPE, ROPE, V_HEAD = 16, 8, 16
INDEX_HEADS, INDEX_DIM = 2, 16
EXPERTS = 4               # n_routed_experts per MoE layer
TOPK = 2                  # num_experts_per_tok
GROUP = 16                # NVFP4 block size
MODELOPT_VERSION = "0.39.0"  # a plausible producer version, not read from the real repo

# safetensors' own dtype names (TensorSpec) and each one's bytes per element
DTYPES = {"uint8": 1, "bfloat16": 2, "float8_e4m3fn": 1, "float32": 4}


def _stream(seed: int, name: str, n: int) -> bytes:
    return hashlib.shake_256(f"gpunode-lab:{seed}:{name}".encode()).digest(n) if n else b""


def _bf16(seed: int, name: str, count: int, fill: float | None = None) -> bytes:
    """Finite bfloat16 values: ``fill`` everywhere, or small random ones (|x| in [1/128, 1/64))."""
    if fill is not None:
        return struct.pack("<f", fill)[2:] * count
    raw = bytearray(_stream(seed, name, 2 * count))
    raw[1::2] = raw[1::2].translate(bytes((b & 0x80) | 0x3C for b in range(256)))  # sign + exponent 120
    raw[0::2] = raw[0::2].translate(bytes(b & 0x7F for b in range(256)))           # exponent low bit 0
    return bytes(raw)


def _fp8_scales(seed: int, name: str, count: int) -> bytes:
    """Positive, finite float8_e4m3fn block scales in [1, 2)."""
    return _stream(seed, name, count).translate(bytes(0x38 | (b & 0x07) for b in range(256)))


def _experts_size(inter: int) -> int:
    """Bytes of one MoE layer's routed experts at moe_intermediate_size ``inter``: per expert, gate/up/down
    each hold inter*HIDDEN FP4 values (half a byte), one FP8 scale per 16 of them and two float32 scalars."""
    return EXPERTS * 3 * (inter * HIDDEN // 2 + inter * HIDDEN // GROUP + 8)


def _layer(seed: int, layer: int, inter: int) -> dict[str, tuple[str, list[int], bytes]]:
    """One decoder layer: BF16 MLA attention with the DSA indexer, a BF16 router, NVFP4 routed experts."""
    p = f"model.layers.{layer}"
    t: dict[str, tuple[str, list[int], bytes]] = {}

    def bf16(name: str, shape: list[int], fill: float | None = None) -> None:
        n = 1
        for d in shape:
            n *= d
        t[name] = ("bfloat16", shape, _bf16(seed, name, n, fill))

    bf16(f"{p}.input_layernorm.weight", [HIDDEN], 1.0)
    bf16(f"{p}.post_attention_layernorm.weight", [HIDDEN], 1.0)
    bf16(f"{p}.self_attn.q_a_proj.weight", [Q_LORA, HIDDEN])
    bf16(f"{p}.self_attn.q_a_layernorm.weight", [Q_LORA], 1.0)
    bf16(f"{p}.self_attn.q_b_proj.weight", [HEADS * (NOPE + ROPE), Q_LORA])
    bf16(f"{p}.self_attn.kv_a_proj_with_mqa.weight", [KV_LORA + ROPE, HIDDEN])
    bf16(f"{p}.self_attn.kv_a_layernorm.weight", [KV_LORA], 1.0)
    bf16(f"{p}.self_attn.kv_b_proj.weight", [HEADS * (NOPE + V_HEAD), KV_LORA])
    bf16(f"{p}.self_attn.o_proj.weight", [HIDDEN, HEADS * V_HEAD])
    bf16(f"{p}.self_attn.indexer.wq_b.weight", [INDEX_HEADS * INDEX_DIM, Q_LORA])
    bf16(f"{p}.self_attn.indexer.wk.weight", [INDEX_DIM, HIDDEN])
    bf16(f"{p}.self_attn.indexer.k_norm.weight", [INDEX_DIM], 1.0)
    bf16(f"{p}.self_attn.indexer.weights_proj.weight", [INDEX_HEADS, HIDDEN])
    bf16(f"{p}.mlp.gate.weight", [EXPERTS, HIDDEN])
    t[f"{p}.mlp.gate.e_score_correction_bias"] = ("float32", [EXPERTS], struct.pack("<f", 0.0) * EXPERTS)
    for e in range(EXPERTS):
        for proj, out_f, in_f in (("gate_proj", inter, HIDDEN), ("up_proj", inter, HIDDEN),
                                  ("down_proj", HIDDEN, inter)):
            q = f"{p}.mlp.experts.{e}.{proj}"
            t[f"{q}.weight"] = ("uint8", [out_f, in_f // 2], _stream(seed, f"{q}.weight", out_f * in_f // 2))
            t[f"{q}.weight_scale"] = ("float8_e4m3fn", [out_f, in_f // GROUP],
                                      _fp8_scales(seed, f"{q}.weight_scale", out_f * in_f // GROUP))
            t[f"{q}.weight_scale_2"] = ("float32", [], struct.pack("<f", 1.0 / (448.0 * 6.0)))
            t[f"{q}.input_scale"] = ("float32", [], struct.pack("<f", 1.0 / (448.0 * 6.0)))
    return t


def _write_shard(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    buffers, specs = [], {}
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        assert len(data) == DTYPES[dtype] * max(1, _count(shape)), name
        buf = (ctypes.c_char * max(1, len(data))).from_buffer(bytearray(data or b"\0"))
        buffers.append(buf)  # kept alive until serialize_file returns (TensorSpec holds a raw pointer)
        specs[name] = safetensors.TensorSpec(dtype=dtype, shape=shape, data_ptr=ctypes.addressof(buf),
                                             data_len=len(data))
    safetensors.serialize_file(specs, str(path), metadata={"format": "pt"})
    del buffers


def _count(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def make(folder: str | os.PathLike[str], shards: int = 3, shard_bytes: int = 64 * 1024, seed: int = 0) -> dict:
    """Write the checkpoint into ``folder`` (created; files of the same names replaced).

    Each shard holds one decoder layer (so ``num_hidden_layers == shards``; the first also the embedding,
    the last the final norm and lm_head) and comes out near ``shard_bytes``: moe_intermediate_size is picked
    (a multiple of 16, the NVFP4 block) so the routed experts fill what the rest leaves. Returns {"files": {name: size},
    "commit": commit_of(folder), "shards": [...], "config": config}."""
    if shards < 1:
        raise ValueError("shards must be at least 1")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    probe = _layer(seed, 0, GROUP)
    fixed = sum(len(d) for _, _, d in probe.values()) - _experts_size(GROUP)
    header = sum(len(n) + 64 for n in probe) + 40   # the safetensors JSON header, roughly
    edges = (2 * VOCAB * HIDDEN * 2 + HIDDEN * 2 + 200) // shards  # embed, lm_head, final norm: shared out
    per_step = _experts_size(2 * GROUP) - _experts_size(GROUP)  # bytes per GROUP more of moe_intermediate
    inter = max(GROUP, GROUP * ((shard_bytes - fixed - header - edges - _experts_size(0)) // per_step))

    names = [f"model-{k:05d}-of-{shards:05d}.safetensors" for k in range(1, shards + 1)]
    weight_map: dict[str, str] = {}
    total_size = total_params = 0
    for k, name in enumerate(names):
        tensors = _layer(seed, k, inter)
        if k == 0:
            tensors["model.embed_tokens.weight"] = ("bfloat16", [VOCAB, HIDDEN],
                                                    _bf16(seed, "model.embed_tokens.weight", VOCAB * HIDDEN))
        if k == shards - 1:
            tensors["model.norm.weight"] = ("bfloat16", [HIDDEN], _bf16(seed, "model.norm.weight", HIDDEN, 1.0))
            tensors["lm_head.weight"] = ("bfloat16", [VOCAB, HIDDEN], _bf16(seed, "lm_head.weight", VOCAB * HIDDEN))
        _write_shard(out / name, tensors)
        for tname, (_, shape, data) in tensors.items():
            weight_map[tname] = name
            total_size += len(data)
            total_params += _count(shape)
    _json(out / "model.safetensors.index.json",
          {"metadata": {"total_parameters": total_params, "total_size": total_size}, "weight_map": weight_map})

    exclude = ["lm_head", "model.embed_tokens", "model.layers.*.self_attn*", "model.layers.*.mlp.gate"]
    producer = {"name": "modelopt", "version": MODELOPT_VERSION}
    group = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": GROUP}
    config = {
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 0,
        "eos_token_id": [1, 2],
        "pad_token_id": 1,
        "dtype": "bfloat16",
        "first_k_dense_replace": 0,      # GLM-5: 3 dense layers first; every toy layer is MoE
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "index_head_dim": INDEX_DIM,
        "index_n_heads": INDEX_HEADS,
        "index_topk": 16,
        "initializer_range": 0.02,
        "intermediate_size": 2 * inter,
        "kv_lora_rank": KV_LORA,
        "max_position_embeddings": 4096,
        "mlp_layer_types": ["sparse"] * shards,
        "moe_intermediate_size": inter,
        "n_group": 1,
        "n_routed_experts": EXPERTS,
        "n_shared_experts": 0,
        "norm_topk_prob": True,
        "num_attention_heads": HEADS,
        "num_experts_per_tok": TOPK,
        "num_hidden_layers": shards,
        "num_key_value_heads": HEADS,
        "num_nextn_predict_layers": 0,
        "q_lora_rank": Q_LORA,
        "qk_nope_head_dim": NOPE,
        "qk_rope_head_dim": ROPE,
        "rms_norm_eps": 1e-05,
        "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "tie_word_embeddings": False,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "transformers_version": "5.2.0",
        "use_cache": True,
        "v_head_dim": V_HEAD,
        "vocab_size": VOCAB,
        "quantization_config": {
            "config_groups": {"group_0": {"input_activations": dict(group), "weights": dict(group),
                                          "targets": ["Linear"]}},
            "ignore": exclude,
            "producer": producer,
            "quant_algo": "NVFP4",
            "quant_method": "modelopt",
        },
    }
    _json(out / "config.json", config)
    _json(out / "hf_quant_config.json", {"producer": producer, "quantization": {
        "quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": GROUP, "exclude_modules": exclude}})
    _json(out / "generation_config.json", {"bos_token_id": 0, "do_sample": True, "eos_token_id": [1, 2],
                                           "pad_token_id": 1, "temperature": 1.0, "top_p": 0.95,
                                           "transformers_version": "5.2.0"})
    (out / "tokenizer.json").write_text("{}\n", encoding="utf-8")
    files = sorted(["config.json", "generation_config.json", "hf_quant_config.json", "tokenizer.json",
                    "model.safetensors.index.json", *names])
    return {"files": {n: (out / n).stat().st_size for n in files}, "commit": commit_of(out),
            "shards": names, "config": config}
