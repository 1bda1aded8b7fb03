"""The roofline arithmetic for GLM-5-NVFP4 at TP8 on RTX PRO 6000 Blackwell (module docstring)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from gpunode.bench import roofline
from gpunode.bench.roofline import ModelShape, compute, describe

P2P_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "p2p" / "p2p.json"


def test_glm5_parameter_counts() -> None:
    shape = ModelShape()
    assert shape.attn_replicated_params == 16_121_856 + 9_371_648
    assert shape.attn_split_params == 33_554_432 + 14_680_064 + 100_663_296
    assert shape.expert_params == 37_748_736
    assert shape.moe_layers == 75
    # GLM-5 is "744B total, 40B active": the active count comes out at 40.8 B.
    assert shape.active_params == 40_831_942_656


def test_bytes_per_gpu_and_ceiling() -> None:
    r = compute()
    assert r.bytes_per_gpu == {"attention_replicated": 3.977, "attention_split": 2.9035, "experts": 1.7916,
                               "router": 0.2359, "dense_mlp": 0.1699, "lm_head": 0.2379, "kv_cache": 0.0}
    assert r.gb_per_gpu == pytest.approx(9.3158)
    assert r.weights_ms == pytest.approx(5.199) and r.ceiling_tok_s == 192.4
    # Every weight split 8 ways: what the seeds' 309 tok/s is close to (3 %).
    assert r.gb_per_gpu_ideal == pytest.approx(5.6295) and r.ceiling_tok_s_ideal == 318.3
    assert abs(r.ceiling_tok_s_ideal / roofline.SEEDS_CEILING_TOK_S - 1) < 0.04
    assert r.allreduces_per_token == 156 and r.allreduce_ms is None
    assert r.seeds_allreduce_ms == pytest.approx(2.028)


def test_allreduce_floor_from_a_given_latency() -> None:
    r = compute(allreduce_us=13.0)
    assert r.allreduce_ms == pytest.approx(2.028) and r.allreduce_only_tok_s == 493.1
    assert r.combined_ms == pytest.approx(7.227) and r.combined_tok_s == 138.4
    text = "\n".join(describe(r))
    assert "156 all-reduces/token x 13.00 us (given) = 2.03 ms/token" in text and "**138 tok/s**" in text


def test_allreduce_floor_from_a_p2p_document() -> None:
    recorded: dict[str, Any] = json.loads(P2P_FIXTURE.read_text())
    one_gpu = compute(p2p=recorded)  # the H200 recording has no pair
    assert one_gpu.allreduce_us is None and one_gpu.p2p_hop_us is None
    assert any("no measured pair" in note for note in one_gpu.notes)
    assert "not computed" in "\n".join(describe(one_gpu))
    # The same document with two pairs at the public RTX PRO 6000 P2P latencies (FIELD-NOTES s1).
    paired = copy.deepcopy(recorded)
    paired["measurements"]["pairs"] = [{"src": 0, "dst": 1, "latency": {"median_us": 0.36}},
                                       {"src": 1, "dst": 0, "latency": {"median_us": 0.45}},
                                       {"src": 0, "dst": 2, "latency": None}]
    r = compute(p2p=paired)
    assert r.p2p_hop_us == 0.45 and r.allreduce_us == pytest.approx(6.3)  # 2 x 7 hops x the slowest pair
    assert r.allreduce_ms == pytest.approx(0.983) and "ring floor" in r.allreduce_source
    assert compute(p2p=paired, allreduce_us=13.0).allreduce_source == "given"  # a given latency wins


def test_measured_gap_and_overrides() -> None:
    r = compute(allreduce_us=13.0, measured_tok_s=10.4, measured_source="c=1")
    assert r.gap() == pytest.approx(138.4 / 10.4)
    assert "**13.3x** below the ceiling" in "\n".join(describe(r))
    faster = compute(bandwidth_gbps=3584.0)
    assert faster.ceiling_tok_s == pytest.approx(2 * 192.4, abs=0.2)
    bf16_shared = compute(ModelShape(shared_expert_bytes=2.0))
    assert bf16_shared.gb_per_gpu - compute().gb_per_gpu == pytest.approx(0.509, abs=0.001)
    assert compute(tp=1).allreduces_per_token == 0
    stand_in = compute(measured_tok_s=500.0, measured_source="c=1")
    assert "above the computed ceiling" in "\n".join(describe(stand_in))


def test_kv_cache_at_benchmark_context() -> None:
    r = compute(context_tokens=320)
    assert r.bytes_per_gpu["kv_cache"] == pytest.approx(0.032, abs=0.0005)  # 78 x 320 x (1152 + 132) B
    # DSA attends to at most 2048 latents; the indexer still reads every key.
    long = compute(context_tokens=100_000)
    assert long.bytes_per_gpu["kv_cache"] == pytest.approx(78 * (2048 * 1152 + 100_000 * 132) / 1e9, abs=1e-4)


def test_load_p2p_rejects_other_json(tmp_path: Path) -> None:
    other = tmp_path / "x.json"
    other.write_text("[1, 2]")
    with pytest.raises(ValueError):
        roofline.load_p2p(other)
    assert roofline.load_p2p(P2P_FIXTURE)["schema"]
