#!/usr/bin/env python3
"""A stand-in for SGLang 0.5.9's HTTP server and its startup, for tests. Standard library only: it
runs both as a local subprocess and inside the bare Debian test image (gpunode_lab/image.py).

It takes the real launch command line, parsed by the own flags and choices of the sglang release
it stands in for, kept as data (sglang_<version>_args.json, dumped from the real parser:
FAKE_SGLANG_VERSION picks 0.5.9, the default, or 0.5.23; an unknown flag or a bad value exits 2
with argparse's words, as the real one does), and reproduces, as read from the sglang 0.5.9
wheel's source (0.5.23 answers /get_server_info with its own version and /metrics with its own
labels and timing; its other texts are taken as 0.5.9's):

* the startup sequence and its log lines (srt/model_executor/model_runner.py,
  model_runner_kv_cache_mixin.py, managers/scheduler.py, entrypoints/engine.py, http_server.py):
  the port opens only once the "weights are loaded"; ``/health`` and ``/health_generate`` answer 503
  while the server status is Starting (warm-up), then 200 after a one-token generation that takes
  at least one 1 s tick; ``/v1/models`` answers during warm-up;
* the response shapes of the OpenAI-compatible and native endpoints (each cited where it is built);
* the API-key middleware (srt/utils/auth.py): /health* and /metrics open, all else Bearer or 401;
* the scheduler's running batch (at most --max-running-requests, 1024 when not given) and its FIFO
  waiting queue;
* with --enable-metrics only (else 404), ``/metrics`` in Prometheus text format 0.0.4 as
  prometheus_client prints sglang's multiprocess registry: the scheduler's gauges
  (num_running_reqs, num_queue_reqs, num_used_tokens, token_usage, gen_throughput, cache_hit_rate,
  max_total_num_tokens), the tokenizer manager's prompt/generation token and request counters and
  TTFT / e2e histograms, and the HTTP middleware's request, response and active counts, each
  version's names, HELP texts and labels (FAMILIES cites each), from what the stand-in served,
  the warm-up included; the gauges change only when the real scheduler logs its stats (a prefill,
  every --decode-log-interval decode steps, an idle refresh), see Scheduler. Not reproduced: the
  other families (speculative, PD, LoRA, grammar, per-stage, startup, retraction, inter-token
  latency ...), aborted-request counts, DP/PD/priority labels, OpenMetrics for an Accept header
  that asks for it, and the ``name[]`` filter;
* the failure modes, chosen by environment variables so that a container started from the real
  spec builder can be told to fail:

  FAKE_SGLANG_LOAD_S, FAKE_SGLANG_AUTOTUNE_S, FAKE_SGLANG_WARMUP_S   phase durations (s)
  FAKE_SGLANG_CRASH=oom|cuinit|nccl|nccl_timeout|nan|page_table|weights   the real lines, die
  FAKE_SGLANG_HANG=nccl_init                                        stop after "Init torch
                                                                    distributed begin." forever
  FAKE_SGLANG_HEALTH=never        warm-up "succeeds" but health generations never come back
  FAKE_SGLANG_HEALTH_TICK_S       health's poll tick (sglang: asyncio.sleep(1)); default 1
  FAKE_SGLANG_FAULTS=a,b          wrong answers and malformed results, see FAULTS below
  FAKE_SGLANG_TOKEN_S, FAKE_SGLANG_TTFT_S                           generation timing (s): a
                                  /generate of N new tokens lasts TTFT + (N-1) * TOKEN_S
  FAKE_SGLANG_DRAIN_TICK_S        the drain's check interval after SIGTERM (sglang: 5 s)
  FAKE_SGLANG_METRICS_IDLE_S      an idle scheduler's metrics refresh (sglang: 30 s after its last)
  SGLANG_HEALTH_CHECK_TIMEOUT     honoured as sglang does (default 20)

A missing model directory, or one without config.json, fails the way transformers 5.2 does.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FAULTS = {
    "wrong_answer",          # the known question gets 41
    "no_reasoning",          # thinking on, but message.reasoning_content stays null
    "reasoning_when_off",    # enable_thinking false, reasoning_content still filled
    "tool_args_not_json",    # function.arguments is not JSON
    "tool_wrong_name",       # a different function than the one forced
    "tool_missing_key",      # arguments lack the schema's required keys
    "tool_finish_stop",      # finish_reason "stop" instead of "tool_calls"
    "no_tool_call",          # the forced call comes back as plain content
    "models_wrong_name",     # /v1/models lists another name
    "generate_error",        # /generate answers 500 (bench requests fail, warm-up included)
    "generate_flaky",        # every third /generate answers 500 (some bench requests fail)
    "stream_no_done",        # the SSE stream ends without "data: [DONE]"
}
CONTEXT_LEN = 202752  # GLM-5's context length, what /v1/models reports as max_model_len


def env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


# ----------------------------------------------------------------------------- logging
class Log:
    """sglang's log format: srt/utils/common.py configure_logger "[%(asctime)s{prefix}] %(message)s";
    scheduler processes add " TP{rank}" when tp_size > 1 (managers/scheduler.py run_scheduler_process)."""

    def __init__(self, tp_size: int) -> None:
        self.rank = " TP0" if tp_size > 1 else ""
        self.lock = threading.Lock()

    def _write(self, text: str) -> None:
        with self.lock:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()

    def main(self, message: str) -> None:
        self._write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {message}")

    def scheduler(self, message: str) -> None:
        self._write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}{self.rank}] {message}")

    def uvicorn(self, message: str) -> None:
        # utils/common.py set_uvicorn_logging_configs: "[%(asctime)s] %(levelprefix)s %(message)s"
        self._write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] INFO:     {message}")


# ----------------------------------------------------------------------------- arguments
def read_config_file(path: str) -> list[str]:
    """srt/server_args_config_parser.py: a .yaml/.yml mapping turned into --key value pairs, placed
    before the command line's own flags. JSON is YAML, and all this fake needs to read."""
    if not path.endswith((".yaml", ".yml")):
        raise SystemExit(f"ValueError: Config file must be YAML format, got: {os.path.splitext(path)[1]}")
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    argv: list[str] = []
    for key, value in data.items():
        if value is True:
            argv.append(f"--{key}")
        elif value is not False:
            argv.extend([f"--{key}", str(value)])
    return argv


VERSION = os.environ.get("FAKE_SGLANG_VERSION", "0.5.9")
VALUE_TYPES = {"int": int, "float": float}  # the rest (str, json, json_list_type, nullable_str) take text
DEFAULTS = {"host": "127.0.0.1", "port": 30000}  # server_args.py ServerArgs defaults (tp_size 1, below)


def real_parser(version: str = VERSION) -> argparse.ArgumentParser:
    """sglang's own parser, rebuilt from the data dumped from it (sglang_<version>_args.json): every
    flag, its arity, number type and choices, so a misspelt flag or a bad value exits 2 with argparse's
    own words, as prepare_server_args (server_args.py:5579-5592) does."""
    name = f"sglang_{version.replace('.', '_')}_args.json"
    data_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)  # in the image: beside this file
    if not os.path.isfile(data_file):  # run from the lab's checkout: gpunode's catalogue holds the dumps
        from gpunode.catalogue.sglangargs import ARGS_DIR

        data_file = str(ARGS_DIR / name)
    with open(data_file, encoding="utf-8") as handle:
        data = json.load(handle)
    parser = argparse.ArgumentParser(prog=data["prog"])
    for action in data["actions"]:
        kwargs: dict[str, Any] = {"dest": action["dest"], "required": action["required"]}
        if not action["takes_value"]:
            kwargs["action"] = "store_true"
        else:
            if action["nargs"] is not None:
                kwargs["nargs"] = action["nargs"]
            if action["type"] in VALUE_TYPES:
                kwargs["type"] = VALUE_TYPES[action["type"]]
            if action["choices"] is not None:
                kwargs["choices"] = action["choices"]
        parser.add_argument(*action["flags"], **kwargs)
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    if "--config" in argv:
        at = argv.index("--config")
        argv = read_config_file(argv[at + 1]) + argv[:at] + argv[at + 2:]
    args = real_parser().parse_args(argv)
    for name, value in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    # ServerArgs' tp_size: 0.5.9's parser dest is the long name, 0.5.23's the field's own.
    args.tp_size = getattr(args, "tensor_parallel_size", None) or getattr(args, "tp_size", None) or 1
    args.served_model_name = args.served_model_name or args.model_path
    args.tokenizer_path = args.tokenizer_path or args.model_path
    return args


def server_args_repr(args: argparse.Namespace) -> str:
    """entrypoints/engine.py logs f"{server_args=}" -- the dataclass repr, api_key included."""
    return (f"server_args=ServerArgs(model_path={args.model_path!r}, tokenizer_path={args.tokenizer_path!r}, "
            f"host={args.host!r}, port={args.port}, tp_size={args.tp_size}, "
            f"served_model_name={args.served_model_name!r}, api_key={args.api_key!r}, admin_api_key=None, "
            f"reasoning_parser={args.reasoning_parser!r}, tool_call_parser={args.tool_call_parser!r})")


# ----------------------------------------------------------------------------- the "model"
def last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
            return str(content or "")
    return ""


def answer_for(question: str, faults: set[str]) -> tuple[str, str]:
    """(reasoning, answer) the fake model gives."""
    if re.search(r"17\s*\+\s*25", question):
        return ("The user asks for 17 + 25. 17 + 20 = 37, plus 5 is 42.",
                "41" if "wrong_answer" in faults else "42")
    return ("The user greets me; I answer briefly.", "Hello from the fake GLM-5.")


def value_for(key: str, schema: dict[str, Any]) -> Any:
    kind = schema.get("type")
    if schema.get("enum"):
        return schema["enum"][0]
    if kind == "integer":
        return 1
    if kind == "number":
        return 1.5
    if kind == "boolean":
        return True
    if kind == "array":
        return []
    if kind == "object":
        return {}
    return "Paris" if any(word in key for word in ("city", "location", "place")) else "example"


def forced_parameters(tool: dict[str, Any]) -> dict[str, Any]:
    """What constrained decoding against the tool's JSON schema would produce: every required key."""
    params = tool.get("function", {}).get("parameters") or {}
    props = params.get("properties") or {}
    required = params.get("required") or list(props)
    return {key: value_for(key, props.get(key, {})) for key in required}


def tokens_of(text: str) -> int:
    return max(1, len(text.split()))


# ----------------------------------------------------------------------------- state
class State:
    def __init__(self, args: argparse.Namespace, log: Log) -> None:
        self.args = args
        self.log = log
        self.status = "Starting"  # ServerStatus in managers/tokenizer_manager.py
        self.faults = {f for f in os.environ.get("FAKE_SGLANG_FAULTS", "").split(",") if f}
        unknown = self.faults - FAULTS
        if unknown:
            raise SystemExit(f"fake sglang: unknown FAKE_SGLANG_FAULTS {sorted(unknown)}")
        self.health_never = os.environ.get("FAKE_SGLANG_HEALTH") == "never"
        self.health_tick = env_float("FAKE_SGLANG_HEALTH_TICK_S", 1.0)
        self.health_timeout = env_float("SGLANG_HEALTH_CHECK_TIMEOUT", 20)
        self.token_s = env_float("FAKE_SGLANG_TOKEN_S", 0.002)
        self.ttft_s = env_float("FAKE_SGLANG_TTFT_S", 0.01)
        self.created = int(time.time())
        self.generate_calls = 0
        self.calls_lock = threading.Lock()
        self.draining = False  # tokenizer_manager.py gracefully_exit, set by SIGTERM after start-up
        self.inflight: set[str] = set()
        self.drain_tick = env_float("FAKE_SGLANG_DRAIN_TICK_S", 5.0)  # the real watchdog's 5 s loop
        self.metrics = Metrics(args) if args.enable_metrics else None
        self.scheduler = Scheduler(args, self.metrics, self.token_s)

    def track(self, rid: str, on: bool) -> None:
        with self.calls_lock:
            (self.inflight.add if on else self.inflight.discard)(rid)


# ----------------------------------------------------------------------------- /metrics
# What GET /metrics shows with --enable-metrics, as read from the two wheels (paths under sglang/srt/)
# and the prometheus_client each image locks (0.24.1 with 0.5.9, 0.26.0 with 0.5.23; the parts used
# here are the same in both). The route is a Mount of prometheus_client's ASGI app on a fresh
# registry that holds only multiprocess.MultiProcessCollector (0.5.9 utils/common.py:1571-1581,
# mounted at entrypoints/http_server.py:263-265 only with --enable-metrics; 0.5.23
# utils/common.py:2843-2853, http_server.py:314-317); without the flag nothing is mounted and
# FastAPI answers 404 {"detail": "Not Found"}. Multiprocess mode (PROMETHEUS_MULTIPROC_DIR, set by
# utils/common.py set_prometheus_multiproc_dir) shapes the text (prometheus_client multiprocess.py
# _read_metrics/_accumulate_metrics, exposition.py generate_latest): no process_/python_ metrics and
# no *_created samples; a counter's HELP and TYPE name the *_total sample (exposition.py:305); a
# mostrecent or livesum gauge loses its pid label; a labelled family shows only once a child was
# made (labels() called); sample labels are sorted by name, le included (exposition.py:282); a
# histogram gives, per label set, _sum, then cumulative _bucket lines, then _count; values are
# printed by floatToGoString (utils.py:9). Without an Accept header asking for OpenMetrics the type
# is text/plain 0.0.4 (exposition.py:369), gzip when Accept-Encoding has it (exposition.py:411).
# Families come out in the order the .db files are globbed, which nothing fixes; here, FAMILIES'.
#
# name: (type, HELP, where 0.5.9 creates it, where 0.5.23 does)
FAMILIES: dict[str, tuple[str, str, str, str]] = {
    "sglang:num_running_reqs": ("gauge", "The number of running requests.",
                                "metrics/collector.py:306", "observability/metrics_collector.py:364"),
    "sglang:num_queue_reqs": ("gauge", "The number of requests in the waiting queue.",
                              "metrics/collector.py:354", "observability/metrics_collector.py:370"),
    "sglang:num_used_tokens": ("gauge", "The number of used tokens.",
                               "metrics/collector.py:312", "observability/metrics_collector.py:432"),
    "sglang:token_usage": ("gauge", "The token usage.",
                           "metrics/collector.py:318", "observability/metrics_collector.py:404"),
    "sglang:gen_throughput": ("gauge", "The generation throughput (token/s).",
                              "metrics/collector.py:348", "observability/metrics_collector.py:382"),
    "sglang:cache_hit_rate": ("gauge", "The prefix cache hit rate.",
                              "metrics/collector.py:372", "observability/metrics_collector.py:388"),
    "sglang:max_total_num_tokens": ("gauge", "Maximum total number of tokens in the KV cache pool.",
                                    "metrics/collector.py:379", "observability/metrics_collector.py:1289"),
    "sglang:prompt_tokens_total": ("counter", "Number of prefill tokens processed.",
                                   "metrics/collector.py:1104", "observability/metrics_collector.py:1855"),
    "sglang:generation_tokens_total": ("counter", "Number of generation tokens processed.",
                                       "metrics/collector.py:1110", "observability/metrics_collector.py:1860"),
    "sglang:num_requests_total": ("counter", "Number of requests processed.",
                                  "metrics/collector.py:1173", "observability/metrics_collector.py:1940"),
    "sglang:time_to_first_token_seconds": ("histogram", "Histogram of time to first token in seconds.",
                                           "metrics/collector.py:1266", "observability/metrics_collector.py:2040"),
    "sglang:e2e_request_latency_seconds": ("histogram", "Histogram of End-to-end request latency in seconds",
                                           "metrics/collector.py:1280", "observability/metrics_collector.py:2067"),
    "sglang:http_requests_total": ("counter", "Total number of HTTP requests by endpoint and method",
                                   "utils/common.py:1607", "observability/http_request_metrics.py:28"),
    "sglang:http_responses_total": ("counter", "Total number of HTTP responses by endpoint and status code",
                                    "utils/common.py:1613", "observability/http_request_metrics.py:34"),
    "sglang:http_requests_active": ("gauge", "Number of currently active HTTP requests",
                                    "utils/common.py:1619", "observability/http_request_metrics.py:40"),
}
# The scheduler's gauges, all written together by SchedulerMetricsCollector.log_stats (0.5.9
# metrics/collector.py:975; 0.5.23 observability/metrics_collector.py:1646), which also writes the
# rest of its ~30 gauges (speculative, PD, LoRA, ...): those are not reproduced.
SCHEDULER_GAUGES = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:num_used_tokens",
                    "sglang:token_usage", "sglang:gen_throughput", "sglang:cache_hit_rate")
# 0.5.23 adds is_streaming ("true"/"false") to these (metrics_collector.py:1855-1862, 1940-1943,
# 2040-2047, 2067-2071; observe_one_finished_request :2092-2152, observe_time_to_first_token :2154).
IS_STREAMING = {"sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:num_requests_total",
                "sglang:time_to_first_token_seconds", "sglang:e2e_request_latency_seconds"}
# The default buckets (the same in both: 0.5.9 metrics/collector.py:1190-1237, 0.5.23
# metrics_collector.py:1965-2012); --bucket-time-to-first-token / --bucket-e2e-request-latency
# replace them, as TokenizerMetricsCollector's arguments do.
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (*TTFT_BUCKETS, 600, 1200, 1800, 2400)
MAX_TOTAL_NUM_TOKENS = 1651200  # the KV pool the start-up log reports
FORCE_STREAM_INTERVAL = 50  # a non-streamed request reaches the tokenizer manager every 50 tokens
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # prometheus_client exposition.py:51

Labels = tuple[tuple[str, str], ...]


def label_set(labels: dict[str, Any]) -> Labels:
    # Metric.labels() takes str() of each value; the multiprocess reader sorts them (multiprocess.py:55).
    return tuple(sorted((key, str(value)) for key, value in labels.items()))


def go_float(value: float) -> str:
    """prometheus_client utils.py:9 floatToGoString (0.24.1 writes the exponent as e+0N, 0.26.0 as
    e+NN: the same text below 1e10)."""
    value = float(value)
    if value == float("inf"):
        return "+Inf"
    if value == float("-inf"):
        return "-Inf"
    if value != value:
        return "NaN"
    text = repr(value)
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def sample_line(name: str, labels: Labels, value: float) -> str:
    # exposition.py:276-296 sample_line: labels sorted by name, values escaped (\\, \n, \").
    if not labels:
        return f"{name} {go_float(value)}\n"
    text = ",".join('{}="{}"'.format(key, val.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"'))
                    for key, val in sorted(labels))
    return f"{name}{{{text}}} {go_float(value)}\n"


class Metrics:
    """The families above, as the tokenizer manager, the scheduler of each reporting rank and the
    HTTP middleware write them, and their exposition."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.lock = threading.Lock()
        self.new = VERSION != "0.5.9"
        extra = json.loads(args.extra_metric_labels) if args.extra_metric_labels else {}
        tp = args.tp_size
        ep = getattr(args, "expert_parallel_size", None) or getattr(args, "ep_size", None) or 1

        def scheduler_labels(rank: int) -> Labels:
            # 0.5.9 managers/scheduler_metrics_mixin.py:104-124, 0.5.23 metrics_collector.py:1375-1394:
            # engine_type "unified" without PD; moe_ep_rank as entrypoints/engine.py:961-968 derives it.
            return label_set({"model_name": args.served_model_name, "engine_type": "unified", "tp_rank": rank,
                              "pp_rank": 0, "moe_ep_rank": rank // max(1, tp // ep), **extra})

        # Only attention-TP rank 0 logs stats unless --enable-metrics-for-all-schedulers (0.5.9
        # scheduler_metrics_mixin.py:100-102, 0.5.23 metrics_collector.py:1364-1367).
        ranks = range(tp) if args.enable_metrics_for_all_schedulers else range(1)
        self.reporting = [scheduler_labels(rank) for rank in ranks]
        custom = {label: "" for label in (args.tokenizer_metrics_allowed_custom_labels or [])}
        # 0.5.9 managers/tokenizer_manager.py:433-441; 0.5.23 metrics_collector.py:1804-1819 adds engine_type.
        self.tokenizer = {"model_name": args.served_model_name, **({"engine_type": "unified"} if self.new else {}),
                          **custom, **extra}
        self.buckets = {
            "sglang:time_to_first_token_seconds": self._bounds(args.bucket_time_to_first_token, TTFT_BUCKETS),
            "sglang:e2e_request_latency_seconds": self._bounds(args.bucket_e2e_request_latency, E2E_BUCKETS)}
        self.series: dict[str, dict[Labels, Any]] = {name: {} for name in FAMILIES}
        if self.new:
            # Every rank's scheduler emits its constants at start-up (0.5.23 managers/scheduler.py:631,
            # 1278-1300 -> metrics_collector.py:1769-1783); 0.5.9 has it in log_stats only.
            for rank in range(tp):
                self.series["sglang:max_total_num_tokens"][scheduler_labels(rank)] = float(MAX_TOTAL_NUM_TOKENS)

    @staticmethod
    def _bounds(given: list[float] | None, default: tuple[float, ...]) -> list[float]:
        bounds = [float(b) for b in (given or default)]
        return bounds if bounds[-1] == float("inf") else [*bounds, float("inf")]  # Histogram adds +Inf

    def log_stats(self, stats: dict[str, float]) -> None:
        with self.lock:
            for labels in self.reporting:
                for name, value in stats.items():
                    self.series[name][labels] = float(value)

    def _inc(self, name: str, labels: Labels, amount: float = 1.0) -> None:
        series = self.series[name]
        series[labels] = series.get(labels, 0.0) + amount

    def _observe(self, name: str, labels: Labels, value: float) -> None:
        bounds = self.buckets[name]
        counts, total = self.series[name].get(labels, ([0] * len(bounds), 0.0))
        counts = list(counts)
        counts[next(i for i, bound in enumerate(bounds) if value <= bound)] += 1
        self.series[name][labels] = (counts, total + value)

    def _tokenizer_labels(self, name: str, stream: bool) -> Labels:
        extra = {"is_streaming": "true" if stream else "false"} if self.new and name in IS_STREAMING else {}
        return label_set({**self.tokenizer, **extra})

    def first_token(self, latency: float, stream: bool) -> None:
        # 0.5.9 tokenizer_manager.py:1958-1967, 0.5.23 :3235-3247: at the request's first output.
        with self.lock:
            name = "sglang:time_to_first_token_seconds"
            self._observe(name, self._tokenizer_labels(name, stream), latency)

    def finished(self, prompt: int, completion: int, e2e: float, stream: bool) -> None:
        # 0.5.9 metrics/collector.py:1315-1363, 0.5.23 metrics_collector.py:2092-2152 (from collect_metrics,
        # 0.5.9 tokenizer_manager.py:1618-1619, 0.5.23 :2789): requests with log_metrics (not health's).
        with self.lock:
            for name, amount in (("sglang:prompt_tokens_total", prompt), ("sglang:generation_tokens_total", completion),
                                 ("sglang:num_requests_total", 1)):
                self._inc(name, self._tokenizer_labels(name, stream), amount)
            name = "sglang:e2e_request_latency_seconds"
            self._observe(name, self._tokenizer_labels(name, stream), e2e)

    def http_request(self, endpoint: str, method: str) -> None:
        # The middleware (0.5.9 utils/common.py:1634-1660, 0.5.23 http_request_metrics.py:75-105) counts a
        # request as it enters and its response once call_next returns (Handler._count_response). The
        # API-key middleware is added later (0.5.9 http_server.py:1944-1950), so it runs outside it:
        # a 401 is never counted.
        with self.lock:
            self._inc("sglang:http_requests_total", label_set({"endpoint": endpoint, "method": method}))
            self._inc("sglang:http_requests_active", label_set({"endpoint": endpoint, "method": method}))

    def http_response(self, endpoint: str, method: str, status: int) -> None:
        with self.lock:
            self._inc("sglang:http_responses_total",
                      label_set({"endpoint": endpoint, "method": method, "status_code": str(status)}))
            self._inc("sglang:http_requests_active", label_set({"endpoint": endpoint, "method": method}), -1.0)

    def exposition(self) -> bytes:
        out: list[str] = []
        with self.lock:
            for name, (kind, help_text, *_where) in FAMILIES.items():
                series = self.series[name]
                if not series:
                    continue
                out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")
                for labels, value in series.items():
                    if kind != "histogram":
                        out.append(sample_line(name, labels, value))
                        continue
                    counts, total = value
                    out.append(sample_line(f"{name}_sum", labels, total))
                    cumulative = 0
                    for bound, count in zip(self.buckets[name], counts):
                        cumulative += count
                        out.append(sample_line(f"{name}_bucket", (*labels, ("le", go_float(bound))), cumulative))
                    out.append(sample_line(f"{name}_count", labels, cumulative))
        return "".join(out).encode()


class Scheduler:
    """What the stand-in has of sglang's scheduler: a running batch of at most --max-running-requests
    (1024 when not given, what the start-up log says), a FIFO waiting queue, and, with
    --enable-metrics, the stats it reports, at the moments it reports them (so /metrics is as stale
    as the real one's):

    * a prefill: when a request is admitted, num_running_reqs is the batch it joins, without it
      (0.5.9 managers/scheduler.py:2179, scheduler_metrics_mixin.py:243-300; 0.5.23
      scheduler.py:4364-4366, metrics_reporter.py:719-897), cache_hit_rate its hit share (0: the
      stand-in has no prefix cache); 0.5.9 keeps gen_throughput, 0.5.23 zeroes it after 30 s
      without decode stats (metrics_reporter.py:74, 266-274, 868);
    * every --decode-log-interval (40) decode steps, one step per FAKE_SGLANG_TOKEN_S while a
      request runs (0.5.9 scheduler_output_processor_mixin.py:531-534, scheduler_metrics_mixin.py:
      304-472; 0.5.23 metrics_reporter.py:901-1143): gen_throughput is the decode tokens since the
      last such log over the time since;
    * idle: 0.5.9 refreshes 30 s after the last log (scheduler_runtime_checker_mixin.py:253-306),
      0.5.23 at once when num_running_reqs is stale, else after 30 s (metrics_reporter.py:1476-1532).
      FAKE_SGLANG_METRICS_IDLE_S replaces the 30 s.

    num_used_tokens is the prompt and generated tokens of the running requests (a finished
    request's tokens stay in the radix cache as evictable, which _get_token_info does not count)."""

    def __init__(self, args: argparse.Namespace, metrics: Metrics | None, token_s: float) -> None:
        self.cond = threading.Condition()
        self.cap = args.max_running_requests or 1024
        self.metrics = metrics
        self.running: dict[str, int] = {}  # rid -> tokens it holds in the KV pool
        self.waiting: list[str] = []
        self.interval = args.decode_log_interval or 40
        self.idle_s = env_float("FAKE_SGLANG_METRICS_IDLE_S", 30.0)
        self.step_s = max(token_s, 0.001)
        self.forward_ct_decode = 0
        self.num_generated_tokens = 0
        self.last_decode_tic = self.last_log = time.monotonic()
        self.stats = {name: 0.0 for name in SCHEDULER_GAUGES}
        if metrics is not None:
            threading.Thread(target=self._loop, daemon=True).start()

    def admit(self, rid: str, prompt_tokens: int) -> None:
        with self.cond:
            self.waiting.append(rid)
            while self.waiting[0] != rid or len(self.running) >= self.cap:
                self.cond.wait()
            self.waiting.pop(0)
            running_bs = len(self.running)
            self.running[rid] = prompt_tokens
            self.cond.notify_all()  # the next in line looks again
            if self.metrics is not None:
                now = time.monotonic()
                if VERSION != "0.5.9" and now - self.last_decode_tic > 30:
                    self.stats["sglang:gen_throughput"] = 0.0
                self._log(now, running_bs)

    def token(self, rid: str, decode: bool) -> None:
        with self.cond:
            self.running[rid] += 1
            if decode:
                self.num_generated_tokens += 1

    def finish(self, rid: str) -> None:
        with self.cond:
            if self.running.pop(rid, None) is None and rid in self.waiting:
                self.waiting.remove(rid)
            self.cond.notify_all()

    def _log(self, now: float, running: int, **more: float) -> None:
        """log_stats with the scheduler's stats object, which keeps what this log does not set;
        cache_hit_rate stays 0."""
        used = sum(self.running.values())
        self.stats.update({"sglang:num_running_reqs": running, "sglang:num_queue_reqs": len(self.waiting),
                           "sglang:num_used_tokens": used, "sglang:token_usage": used / MAX_TOTAL_NUM_TOKENS})
        self.stats.update({f"sglang:{name}": value for name, value in more.items()})
        stats = dict(self.stats)
        if VERSION == "0.5.9":
            stats["sglang:max_total_num_tokens"] = MAX_TOTAL_NUM_TOKENS  # set on every log_stats
        assert self.metrics is not None
        self.metrics.log_stats(stats)
        self.last_log = now

    def _loop(self) -> None:
        busy = False
        while True:
            time.sleep(self.step_s if busy else max(self.step_s, 0.05))
            with self.cond:
                now = time.monotonic()
                busy = bool(self.running)
                if busy:
                    self.forward_ct_decode += 1
                    if self.forward_ct_decode % self.interval == 0:
                        throughput = self.num_generated_tokens / (now - self.last_decode_tic)
                        self.num_generated_tokens, self.last_decode_tic = 0, now
                        self._log(now, len(self.running), gen_throughput=throughput)
                    continue
                stale = VERSION != "0.5.9" and self.stats["sglang:num_running_reqs"] != 0
                if stale or now > self.last_log + self.idle_s:
                    usage = sum(self.running.values()) / MAX_TOTAL_NUM_TOKENS
                    self._log(now, 0, gen_throughput=0.0,
                              token_usage=round(usage, 2) if VERSION == "0.5.9" else usage)


class Generation:
    """One generation as the scheduler and the tokenizer manager see it: admitted (it may wait in the
    queue), its tokens as they come, and, once it ends normally, the finished-request counters and
    e2e latency. TTFT is taken at the request's first output to the tokenizer manager: its first
    token when streamed, else every 50th token or the end (0.5.9 scheduler_output_processor_mixin.py:38,
    966-989; 0.5.23 output_streamer.py:49, environ.py:688). A request cut off (the client went
    away) is not counted as finished."""

    def __init__(self, state: State, prompt_tokens: int, stream: bool) -> None:
        self.state, self.prompt, self.stream = state, prompt_tokens, stream
        self.rid = uuid.uuid4().hex
        self.created = time.monotonic()
        self.tokens = 0
        self.first_output = False

    def __enter__(self) -> Generation:
        self.state.scheduler.admit(self.rid, self.prompt)
        return self

    def token(self, count: int = 1) -> None:
        for _ in range(count):
            self.tokens += 1
            self.state.scheduler.token(self.rid, decode=self.tokens > 1)
            if self.tokens == 1 if self.stream else self.tokens % FORCE_STREAM_INTERVAL == 0:
                self._output()

    def _output(self) -> None:
        if not self.first_output and self.state.metrics is not None:
            self.state.metrics.first_token(time.monotonic() - self.created, self.stream)
        self.first_output = True

    def __exit__(self, kind: type[BaseException] | None, *_rest: Any) -> None:
        self.state.scheduler.finish(self.rid)
        if kind is None and self.state.metrics is not None:
            self._output()
            self.state.metrics.finished(self.prompt, self.tokens, time.monotonic() - self.created, self.stream)


def warm_up(state: State) -> None:
    """http_server.py _execute_server_warmup, as /metrics sees it: GET /model_info, then POST /generate
    of "The capital city of France is" for 8 new tokens (0.5.9 http_server.py:1678, 1702-1706,
    1745-1748, 1763-1768; 0.5.23 :2374, 2407, 2455), both through the HTTP middleware; none with
    --skip-server-warmup (0.5.9 :1829, 0.5.23 :2589)."""
    metrics = state.metrics
    if metrics is None or state.args.skip_server_warmup:
        return
    for endpoint, method in (("/model_info", "GET"), ("/generate", "POST")):
        metrics.http_request(endpoint, method)
        if endpoint == "/generate":
            with Generation(state, tokens_of("The capital city of France is"), stream=False) as generation:
                generation.token(8)
        metrics.http_response(endpoint, method, 200)


def chat_choice(state: State, body: dict[str, Any]) -> dict[str, Any]:
    """What entrypoints/openai/serving_chat.py _build_chat_response puts in one choice, after the
    glm45 reasoning parser (parser/reasoning_parser.py: Qwen3Detector, forced when thinking is on,
    _get_reasoning_from_request) and, for a named or required tool_choice, _process_tool_calls."""
    faults = state.faults
    kwargs = body.get("chat_template_kwargs") or {}
    thinking = kwargs.get("enable_thinking") is not False and body.get("separate_reasoning", True)
    reasoning, answer = answer_for(last_user_text(body.get("messages") or []), faults)
    if "reasoning_when_off" in faults:
        thinking = True
    if "no_reasoning" in faults:
        reasoning = ""
    reasoning_content = reasoning if thinking and reasoning else None
    if state.args.reasoning_parser is None:
        # serving_chat.py:926-927, 968-970: no parser, no split: reasoning_content stays null and the
        # thinking stays in the text, up to GLM's closing tag.
        answer = f"{reasoning}</think>{answer}" if thinking and reasoning else answer
        reasoning_content = None
    tool_choice = body.get("tool_choice")
    tools = body.get("tools") or []
    finish = "stop"
    content: str | None = answer
    tool_calls = None
    if tools and tool_choice not in (None, "none", "auto"):
        wanted = tool_choice["function"]["name"] if isinstance(tool_choice, dict) else tools[0]["function"]["name"]
        tool = next(t for t in tools if t["function"]["name"] == wanted)
        params = {} if "tool_missing_key" in faults else forced_parameters(tool)
        arguments = json.dumps(params, ensure_ascii=False)  # serving_chat: json.dumps(tool["parameters"])
        if "tool_args_not_json" in faults:
            arguments = arguments[:-1] if len(arguments) > 2 else "{city: Paris"
        name = "other_function" if "tool_wrong_name" in faults else wanted
        finish = "stop" if "tool_finish_stop" in faults else "tool_calls"
        if "no_tool_call" in faults or state.args.tool_call_parser is None:
            # serving_chat.py:949-962: without --tool-call-parser the constrained call stays text.
            content = json.dumps([{"name": name, "parameters": params}])
            finish = "stop"
        else:
            content = None  # _process_tool_calls returns "" as text -> content None
            tool_calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "index": 0, "type": "function",
                           "function": {"name": name, "arguments": arguments}}]
    return {"reasoning": reasoning_content, "content": content, "tool_calls": tool_calls, "finish": finish}


def chat_response(state: State, body: dict[str, Any], choice: dict[str, Any], rid: str) -> dict[str, Any]:
    """protocol.py ChatCompletionResponse / ChatCompletionResponseChoice / ChatMessage / UsageInfo,
    serialised by FastAPI with None fields kept (hidden_states and sglext are dropped when None)."""
    completion = tokens_of((choice["reasoning"] or "") + " " + (choice["content"] or "") +
                           json.dumps(choice["tool_calls"] or ""))
    prompt = tokens_of(json.dumps(body.get("messages")))
    return {
        "id": rid, "object": "chat.completion", "created": int(time.time()), "model": body.get("model"),
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": choice["content"],
                        "reasoning_content": choice["reasoning"], "tool_calls": choice["tool_calls"]},
            "logprobs": None, "finish_reason": choice["finish"], "matched_stop": None,
        }],
        "usage": {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
                  "prompt_tokens_details": None, "reasoning_tokens": 0},
        "metadata": {"weight_version": "default"},
    }


def pieces(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def chat_stream_chunks(state: State, body: dict[str, Any], choice: dict[str, Any], rid: str) -> Iterable[str]:
    """serving_chat.py _generate_chat_stream: a first chunk with role "assistant" and content "",
    reasoning deltas, content deltas or tool-call deltas (_process_tool_call_stream: the first with
    id and name, then argument pieces with id/name null), then a chunk with an empty delta and the
    finish_reason ("tool_calls" when a call was streamed and it stopped), then "data: [DONE]".
    Chunks are ChatCompletionStreamResponse.model_dump_json(): None fields are kept."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        full_delta = {"role": None, "content": None, "reasoning_content": None, "tool_calls": None, **delta}
        data = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": body.get("model"),
                "choices": [{"index": 0, "delta": full_delta, "logprobs": None, "finish_reason": finish,
                             "matched_stop": None}],
                "usage": None}
        return f"data: {json.dumps(data)}\n\n"

    prompt = tokens_of(json.dumps(body.get("messages")))
    with Generation(state, prompt, stream=True) as generation:
        yield chunk({"role": "assistant", "content": ""})
        for part in pieces(choice["reasoning"] or "", 12):
            time.sleep(state.token_s)
            generation.token()  # one delta per "token" here, for the usage chunk
            yield chunk({"reasoning_content": part})
        if choice["tool_calls"]:
            call = choice["tool_calls"][0]
            yield chunk({"tool_calls": [{"id": call["id"], "index": 0, "type": "function",
                                         "function": {"name": call["function"]["name"], "arguments": ""}}]})
            for part in pieces(call["function"]["arguments"], 7):
                time.sleep(state.token_s)
                generation.token()
                yield chunk({"tool_calls": [{"id": None, "index": 0, "type": "function",
                                             "function": {"name": None, "arguments": part}}]})
        for part in pieces(choice["content"] or "", 4):
            time.sleep(state.token_s)
            generation.token()
            yield chunk({"content": part})
    sent = generation.tokens
    yield chunk({}, choice["finish"])
    if (body.get("stream_options") or {}).get("include_usage"):
        # serving_chat.py: a last chunk with empty choices and the usage (UsageProcessor).
        usage = {"prompt_tokens": prompt, "total_tokens": prompt + sent, "completion_tokens": sent,
                 "prompt_tokens_details": None, "reasoning_tokens": 0}
        usage_chunk = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()),
                       "model": body.get("model"), "choices": [], "usage": usage}
        yield f"data: {json.dumps(usage_chunk)}\n\n"
    if "stream_no_done" not in state.faults:
        yield "data: [DONE]\n\n"


def generate_outputs(state: State, body: dict[str, Any]) -> Iterable[dict[str, Any]]:
    """The native /generate result (http_server.py generate_request; tokenizer_manager.py builds
    {"text", "output_ids", "meta_info"}; with stream_output off each streamed item carries the whole
    text so far). finish_reason per managers/schedule_batch.py FINISH_LENGTH.to_json()."""
    params = body.get("sampling_params") or {}
    n_out = int(params.get("max_new_tokens", 128))
    prompt = body.get("input_ids") if body.get("input_ids") is not None else str(body.get("text", "")).split()
    prompt_tokens = len(prompt) if isinstance(prompt, list) else 1
    rid = uuid.uuid4().hex
    began = time.time()
    text = ""
    ids: list[int] = []
    with Generation(state, prompt_tokens, stream=bool(body.get("stream"))) as generation:
        time.sleep(state.ttft_s)
        for index in range(n_out):
            if index:
                time.sleep(state.token_s)
            generation.token()
            text += f" tok{index}"
            ids.append(1000 + index)
            last = index == n_out - 1
            yield {"text": text, "output_ids": list(ids),
                   "meta_info": {"id": rid, "finish_reason": {"type": "length", "length": n_out} if last else None,
                                 "prompt_tokens": prompt_tokens, "weight_version": "default", "total_retractions": 0,
                                 "completion_tokens": index + 1, "cached_tokens": 0,
                                 **({"e2e_latency": time.time() - began} if last else {})}}


# ----------------------------------------------------------------------------- HTTP
class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as separate writes, as uvicorn's do
    def version_string(self) -> str:
        return "uvicorn"  # the Server header uvicorn sends
    state: State  # set on the class by serve()
    _metered: tuple[str, str] | None = None  # (endpoint, method) of a request the HTTP metrics counted
    _status = 500  # what http_middleware_patch.py counts when no response started

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # access lines are written by _access(), in uvicorn's format

    def _access(self, status: int) -> None:
        host, port = self.client_address[:2]
        self.state.log.uvicorn(f'{host}:{port} - "{self.command} {self.path} HTTP/1.1" {status}')

    def send_response(self, code: int, message: str | None = None) -> None:
        self._status = code
        if VERSION == "0.5.9":  # BaseHTTPMiddleware's call_next returns at the status line
            self._count_response()
        super().send_response(code, message)

    def _count_response(self) -> None:
        """The response as the HTTP middleware counts it: in 0.5.9 when the status line goes out (a
        stream's body comes after), in 0.5.23 once the whole body is sent (its call_next awaits the
        app: utils/http_middleware_patch.py:38-48)."""
        metered, self._metered = self._metered, None
        if metered is not None and self.state.metrics is not None:
            self.state.metrics.http_response(*metered, self._status)

    def _meter(self, path: str) -> None:
        """The HTTP middleware's endpoint label: the matched route's path (the /metrics Mount matches
        every path under it), else the URL's path (0.5.9 utils/common.py:1664-1672, 0.5.23
        http_request_metrics.py:109-117)."""
        metrics = self.state.metrics
        if metrics is not None:
            endpoint = "/metrics" if path.startswith("/metrics") else path
            self._metered, self._status = (endpoint, self.command), 500
            metrics.http_request(endpoint, self.command)

    def _metrics(self) -> None:
        """prometheus_client's ASGI app (asgi.py make_asgi_app -> exposition.py:116-128 _bake_output),
        for any method the Mount passes to it."""
        assert self.state.metrics is not None
        body = self.state.metrics.exposition()
        gzipped = any(part.split(";")[0].strip().lower() == "gzip"
                      for part in (self.headers.get("Accept-Encoding") or "").split(","))
        if gzipped:
            body = gzip.compress(body)
        self.send_response(200)
        self.send_header("content-type", METRICS_CONTENT_TYPE)
        if gzipped:
            self.send_header("content-encoding", "gzip")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self._access(200)

    def _send(self, status: int, body: bytes = b"", content_type: str | None = None) -> None:
        self.send_response(status)
        if content_type:
            self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)
        self._access(status)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json")

    def _error(self, status: int, message: str, kind: str) -> None:
        # protocol.py ErrorResponse as serving_base.py create_error_response dumps it.
        self._json(status, {"object": "error", "message": message, "type": kind, "param": None, "code": status})

    def _stream(self, events: Iterable[str]) -> None:
        # fastapi StreamingResponse(media_type="text/event-stream"): chunked transfer encoding.
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        self._access(200)
        try:
            for event in events:
                data = event.encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()  # a generation cut off leaves the running batch now (Generation.__exit__)

    def _authorized(self) -> bool:
        """srt/utils/auth.py decide_request_auth (0.5.9 :100, 0.5.23 :101-106): /health* and
        /metrics are always allowed, whether /metrics is mounted or not; with
        --api-key every other path needs "Authorization: Bearer <key>", else 401 {"error": "Unauthorized"}."""
        key = self.state.args.api_key
        if not key or self.path.startswith("/health") or self.path.startswith("/metrics"):
            return True
        header = self.headers.get("Authorization") or ""
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer" and token == key:
            return True
        self._json(401, {"error": "Unauthorized"})
        return False

    def _body(self) -> dict[str, Any] | None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            data = json.loads(raw or b"{}")
        except json.JSONDecodeError as exc:
            # http_server.py validation_exception_handler: FastAPI's 422 turned into 400 ErrorResponse.
            self._error(400, f"JSON decode error: {exc}", "Bad Request")
            return None
        return data if isinstance(data, dict) else {}

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        try:
            self._get()
        finally:
            self._count_response()

    def _get(self) -> None:
        path = self.path.split("?", 1)[0]
        self._metered = None
        if not self._authorized():
            return
        self._meter(path)
        if self.state.metrics is not None and path.startswith("/metrics"):
            self._metrics()
        elif path in ("/health", "/health_generate"):
            self._health()
        elif path == "/v1/models":
            self._models()
        elif path == "/v1/loads":
            self._loads()
        elif path in ("/model_info", "/get_model_info"):
            self._model_info()
        elif path in ("/server_info", "/get_server_info"):
            self._server_info()
        else:
            self._json(404, {"detail": "Not Found"})  # FastAPI's default 404

    def do_POST(self) -> None:  # noqa: N802
        rid = uuid.uuid4().hex
        self.state.track(rid, True)
        try:
            self._post()
        finally:
            self.state.track(rid, False)
            self._count_response()

    def _post(self) -> None:
        path = self.path.split("?", 1)[0]
        self._metered = None
        if not self._authorized():
            return
        self._meter(path)
        if self.state.metrics is not None and path.startswith("/metrics"):
            self._metrics()
        elif path == "/v1/chat/completions":
            media = (self.headers.get("content-type") or "").split(";")[0].strip().lower()
            if media != "application/json":  # http_server.py validate_json_request
                self._error(400, "Unsupported Media Type: Only 'application/json' is allowed", "Bad Request")
                return
            body = self._body()
            if body is not None:
                self._chat(body)
        elif path == "/generate":
            body = self._body()
            if body is not None:
                self._generate(body)
        else:
            self._json(404, {"detail": "Not Found"})

    def _health(self) -> None:
        """http_server.py health_generate: 503 while Starting; else a 1-token generation, polled every
        1 s for up to HEALTH_CHECK_TIMEOUT; 200 on any answer, else 503 and status UnHealthy."""
        state = self.state
        if state.draining:
            # http_server.py:474-476: while draining, health answers 503 with no body.
            state.log.main("Health check request received during shutdown. Returning 503.")
            self._send(503)
            return
        if state.status == "Starting":
            self._send(503)
            return
        tic = time.time()
        while time.time() < tic + state.health_timeout:
            time.sleep(state.health_tick)
            if not state.health_never:
                state.status = "Up"
                self._send(200)
                return
        state.log.main(
            f"Health check failed. Server couldn't get a response from detokenizer for last "
            f"{int(state.health_timeout)} seconds. tic start time: {time.strftime('%H:%M:%S', time.localtime(tic))}. "
            f"last_heartbeat time: {time.strftime('%H:%M:%S', time.localtime(state.created))}")
        state.status = "UnHealthy"
        self._send(503)

    def _models(self) -> None:
        # http_server.py available_models -> protocol.py ModelList / ModelCard.
        name = "default" if "models_wrong_name" in self.state.faults else self.state.args.served_model_name
        self._json(200, {"object": "list", "data": [{
            "id": name, "object": "model", "created": int(time.time()), "owned_by": "sglang",
            "root": name, "parent": None, "max_model_len": CONTEXT_LEN}]})

    def _loads(self) -> None:
        """entrypoints/v1_loads.py get_loads, mounted whatever the flags (0.5.9 http_server.py:375-377,
        0.5.23 :519-523), behind the API key: one scheduler's live counts, read when asked (0.5.9
        scheduler_metrics_mixin.py:620-660 len(running_batch.reqs) and the waiting queue; 0.5.23
        scheduler_components/load_inquirer.py:109-112). 0.5.9 answers its GetLoadsReqOutput fields
        (managers/io_struct.py:1909-1939) with num_total_reqs and an aggregate (v1_loads.py:166-174);
        0.5.23 a LoadSnapshot's core keys (managers/load_snapshot.py:196-222, 249-251) and the
        accelerator (v1_loads.py:143-150). ?include= is not read: the stand-in has no other section."""
        scheduler, args = self.state.scheduler, self.state.args
        with scheduler.cond:
            running, waiting = len(scheduler.running), len(scheduler.waiting)
            used = sum(scheduler.running.values())
        cap = args.max_running_requests or 1024
        core = {"dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": waiting, "num_used_tokens": used,
                "max_total_num_tokens": MAX_TOTAL_NUM_TOKENS, "token_usage": round(used / MAX_TOTAL_NUM_TOKENS, 4),
                "gen_throughput": 0.0, "cache_hit_rate": 0.0, "utilization": round(running / cap, 4),
                "max_running_requests": cap}
        now = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
        if VERSION == "0.5.9":
            load = {**core, "num_total_reqs": running + waiting}
            self._json(200, {"timestamp": now, "version": VERSION, "dp_rank_count": 1, "loads": [load], "aggregate": {
                "total_running_reqs": running, "total_waiting_reqs": waiting, "total_reqs": running + waiting,
                "avg_token_usage": core["token_usage"], "avg_throughput": 0.0, "avg_utilization": core["utilization"]}})
            return
        load = {"timestamp": time.time(), "dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": waiting,
                "num_waiting_uncached_tokens": 0, "num_used_tokens": used, "num_total_tokens": used,
                "num_active_tokens": used, "num_prealloc_ready_tokens": 0, "max_total_num_tokens": MAX_TOTAL_NUM_TOKENS,
                "max_running_requests": cap, "token_usage": core["token_usage"], "gen_throughput": 0.0,
                "cache_hit_rate": 0.0, "utilization": core["utilization"], "total_prefill_uncached_tokens": 0,
                "total_prefill_busy_us": 0, "decode_moments": None}
        self._json(200, {"timestamp": now, "version": VERSION, "accelerator": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                         "num_accelerators": args.tp_size, "loads": [load]})

    def _model_info(self) -> None:
        # http_server.py model_info
        args = self.state.args
        self._json(200, {"model_path": args.model_path, "tokenizer_path": args.tokenizer_path,
                         "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
                         "has_image_understanding": False, "has_audio_understanding": False,
                         "model_type": "glm_moe_dsa", "architectures": ["GlmMoeDsaForCausalLM"]})

    def _server_info(self) -> None:
        # http_server.py server_info: dataclasses.asdict(server_args) -- the api_key included, as in 0.5.9.
        args = self.state.args
        self._json(200, {"model_path": args.model_path, "tokenizer_path": args.tokenizer_path, "host": args.host,
                         "port": args.port, "tp_size": args.tp_size, "api_key": args.api_key,
                         "served_model_name": args.served_model_name,
                         "max_running_requests": args.max_running_requests, "internal_states": [{}],
                         "version": VERSION})

    def _chat(self, body: dict[str, Any]) -> None:
        # serving_chat.py _validate_request
        if not body.get("messages"):
            self._error(400, "Messages cannot be empty.", "BadRequestError")
            return
        tool_choice = body.get("tool_choice")
        tools = body.get("tools") or []
        if tool_choice == "required" and not tools:
            self._error(400, "Tools cannot be empty if tool choice is set to required.", "BadRequestError")
            return
        if isinstance(tool_choice, dict):
            if not tools:
                self._error(400, "Tools cannot be empty if tool choice is set to a specific tool.", "BadRequestError")
                return
            wanted = tool_choice.get("function", {}).get("name")
            if not any(t.get("function", {}).get("name") == wanted for t in tools):
                self._error(400, f"Tool '{wanted}' not found in tools list.", "BadRequestError")
                return
        choice = chat_choice(self.state, body)
        rid = f"chatcmpl-{uuid.uuid4().hex}"  # serving_base.py _generate_request_id_base
        if body.get("stream"):
            self._stream(chat_stream_chunks(self.state, body, choice, rid))
            return
        response = chat_response(self.state, body, choice, rid)
        usage = response["usage"]
        with Generation(self.state, usage["prompt_tokens"], stream=False) as generation:
            time.sleep(self.state.ttft_s)
            generation.token(usage["completion_tokens"])
        self._json(200, response)

    def _generate(self, body: dict[str, Any]) -> None:
        with self.state.calls_lock:
            self.state.generate_calls += 1
            nth = self.state.generate_calls
        if "generate_error" in self.state.faults or ("generate_flaky" in self.state.faults and nth % 3 == 0):
            self._json(500, {"error": {"message": "fake: generation failed"}})
            return
        outputs = generate_outputs(self.state, body)
        if body.get("stream"):
            self._stream(_sse(outputs))
            return
        last: dict[str, Any] = {}
        for last in outputs:
            pass
        self._json(200, last)


def _sse(outputs: Iterable[dict[str, Any]]) -> Iterable[str]:
    for out in outputs:
        yield f"data: {json.dumps(out)}\n\n"
    yield "data: [DONE]\n\n"


# ----------------------------------------------------------------------------- startup
SITE = "/opt/sglang/lib/python3.11/site-packages"  # where the image installs sglang and torch
# Each failure as the real components print it (tests/unit/test_diagnose_signatures.py holds the same
# texts with their sources): (phase, who prints it, lines). "scheduler": a traceback in a scheduler
# process, which takes the tree down (exit 137); "launcher": the launch process itself (exit 1).
TRACEBACKS = {
    # torch 2.9.1 c10/cuda/CUDACachingAllocator.cpp, during weight load (model_runner.py load_model).
    "oom": ("load", "scheduler", [
        f'  File "{SITE}/sglang/srt/model_executor/model_runner.py", line 987, in load_model',
        "    self.model = self.loader.load_model(",
        f'  File "{SITE}/torch/nn/modules/module.py", line 1369, in to',
        "    return fn(t)",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of "
        "94.97 GiB of which 1.06 GiB is free. Process 41234 has 93.90 GiB memory in use. Of the allocated memory "
        "92.10 GiB is allocated by PyTorch, and 311.52 MiB is reserved by PyTorch but unallocated. If reserved but "
        "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
        "fragmentation.  See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
    ]),
    # cuInit error 3 (HMM): torch 2.9.1 CUDAFunctions.cpp:58/:119 warns, sglang utils/common.py:2059
    # raises in the launcher, before any scheduler starts.
    "cuinit": ("start", "launcher", [
        f"{SITE}/torch/cuda/__init__.py:182: UserWarning: CUDA initialization: CUDA driver initialization "
        "failed, you might not have a CUDA gpu. (Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:119.)",
        "  return torch._C._cuda_getDeviceCount() > 0",
        "Traceback (most recent call last):",
        f'  File "{SITE}/sglang/srt/utils/common.py", line 2059, in get_device',
        '    raise RuntimeError("No accelerator (CUDA, XPU, HPU, NPU, MUSA) is available.")',
        "RuntimeError: No accelerator (CUDA, XPU, HPU, NPU, MUSA) is available.",
    ]),
    # The first NCCL communicator is sglang's own (pynccl_wrapper.py:373-376 NCCL_CHECK); the text
    # is NCCL 2.27.5's ncclGetErrorString (src/init.cc:2376).
    "nccl": ("dist", "scheduler", [
        f'  File "{SITE}/sglang/srt/distributed/device_communicators/pynccl.py", line 121, in __init__',
        "    self.comm: ncclComm_t = self.nccl.ncclCommInitRank(",
        f'  File "{SITE}/sglang/srt/distributed/device_communicators/pynccl_wrapper.py", line 376, in NCCL_CHECK',
        '    raise RuntimeError(f"NCCL error: {error_str}")',
        "RuntimeError: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
    ]),
    # torch 2.9.1 ProcessGroupNCCL.cpp WorkNCCL::checkTimeout (the C++ line number is illustrative).
    "nccl_timeout": ("dist", "scheduler", [
        "[rank1]:[E1201 07:35:43.221307236 ProcessGroupNCCL.cpp:685] [PG ID 2 PG GUID 3(TP) Rank 1] Watchdog "
        "caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
        "Timeout(ms)=600000) ran for 600083 milliseconds before timing out.",
    ]),
    # torch 2.9.1 multinomial via sglang layers/sampler.py:599 (sampling_from_probs_torch).
    "nan": ("warmup", "scheduler", [
        f'  File "{SITE}/sglang/srt/layers/sampler.py", line 599, in sampling_from_probs_torch',
        "    sampled_index = torch.multinomial(probs, num_samples=1)",
        "RuntimeError: probability tensor contains either `inf`, `nan` or element < 0",
    ]),
    # sglang 0.5.9 forward_mha.py:227 -> :450: FlashInfer MLA's PrefillMetadata has no such field.
    "page_table": ("warmup", "scheduler", [
        f'  File "{SITE}/sglang/srt/models/deepseek_common/attention_forward_methods/forward_mha.py", line 227, '
        "in forward_normal_prepare",
        "    kv_a, k_pe = self._get_mla_kv_buffer_from_fp8_for_nsa(forward_batch)",
        f'  File "{SITE}/sglang/srt/models/deepseek_common/attention_forward_methods/forward_mha.py", line 450, '
        "in _get_mla_kv_buffer_from_fp8_for_nsa",
        "    kv_indices = backend.forward_metadata.page_table_1_flattened",
        "AttributeError: 'PrefillMetadata' object has no attribute 'page_table_1_flattened'",
    ]),
    # sglang 0.5.9 model_loader/loader.py:467-470: config.json there, no *.safetensors.
    "weights": ("load", "scheduler", [
        f'  File "{SITE}/sglang/srt/model_loader/loader.py", line 467, in _prepare_weights',
        '    raise RuntimeError(f"Cannot find any model weights with `{model_name_or_path}`")',
        "RuntimeError: Cannot find any model weights with `/model`",
    ]),
}


# What the weights leave on each GPU (the "Load weight end" line above) of its total capacity (the
# OOM text's 94.97 GiB): an RTX PRO 6000 at TP8 holding GLM-5-NVFP4's ~57 GB share.
TOTAL_GPU_GB = 94.97
AVAIL_AFTER_WEIGHTS_GB = 37.10


def kv_pool_tokens(mem_fraction_static: float | None) -> int:
    """sglang 0.5.9 model_runner_kv_cache_mixin.py:143-149 profile_max_num_token: the memory left for the
    KV pool is the available memory less what ``1 - mem_fraction_static`` of the total keeps free; a
    fraction below what the weights already take leaves none. (Unset: the profile's own, which fits.)"""
    if mem_fraction_static is None:
        return MAX_TOTAL_NUM_TOKENS
    rest_gb = AVAIL_AFTER_WEIGHTS_GB - TOTAL_GPU_GB * (1 - mem_fraction_static)
    return MAX_TOTAL_NUM_TOKENS if rest_gb > 0 else 0


def no_kv_pool(mem_fraction_static: float | None) -> list[str]:
    """model_runner_kv_cache_mixin.py:415-419: max_total_num_tokens <= 0 raises in the scheduler."""
    return [f'  File "{SITE}/sglang/srt/model_executor/model_runner_kv_cache_mixin.py", line 416, in init_memory_pool',
            "    raise RuntimeError(",
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
            f"Current value: self.server_args.mem_fraction_static={mem_fraction_static}"]


def die(log: Log, who: str, lines: list[str]) -> None:
    """A scheduler: managers/scheduler.py "Scheduler hit an exception: <traceback>" then SIGQUIT to
    the parent, whose handler (entrypoints/engine.py) logs and kills the tree with SIGKILL (137). The
    launcher: Python prints the traceback and exits 1."""
    if who == "launcher":
        sys.stderr.write("\n".join(lines) + "\n")
        sys.stderr.flush()
        os._exit(1)
    log.scheduler("Scheduler hit an exception: Traceback (most recent call last):\n" + "\n".join(lines))
    log.main("Received sigquit from a child process. It usually means the child failed.")
    os.kill(os.getpid(), signal.SIGKILL)
    os._exit(137)  # as PID 1 without an init the SIGKILL above is ignored


def model_missing(path: str) -> None:
    """transformers 5.2.0, as sglang's ServerArgs reaches AutoConfig in the launcher (exit 1): a path
    that does not exist is taken for a hub id (utils/hub.py:468); a folder without config.json has no
    model type (models/auto/configuration_auto.py:1445-1448)."""
    if os.path.isdir(path):
        message = f"ValueError: Unrecognized model in {path}. Should have a `model_type` key in its config.json."
    else:
        message = (f"OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '{path}'. "
                   "Use `repo_type` argument if needed.")
    sys.stderr.write("Traceback (most recent call last):\n"
                     f'  File "{SITE}/sglang/srt/utils/hf_transformers_utils.py", line 315, in get_config\n'
                     "    config = AutoConfig.from_pretrained(\n" + message + "\n")
    sys.stderr.flush()
    os._exit(1)


class _Server(ThreadingHTTPServer):
    # uvicorn's backlog (2048) rather than socketserver's 5, so high-concurrency sweeps are not
    # measured waiting for accept().
    request_queue_size = 2048


def start_http(state: State) -> ThreadingHTTPServer:
    Handler.state = state
    server = _Server((state.args.host, state.args.port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    log = state.log
    log.uvicorn(f"Started server process [{os.getpid()}]")
    log.uvicorn("Waiting for application startup.")
    log.uvicorn("Application startup complete.")
    log.uvicorn(f"Uvicorn running on http://{state.args.host}:{state.args.port} (Press CTRL+C to quit)")
    return server


def run(argv: list[str]) -> None:
    global STATE
    args = parse_args(argv)
    log = Log(args.tp_size)
    state = State(args, log)
    STATE = state
    crash = os.environ.get("FAKE_SGLANG_CRASH", "")
    if crash and crash not in TRACEBACKS:
        raise SystemExit(f"fake sglang: unknown FAKE_SGLANG_CRASH {crash!r}")
    phase_of_crash = TRACEBACKS[crash][0] if crash else ""
    log.main(server_args_repr(args))
    if not os.path.isfile(os.path.join(args.model_path, "config.json")):
        model_missing(args.model_path)
    if phase_of_crash == "start":
        die(log, *TRACEBACKS[crash][1:])
    log.scheduler("Init torch distributed begin.")  # model_runner.py init_torch_distributed
    if os.environ.get("FAKE_SGLANG_HANG") == "nccl_init":
        while True:  # an all-reduce that never completes: no log line, no port
            signal.pause()
    if phase_of_crash == "dist":
        time.sleep(0.05)
        die(log, *TRACEBACKS[crash][1:])
    log.scheduler("Init torch distributed ends. elapsed=0.52 s, mem usage=0.71 GB")
    log.scheduler("Load weight begin. avail mem=94.12 GB")  # model_runner.py load_model
    time.sleep(env_float("FAKE_SGLANG_LOAD_S", 0.3))
    if phase_of_crash == "load":
        die(log, *TRACEBACKS[crash][1:])
    log.scheduler("Load weight end. elapsed=57.31 s, type=GlmMoeDsaForCausalLM, dtype=torch.bfloat16, "
                  f"avail mem={AVAIL_AFTER_WEIGHTS_GB:.2f} GB, mem usage=57.02 GB.")
    if kv_pool_tokens(args.mem_fraction_static) <= 0:
        die(log, "scheduler", no_kv_pool(args.mem_fraction_static))
    log.scheduler("Memory pool end. avail mem=7.50 GB")  # model_runner_kv_cache_mixin.py
    log.scheduler("Running FlashInfer autotune...")  # model_runner.py _flashinfer_autotune
    time.sleep(env_float("FAKE_SGLANG_AUTOTUNE_S", 0.1))
    log.scheduler("FlashInfer autotune completed.")
    log.scheduler(f"max_total_num_tokens={MAX_TOTAL_NUM_TOKENS}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
                  f"max_running_requests={args.max_running_requests or 1024}, context_len={CONTEXT_LEN}, "
                  "available_gpu_mem=7.40 GB")  # scheduler.py, rank 0
    start_http(state)
    # http_server.py _wait_and_warmup: /model_info then one warm-up /generate; status stays Starting.
    time.sleep(env_float("FAKE_SGLANG_WARMUP_S", 0.2))
    if phase_of_crash == "warmup":
        die(log, *TRACEBACKS[crash][1:])
    warm_up(state)
    state.status = "Up"
    log.main("The server is fired up and ready to roll!")
    while True:
        signal.pause()


STATE: State | None = None  # the running server's, for the signal handler


def drain(state: State) -> None:
    """tokenizer_manager.py:2113-2149: every 5 s, log what remains; exit when nothing does. New
    requests are still served meanwhile (and make the drain longer)."""
    started = time.monotonic()
    while True:
        # The watchdog ticks from the server's start, so the first check comes 0-5 s after the signal.
        time.sleep(state.drain_tick - (time.monotonic() - started) % state.drain_tick)
        with state.calls_lock:
            remaining = sorted(state.inflight)
        state.log.main(f"Gracefully exiting... Remaining number of requests {len(remaining)}. "
                       f"Remaining requests remaining_rids={remaining}.")
        if not remaining:
            os._exit(0)  # as PID 1 the real one ends with SystemExit(0) (utils/common.py:1152-1153)


def on_stop(signum: int, _frame: Any) -> None:
    """SIGTERM after start-up drains (tokenizer_manager.py:2500-2504); before it, and on SIGINT,
    uvicorn's own handler ends the server at once."""
    state = STATE
    if signum == signal.SIGTERM and state is not None and state.status != "Starting" and not state.draining:
        state.log.main("SIGTERM received. signum=None frame=None. Draining requests and shutting down...")
        state.draining = True
        threading.Thread(target=drain, args=(state,), daemon=True).start()
        return
    if state is not None and state.draining:
        return
    sys.stderr.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] Received signal {signum}; exiting\n")
    sys.stderr.flush()
    os._exit(0)


def main() -> None:
    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    run(sys.argv[1:])


if __name__ == "__main__":
    main()
