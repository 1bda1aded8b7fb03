"""The lab's checkpoint: a tiny GLM-5-NVFP4 look-alike made with the real safetensors library (three
shards, their index as transformers writes it, a config.json with GLM-5's architecture and ModelOpt's
NVFP4 keys), so that the model stage's verify reads real headers and the stand-in server finds its
config.json. The same bytes on every machine: the tests can damage one shard and expect its name."""

from __future__ import annotations

import json
from functools import cache

SHARDS = 3
CONFIG = {
    "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa",
    # The keys ModelOpt's NVFP4 export writes into config.json (quant_method, quant_algo), as
    # lukealonso/GLM-5-NVFP4's card says it was made with NVIDIA Model Optimizer.
    "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16},
}


def shard_name(k: int) -> str:
    return f"model-{k:05d}-of-{SHARDS:05d}.safetensors"


@cache
def files() -> dict[str, bytes]:
    """Every file of the checkpoint, by name."""
    import numpy as np
    from safetensors.numpy import save

    out: dict[str, bytes] = {}
    weight_map: dict[str, str] = {}
    total = 0
    for k in range(1, SHARDS + 1):
        tensors = {
            f"model.layers.{k}.mlp.experts.0.gate_proj.weight": np.full((256, 128), k, dtype=np.uint8),
            f"model.layers.{k}.mlp.experts.0.gate_proj.weight_scale": np.full((256, 8), k, dtype=np.uint8),
            f"model.layers.{k}.input_layernorm.weight": np.arange(256, dtype=np.float32),
        }
        out[shard_name(k)] = save(tensors, metadata={"format": "pt"})
        weight_map.update({name: shard_name(k) for name in tensors})
        total += sum(t.nbytes for t in tensors.values())
    out["model.safetensors.index.json"] = (json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                      indent=2, sort_keys=True) + "\n").encode()
    out["config.json"] = (json.dumps(CONFIG, indent=2) + "\n").encode()
    out["tokenizer.json"] = b"{}\n"
    return out
