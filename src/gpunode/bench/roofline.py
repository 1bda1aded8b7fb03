"""The single-stream decode ceiling and the all-reduce latency floor, so the gap to the hardware is a
number.

One decode step of one stream (batch 1) must at least (a) read every weight the token touches from
each GPU's memory, and (b) wait for the tensor-parallel all-reduces, which are serial with the
layers. Both are lower bounds on the time per token; anything else (kernel launches, the Python
scheduler, sampling, attention over the context) comes on top.

The model (GLM-5, config.json of zai-org/GLM-5; FIELD-NOTES s4 for the expert numbers):
78 layers, hidden 6144, 3 dense layers (first_k_dense_replace, intermediate 12288) then 75 MoE
layers of 256 routed experts + 1 shared, 8 routed per token, moe_intermediate 2048; MLA attention
with 64 heads, q_lora_rank 2048, kv_lora_rank 512, qk_nope 192, qk_rope 64, v_head 256; the DSA
indexer with 32 heads of 128; vocabulary 154880.

Per layer, parameters a token touches:

- MLA attention, 174,391,296:
  fused q_a + kv_a (+ k_rope) projection  6144 x (2048 + 512 + 64)   =  16,121,856
  q_b                                     2048 x 64 x (192 + 64)     =  33,554,432
  kv_b                                     512 x 64 x (192 + 256)    =  14,680,064
  o_proj                                    64 x 256 x 6144          = 100,663,296
  indexer wq_b + wk + weights_proj   2048x32x128 + 6144x128 + 6144x32 =   9,371,648
- MoE layer: (8 routed + 1 shared) x 3 x 6144 x 2048 = 9 x 37,748,736 = 339,738,624, and the
  router 6144 x 256 = 1,572,864;
- dense layer MLP: 3 x 6144 x 12288 = 226,492,416;
- once per token: lm_head 154880 x 6144 = 951,582,720 (the embedding reads one row: nothing).

That is 13.60 B (attention) + 25.60 B (MoE incl. router) + 0.68 B (dense MLP) + 0.95 B (lm_head)
= 40.8 B active parameters, GLM-5's "40B active".

Bytes: lukealonso/GLM-5-NVFP4 quantises the expert MLPs to NVFP4: 4-bit values plus one FP8 scale
per 16 = 4.5 bits = 0.5625 bytes/parameter (the per-tensor FP32 scale is negligible). Attention,
router, dense MLP and lm_head stay BF16, 2 bytes. (Whether the shared expert is NVFP4 is not stated
for GLM-5: the brief and FIELD-NOTES count it with the experts; BF16 would add 0.51 GB per GPU.)

Sharding at TP8, as sglang's DeepSeek-V2/V3.2 code does it: q_b, kv_b (column) and o_proj (row) are
split 8 ways, but the fused q_a/kv_a projection (``fused_qkv_a_proj_with_mqa``) and the NSA indexer's
projections are ``ReplicatedLinear``: every GPU reads them whole, every token. MoE at TP (no expert
parallelism) splits every expert's intermediate dimension 8 ways; the router is replicated; the
vocabulary-parallel lm_head is split. Per GPU and token:

  replicated attention  (16,121,856 + 9,371,648) x 2 B x 78           = 3.977 GB
  split attention       (33,554,432 + 14,680,064 + 100,663,296) x 2/8 x 78 = 2.903 GB
  experts               339,738,624 x 0.5625 / 8 x 75                  = 1.792 GB
  router                1,572,864 x 2 x 75                             = 0.236 GB
  dense MLP             226,492,416 x 2 / 8 x 3                        = 0.170 GB
  lm_head               951,582,720 x 2 / 8                            = 0.238 GB
                                                                total    9.316 GB

At 1792 GB/s (RTX PRO 6000 Blackwell): 9.316 / 1792 = 5.20 ms -> 192 tok/s. If every weight were
split 8 ways (what a plain "active bytes / 8" estimate assumes) it is 5.630 GB -> 3.14 ms -> 318 tok/s;
the seeds' 309 tok/s is that kind of estimate (within 3 %). The replicated MLA/indexer projections
alone cost 40 % of the per-GPU bytes: the honest ceiling is ~190 tok/s, not ~310.

The KV cache read per token is small at benchmark contexts and is added for the context given:
MLA keeps one latent of (512 + 64) BF16 values per token and layer, replicated on every rank; DSA
attends to at most index_topk = 2048 of them, and the indexer reads its FP8 key (128 B + a 4 B
scale) for every context token: at 320 tokens, 78 x 320 x (1152 + 132) B = 32 MB, 0.3 %.

All-reduce floor: at TP8 each layer all-reduces twice (after attention's o_proj and after the
MLP/MoE), 2 x 78 = 156 per token, each serial with the layers. With the seeds' ~13 us per
collective: 156 x 13 us = 2.03 ms per token -> 493 tok/s from all-reduces alone. From a measured
P2P copy latency instead: a ring all-reduce is 2 x (N - 1) = 14 hops at N = 8, each at least one
P2P latency (the slowest pair's, since the ring waits on it): at the public 0.36-0.45 us that is
5.0-6.3 us per all-reduce, 0.79-0.98 ms per token; NCCL's own launch and synchronisation make the
seeds' 13 us. Weights and all-reduces are serial in a decode step: 5.20 + 2.03 = 7.23 ms ->
138 tok/s is the single-stream ceiling with both. The seeds measured 10-11 tok/s, ~95 ms per token:
13x the ceiling. The all-reduce floor explains ~2 ms of those 95, so it is not the cause the seeds
gave; the profile's ``--disable-cuda-graph`` (every one of the thousands of kernels per token
launched from Python) is the first suspect.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

NVFP4_BYTES = 4.5 / 8  # 4-bit values + one FP8 scale per 16 values
BF16_BYTES = 2.0
RTX_PRO_6000_GBPS = 1792.0  # RTX PRO 6000 Blackwell: 512-bit GDDR7 at 28 Gbps
SEEDS_CEILING_TOK_S = 309.0  # FIELD-NOTES s5
SEEDS_ALLREDUCE_US = 13.0  # FIELD-NOTES s5: "~13 us per collective"
ALLREDUCES_PER_LAYER = 2


@dataclass(frozen=True)
class ModelShape:
    """GLM-5 (zai-org/GLM-5 config.json) as lukealonso/GLM-5-NVFP4 stores it."""

    name: str = "GLM-5-NVFP4"
    layers: int = 78
    dense_layers: int = 3  # first_k_dense_replace
    hidden: int = 6144
    dense_intermediate: int = 12288
    routed_experts: int = 256
    shared_experts: int = 1
    experts_per_token: int = 8
    moe_intermediate: int = 2048
    heads: int = 64
    q_lora_rank: int = 2048
    kv_lora_rank: int = 512
    qk_nope_dim: int = 192
    qk_rope_dim: int = 64
    v_head_dim: int = 256
    index_heads: int = 32
    index_head_dim: int = 128
    index_topk: int = 2048
    vocab: int = 154880
    expert_bytes: float = NVFP4_BYTES
    shared_expert_bytes: float = NVFP4_BYTES
    dense_bytes: float = BF16_BYTES  # attention, router, dense MLP, lm_head
    kv_bytes: float = BF16_BYTES  # --kv-cache-dtype bf16 (the profile)

    # parameter counts, per layer unless said otherwise
    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers

    @property
    def attn_replicated_params(self) -> int:
        fused_a = self.hidden * (self.q_lora_rank + self.kv_lora_rank + self.qk_rope_dim)
        indexer = (self.q_lora_rank * self.index_heads * self.index_head_dim + self.hidden * self.index_head_dim
                   + self.hidden * self.index_heads)
        return fused_a + indexer

    @property
    def attn_split_params(self) -> int:
        q_b = self.q_lora_rank * self.heads * (self.qk_nope_dim + self.qk_rope_dim)
        kv_b = self.kv_lora_rank * self.heads * (self.qk_nope_dim + self.v_head_dim)
        o_proj = self.heads * self.v_head_dim * self.hidden
        return q_b + kv_b + o_proj

    @property
    def expert_params(self) -> int:
        return 3 * self.hidden * self.moe_intermediate  # gate, up, down

    @property
    def router_params(self) -> int:
        return self.hidden * self.routed_experts

    @property
    def dense_mlp_params(self) -> int:
        return 3 * self.hidden * self.dense_intermediate

    @property
    def lm_head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def active_params(self) -> int:
        attention = (self.attn_replicated_params + self.attn_split_params) * self.layers
        moe = ((self.experts_per_token + self.shared_experts) * self.expert_params + self.router_params) * self.moe_layers
        return attention + moe + self.dense_mlp_params * self.dense_layers + self.lm_head_params


@dataclass
class Roofline:
    model: str
    tp: int
    bandwidth_gbps: float
    context_tokens: int
    active_params: int
    bytes_per_gpu: dict[str, float]  # component -> GB read per token per GPU (sglang's sharding)
    gb_per_gpu: float
    gb_per_gpu_ideal: float  # every weight split tp ways
    weights_ms: float
    weights_ms_ideal: float
    ceiling_tok_s: float
    ceiling_tok_s_ideal: float
    seeds_ceiling_tok_s: float = SEEDS_CEILING_TOK_S
    allreduces_per_token: int = 0
    allreduce_us: float | None = None
    allreduce_source: str = ""
    allreduce_ms: float | None = None
    allreduce_only_tok_s: float | None = None
    combined_ms: float | None = None
    combined_tok_s: float | None = None
    seeds_allreduce_ms: float = 0.0
    p2p_hop_us: float | None = None
    measured_tok_s: float | None = None  # single stream, from the sweep's concurrency-1 level
    measured_source: str = ""
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def gap(self) -> float | None:
        """How many times slower than the ceiling (with all-reduces when known) the measurement is."""
        ceiling = self.combined_tok_s or self.ceiling_tok_s
        if not self.measured_tok_s or not ceiling:
            return None
        return ceiling / self.measured_tok_s


def ring_allreduce_us(hop_us: float, gpus: int) -> float:
    """Lower bound of a ring all-reduce of a small message: 2 (N - 1) sequential hops."""
    return 2 * (gpus - 1) * hop_us


def p2p_hop_latency_us(p2p: dict[str, Any]) -> float | None:
    """The slowest pair's P2P copy latency (median, us) in a ``gpunode p2p --json`` document, or None
    when it has no pair (one GPU) or no pair was measured."""
    pairs = (p2p.get("measurements") or {}).get("pairs") or []
    values = [float(pair["latency"]["median_us"]) for pair in pairs
              if isinstance(pair, dict) and isinstance(pair.get("latency"), dict)
              and isinstance(pair["latency"].get("median_us"), (int, float))]
    return max(values) if values else None


def load_p2p(path: str | Path) -> dict[str, Any]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or "measurements" not in data:
        raise ValueError(f"{path}: not a 'gpunode p2p --json' document")
    return data


def compute(shape: ModelShape = ModelShape(), *, tp: int = 8, bandwidth_gbps: float = RTX_PRO_6000_GBPS,
            context_tokens: int = 0, allreduce_us: float | None = None, p2p: dict[str, Any] | None = None,
            measured_tok_s: float | None = None, measured_source: str = "") -> Roofline:
    """The arithmetic of the module docstring for ``shape`` at ``tp``; ``allreduce_us`` wins over a
    P2P document's latency; with neither, the all-reduce floor is left out (the seeds' is shown)."""
    gb = 1e9
    s = shape
    ctx_read = min(context_tokens, s.index_topk)
    parts = {
        "attention_replicated": s.attn_replicated_params * s.dense_bytes * s.layers / gb,
        "attention_split": s.attn_split_params * s.dense_bytes / tp * s.layers / gb,
        "experts": (s.experts_per_token * s.expert_params * s.expert_bytes
                    + s.shared_experts * s.expert_params * s.shared_expert_bytes) / tp * s.moe_layers / gb,
        "router": s.router_params * s.dense_bytes * s.moe_layers / gb,
        "dense_mlp": s.dense_mlp_params * s.dense_bytes / tp * s.dense_layers / gb,
        "lm_head": s.lm_head_params * s.dense_bytes / tp / gb,
        # MLA latent (replicated per rank) for the attended tokens + the indexer's FP8 keys for all.
        "kv_cache": s.layers * (ctx_read * (s.kv_lora_rank + s.qk_rope_dim) * s.kv_bytes
                                + context_tokens * (s.index_head_dim + 4)) / gb,
    }
    total = sum(parts.values())
    ideal = total - parts["attention_replicated"] - parts["router"] + (
        parts["attention_replicated"] + parts["router"]) / tp
    weights_ms = total / bandwidth_gbps * 1000
    ideal_ms = ideal / bandwidth_gbps * 1000
    result = Roofline(model=s.name, tp=tp, bandwidth_gbps=bandwidth_gbps, context_tokens=context_tokens,
                      active_params=s.active_params, bytes_per_gpu={k: round(v, 4) for k, v in parts.items()},
                      gb_per_gpu=round(total, 4), gb_per_gpu_ideal=round(ideal, 4), weights_ms=round(weights_ms, 3),
                      weights_ms_ideal=round(ideal_ms, 3), ceiling_tok_s=round(1000 / weights_ms, 1),
                      ceiling_tok_s_ideal=round(1000 / ideal_ms, 1))
    result.allreduces_per_token = ALLREDUCES_PER_LAYER * s.layers if tp > 1 else 0
    result.seeds_allreduce_ms = round(result.allreduces_per_token * SEEDS_ALLREDUCE_US / 1000, 3)
    hop = p2p_hop_latency_us(p2p) if p2p is not None else None
    result.p2p_hop_us = None if hop is None else round(hop, 3)
    if allreduce_us is not None:
        result.allreduce_us, result.allreduce_source = float(allreduce_us), "given"
    elif hop is not None:
        result.allreduce_us = round(ring_allreduce_us(hop, tp), 3)
        result.allreduce_source = (f"ring floor from the P2P latency: 2 x ({tp} - 1) hops x {hop:.2f} us "
                                   "(slowest measured pair)")
    elif p2p is not None:
        result.notes.append("the P2P document has no measured pair (one GPU?): no all-reduce latency from it")
    if result.allreduce_us is not None and result.allreduces_per_token:
        result.allreduce_ms = round(result.allreduces_per_token * result.allreduce_us / 1000, 3)
        result.allreduce_only_tok_s = round(1000 / result.allreduce_ms, 1)
        result.combined_ms = round(weights_ms + result.allreduce_ms, 3)
        result.combined_tok_s = round(1000 / result.combined_ms, 1)
    if measured_tok_s:
        result.measured_tok_s = round(measured_tok_s, 2)
        result.measured_source = measured_source
    return result


def describe(r: Roofline) -> list[str]:
    """The report's roofline lines."""
    lines = [
        f"Weights read per token per GPU at TP{r.tp}: {r.gb_per_gpu:.2f} GB as sglang shards {r.model} "
        f"(replicated MLA/indexer projections {r.bytes_per_gpu['attention_replicated']:.2f} GB), "
        f"{r.gb_per_gpu_ideal:.2f} GB if every weight were split {r.tp} ways; {r.active_params / 1e9:.1f} B "
        "active parameters.",
        f"Memory-bandwidth ceiling, single stream, at {r.bandwidth_gbps:.0f} GB/s: {r.weights_ms:.2f} ms/token = "
        f"**{r.ceiling_tok_s:.0f} tok/s** ({r.ceiling_tok_s_ideal:.0f} tok/s fully split; the seeds computed "
        f"{r.seeds_ceiling_tok_s:.0f}).",
    ]
    if r.allreduce_ms is not None:
        lines.append(
            f"All-reduce floor: {r.allreduces_per_token} all-reduces/token x {r.allreduce_us:.2f} us "
            f"({r.allreduce_source}) = {r.allreduce_ms:.2f} ms/token ({r.allreduce_only_tok_s:.0f} tok/s alone); "
            f"with the weights, serial: {r.combined_ms:.2f} ms = **{r.combined_tok_s:.0f} tok/s**.")
    else:
        lines.append(
            f"All-reduce floor: not computed (give an all-reduce latency or a `gpunode p2p --json` file with "
            f"pairs); with the seeds' ~{SEEDS_ALLREDUCE_US:.0f} us per collective it would be "
            f"{r.allreduces_per_token} x {SEEDS_ALLREDUCE_US:.0f} us = {r.seeds_allreduce_ms:.2f} ms/token.")
    lines.extend(r.notes)
    gap = r.gap()
    if r.measured_tok_s and gap is not None and gap < 1:
        lines.append(f"Measured single stream: {r.measured_tok_s:.1f} tok/s ({r.measured_source}), above the "
                     f"computed ceiling: this server is not {r.model} on the hardware computed here (a stand-in?).")
    elif r.measured_tok_s and gap is not None:
        lines.append(f"Measured single stream: {r.measured_tok_s:.1f} tok/s ({r.measured_source}): "
                     f"**{gap:.1f}x** below the ceiling ({1000 / r.measured_tok_s:.1f} ms/token against "
                     f"{r.combined_ms if r.combined_ms is not None else r.weights_ms:.2f} ms).")
    return lines
