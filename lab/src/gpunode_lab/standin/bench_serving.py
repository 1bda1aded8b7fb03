#!/usr/bin/env python3
"""A stand-in for ``python3 -m sglang.bench_serving`` (sglang 0.5.9), standard library only.

It takes the same arguments, really sends ``--num-prompts`` streamed requests to the server's
native ``/generate`` (``--backend sglang``: bench_serving.py async_request_sglang_generate) with at
most ``--max-concurrency`` in flight, and appends to ``--output-file`` one JSON line with the field
names bench_serving.py's benchmark() writes (its ``result`` dict: arguments, ``server_info`` from
``/get_server_info``, then the metrics). Like the real one, a warm-up request comes first and a
failed warm-up raises "Warmup failed ..." with no line written; the API key comes from
OPENAI_API_KEY (bench_serving.py get_auth_headers). A --tokenizer path that does not exist fails
as loading a tokenizer from it would.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Output:
    success: bool = False
    ttft: float = 0.0
    latency: float = 0.0
    output_len: int = 0
    prompt_len: int = 0
    itl: list[float] = field(default_factory=list)
    start_time: float = 0.0
    error: str = ""


def auth_headers() -> dict[str, str]:
    key = os.environ.get("OPENAI_API_KEY")
    if key:
        return {"Authorization": f"Bearer {key}"}
    plain = os.environ.get("API_KEY")
    return {"Authorization": plain} if plain else {}


def one_request(url: str, input_ids: list[int], output_len: int) -> Output:
    out = Output(prompt_len=len(input_ids))
    body = json.dumps({"input_ids": input_ids,
                       "sampling_params": {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True},
                       "stream": True, "lora_path": None, "return_logprob": False, "return_routed_experts": False,
                       "logprob_start_len": -1}).encode()
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"content-type": "application/json", **auth_headers()})
    st = time.perf_counter()
    out.start_time = st
    recent = st
    last_len = 0
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            for raw in response:
                chunk = raw.strip().decode()
                if not chunk:
                    continue
                chunk = chunk.removeprefix("data: ")
                latency = time.perf_counter() - st
                if chunk == "[DONE]":
                    continue
                data = json.loads(chunk)
                if data.get("text"):
                    now = time.perf_counter()
                    out.output_len = data["meta_info"]["completion_tokens"]
                    if out.ttft == 0.0:
                        out.ttft = now - st
                    else:
                        new = out.output_len - last_len
                        if new == 0:
                            continue
                        out.itl.extend([(now - recent) / new] * new)
                    recent = now
                    last_len = out.output_len
            out.success = True
            out.latency = latency
    except (urllib.error.URLError, OSError, ValueError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, urllib.error.HTTPError):
            out.error = f"{exc.reason}: {exc.read().decode(errors='replace')}"
    return out


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def metrics(outputs: list[Output], duration: float) -> dict[str, Any]:
    """bench_serving.py calculate_metrics, for what the JSON line carries (ms, tok/s)."""
    ok = [o for o in outputs if o.success]
    ttfts = [o.ttft * 1000 for o in ok]
    e2e = [o.latency * 1000 for o in ok]
    itls = [x * 1000 for o in ok for x in o.itl]
    tpots = [(o.latency - o.ttft) / (o.output_len - 1) * 1000 for o in ok if o.output_len > 1]
    total_in = sum(o.prompt_len for o in ok)
    total_out = sum(o.output_len for o in ok)

    def mean(v: list[float]) -> float:
        return statistics.fmean(v) if v else 0.0

    def std(v: list[float]) -> float:
        return statistics.pstdev(v) if v else 0.0

    return {
        "duration": duration, "completed": len(ok), "total_input_tokens": total_in,
        "total_input_text_tokens": total_in, "total_input_vision_tokens": 0, "total_output_tokens": total_out,
        "total_output_tokens_retokenized": total_out, "request_throughput": len(ok) / duration,
        "input_throughput": total_in / duration, "output_throughput": total_out / duration,
        "total_throughput": (total_in + total_out) / duration,
        "mean_e2e_latency_ms": mean(e2e), "median_e2e_latency_ms": statistics.median(e2e) if e2e else 0.0,
        "std_e2e_latency_ms": std(e2e), "p90_e2e_latency_ms": pct(e2e, 90), "p99_e2e_latency_ms": pct(e2e, 99),
        "mean_ttft_ms": mean(ttfts), "median_ttft_ms": statistics.median(ttfts) if ttfts else 0.0,
        "std_ttft_ms": std(ttfts), "p99_ttft_ms": pct(ttfts, 99),
        "mean_tpot_ms": mean(tpots), "median_tpot_ms": statistics.median(tpots) if tpots else 0.0,
        "std_tpot_ms": std(tpots), "p99_tpot_ms": pct(tpots, 99),
        "mean_itl_ms": mean(itls), "median_itl_ms": statistics.median(itls) if itls else 0.0,
        "std_itl_ms": std(itls), "p95_itl_ms": pct(itls, 95), "p99_itl_ms": pct(itls, 99),
        "concurrency": sum(e2e) / 1000 / duration, "accept_length": None,
        "max_output_tokens_per_s": total_out / duration, "max_concurrent_requests": 0,
    }


def server_info(base_url: str) -> Any:
    try:
        request = urllib.request.Request(base_url + "/get_server_info", headers=auth_headers())
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="sglang")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model")
    parser.add_argument("--tokenizer")
    parser.add_argument("--dataset-name", default="sharegpt")
    parser.add_argument("--random-input-len", type=int, default=1024)
    parser.add_argument("--random-output-len", type=int, default=1024)
    parser.add_argument("--random-range-ratio", type=float, default=0.0)
    parser.add_argument("--num-prompts", type=int, default=1000)
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument("--request-rate", default="inf")
    parser.add_argument("--output-file", default=None)
    parser.add_argument("--warmup-requests", type=int, default=1)
    args, _unknown = parser.parse_known_args(argv)
    if args.backend != "sglang" or args.dataset_name != "random-ids":
        print("fake bench_serving: only --backend sglang --dataset-name random-ids", file=sys.stderr)
        return 2
    if args.tokenizer and not os.path.isdir(args.tokenizer):
        raise OSError(f"Can't load tokenizer for '{args.tokenizer}'.")
    url = args.base_url.rstrip("/") + "/generate"
    rng = random.Random(1)
    # bench_serving.py:1528-1533: each length uniform in [max(int(N * ratio), 1), N], inputs drawn
    # first (numpy's generator there, Python's here: the same distribution, other values).
    input_lens = [rng.randint(max(int(args.random_input_len * args.random_range_ratio), 1), args.random_input_len)
                  for _ in range(args.num_prompts)]
    output_lens = [rng.randint(max(int(args.random_output_len * args.random_range_ratio), 1), args.random_output_len)
                   for _ in range(args.num_prompts)]
    prompts = [[rng.randrange(100, 150000) for _ in range(length)] for length in input_lens]
    print(f"Starting warmup with {args.warmup_requests} sequences...")
    warm = [one_request(url, prompts[0], min(output_lens[0], 32)) for _ in range(args.warmup_requests)]
    if args.warmup_requests > 0 and not any(o.success for o in warm):
        raise ValueError("Warmup failed - Please make sure benchmark arguments are correctly specified. "
                         f"Error: {warm[0].error}")
    print(f"Warmup completed with {args.warmup_requests} sequences. Starting main benchmark run...")
    began = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.max_concurrency or args.num_prompts) as pool:
        outputs = list(pool.map(lambda pair: one_request(url, *pair), zip(prompts, output_lens)))
    duration = time.perf_counter() - began
    result = {"tag": None, "backend": args.backend, "dataset_name": args.dataset_name,
              "request_rate": float(args.request_rate), "max_concurrency": args.max_concurrency,
              "sharegpt_output_len": None, "random_input_len": args.random_input_len,
              "random_output_len": args.random_output_len, "random_range_ratio": args.random_range_ratio,
              "server_info": server_info(args.base_url.rstrip("/")), **metrics(outputs, duration)}
    print(f"Successful requests:                     {result['completed']}")
    print(f"Output token throughput (tok/s):         {result['output_throughput']:.2f}")
    for output in outputs:
        if not output.success:
            print(f"output.error={output.error!r}")
    name = args.output_file or f"{args.backend}_{args.num_prompts}_{args.random_input_len}_{args.random_output_len}.jsonl"
    with open(name, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
