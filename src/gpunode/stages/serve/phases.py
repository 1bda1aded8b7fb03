"""Startup phases of an SGLang 0.5.9 server, read from its log lines.

The messages are sglang's own (file, function): model_runner.py init_torch_distributed
"Init torch distributed begin." / "...ends."; load_model "Load weight begin." / "Load weight end.";
model_runner_kv_cache_mixin.py "Memory pool end."; _flashinfer_autotune "Running FlashInfer
autotune..." / "FlashInfer autotune completed."; cuda_graph_runner.py "Capture cuda graph";
uvicorn "Uvicorn running on"; http_server.py _wait_and_warmup "The server is fired up and ready to
roll!". Phases only move forward: a later line never takes the server back to an earlier phase.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Phase:
    key: str
    order: int
    says: str  # what a person reads while the server is in this phase


# In startup order. "ready" is reached from /health_generate, not from the log.
PHASES: tuple[Phase, ...] = (
    Phase("container", 0, "container started"),
    Phase("distributed", 1, "initialising torch distributed / NCCL"),
    Phase("loading", 2, "loading weights"),
    Phase("loaded", 3, "weights loaded"),
    Phase("memory_pool", 4, "KV cache allocated"),
    Phase("autotune", 5, "FlashInfer autotune"),
    Phase("autotuned", 6, "autotune done"),
    Phase("cuda_graph", 7, "capturing CUDA graphs"),
    Phase("http", 8, "HTTP port open, warming up"),
    Phase("fired_up", 9, "warm-up generation done"),
    Phase("ready", 10, "/health_generate answered 200"),
)
BY_KEY = {phase.key: phase for phase in PHASES}

_LINE_PHASES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"Init torch distributed begin"), "distributed"),
    (re.compile(r"Load weight begin"), "loading"),
    (re.compile(r"Load weight end"), "loaded"),
    (re.compile(r"Memory pool end"), "memory_pool"),
    (re.compile(r"Running FlashInfer autotune"), "autotune"),
    (re.compile(r"FlashInfer autotune completed"), "autotuned"),
    (re.compile(r"Capture cuda graph"), "cuda_graph"),
    (re.compile(r"Uvicorn running on|Application startup complete"), "http"),
    (re.compile(r"The server is fired up and ready to roll"), "fired_up"),
)
_DETAIL = re.compile(r"(elapsed=[0-9.]+ s|avail mem=[0-9.]+ GB|mem usage=[0-9.]+ GB)")


def phase_of_line(line: str) -> str | None:
    for pattern, key in _LINE_PHASES:
        if pattern.search(line):
            return key
    return None


def line_detail(line: str) -> str:
    """The numbers worth showing from a phase line (elapsed time, memory)."""
    return ", ".join(_DETAIL.findall(line))


def later(current: str, candidate: str) -> bool:
    return BY_KEY[candidate].order > BY_KEY[current].order
