"""The stand-in server's Prometheus /metrics, checked against what sglang 0.5.9 and 0.5.23 expose
(names, types, HELP texts and label names as their wheels create them: the stand-in's FAMILIES
cites each line). prometheus_client is not in this venv, so the exposition is read by the strict
reader below (the text format 0.0.4 as prometheus_client's generate_latest writes it); the stand-in's
output was compared once, family by family, with what the real prometheus_client 0.24.1 and 0.26.0
print in multiprocess mode for the same values, and matched byte for byte."""

from __future__ import annotations

import gzip
import json
import math
import re
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fakes.process import fake_server  # noqa: E402 - tests/ put on the path just above
from test_stand_in import until  # noqa: E402 - this folder put on the path just above

VERSIONS = ["0.5.9", "0.5.23"]
METRICS = ["--enable-metrics"]
NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\n"])*)"(,|$)')
UNESCAPE = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}

Labels = frozenset[tuple[str, str]]


class Family:
    def __init__(self, name: str, help_text: str, kind: str) -> None:
        self.name, self.help, self.kind = name, help_text, kind
        self.samples: dict[tuple[str, Labels], float] = {}

    def series(self, suffix: str = "") -> dict[Labels, float]:
        return {labels: value for (name, labels), value in self.samples.items() if name == self.name + suffix}


def parse_labels(text: str) -> Labels:
    labels: dict[str, str] = {}
    at = 0
    while at < len(text):
        match = LABEL.match(text, at)
        assert match, f"bad label text at {text[at:]!r}"
        key = match.group(1)
        assert key not in labels, f"label {key} twice"
        labels[key] = re.sub(r'\\[\\n"]', lambda m: UNESCAPE[m.group(0)], match.group(2))
        at = match.end()
    assert list(labels) == sorted(labels), f"labels not sorted by name: {text}"  # generate_latest sorts them
    return frozenset(labels.items())


def parse(text: str) -> dict[str, Family]:
    """The text format, strictly: each family a HELP line, then its TYPE line, then its samples; a
    sample named as its type allows (a histogram's _bucket, _sum, _count); no series twice; values
    Go floats; and a histogram's buckets cumulative up to +Inf, which equals _count."""
    assert text.endswith("\n"), "the exposition ends with a newline"
    families: dict[str, Family] = {}
    family: Family | None = None
    lines = text[:-1].split("\n")
    for number, line in enumerate(lines):
        if line.startswith("# HELP "):
            name, _, help_text = line[len("# HELP "):].partition(" ")
            assert NAME.fullmatch(name) and name not in families, f"line {number}: {line}"
            kind_line = lines[number + 1]
            assert kind_line.startswith(f"# TYPE {name} "), f"line {number + 1}: TYPE must follow HELP: {kind_line}"
            family = families[name] = Family(name, help_text, kind_line.rsplit(" ", 1)[1])
            assert family.kind in ("counter", "gauge", "histogram", "summary", "untyped"), kind_line
            continue
        if line.startswith("# TYPE "):
            assert family is not None and line == f"# TYPE {family.name} {family.kind}", f"line {number}: {line}"
            continue
        match = SAMPLE.fullmatch(line)
        assert match and family is not None, f"line {number}: not a sample of a declared family: {line!r}"
        name, label_text, value_text = match.groups()
        suffixes = ("_bucket", "_sum", "_count") if family.kind == "histogram" else ("",)
        allowed = {family.name + suffix for suffix in suffixes}
        assert name in allowed, f"line {number}: {name} in family {family.name} ({family.kind})"
        labels = parse_labels(label_text or "")
        assert (name, labels) not in family.samples, f"line {number}: series twice: {line}"
        assert value_text in ("+Inf", "-Inf", "NaN") or re.fullmatch(r"-?\d+\.\d+(e[+-]\d+)?|-?\d(\.\d+)?e[+-]\d+",
                                                                    value_text), f"line {number}: value {value_text}"
        family.samples[(name, labels)] = float(value_text)
    for family in families.values():
        if family.kind == "histogram":
            check_histogram(family)
    return families


def check_histogram(family: Family) -> None:
    for labels, count in family.series("_count").items():
        assert labels in family.series("_sum"), f"{family.name}{dict(labels)} has no _sum"
        buckets = sorted((float(dict(bucket)["le"]), value) for bucket, value in family.series("_bucket").items()
                         if bucket - {("le", dict(bucket)["le"])} == labels)
        assert buckets and buckets[-1][0] == math.inf and buckets[-1][1] == count, f"{family.name}: +Inf != _count"
        assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:])), f"{family.name}: buckets not cumulative"


def scrape(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url + "/metrics", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def metrics(url: str) -> dict[str, Family]:
    status, headers, body = scrape(url)
    assert status == 200 and headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    return parse(body.decode())


def settled(url: str, name: str, want: float, **labels: str) -> dict[str, Family]:
    """/metrics once ``name`` has reached ``want``: 0.5.23 counts a response after its body went out
    (utils/http_middleware_patch.py:38-48), so a client that has the body may ask before the count
    moves; at most 5 s."""
    deadline = time.monotonic() + 5
    while True:
        families = metrics(url)
        if value(families, name, **labels) >= want or time.monotonic() > deadline:
            return families
        time.sleep(0.05)


def value(families: dict[str, Family], name: str, suffix: str = "", **labels: str) -> float:
    """The sum over the series of ``name`` whose labels include ``labels`` (0 when there is none)."""
    family = families.get(name)
    if family is None:
        return 0.0
    return sum(v for key, v in family.series(suffix).items() if set(labels.items()) <= key)


def post(url: str, path: str, body: dict[str, Any], key: str | None = None) -> bytes:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers=headers)
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.read()


# What each version creates (0.5.9 sglang/srt/metrics/collector.py and utils/common.py; 0.5.23
# sglang/srt/observability/metrics_collector.py and http_request_metrics.py).
SCHEDULER = {"engine_type", "model_name", "moe_ep_rank", "pp_rank", "tp_rank"}
TYPES_AND_HELP = {
    "sglang:num_running_reqs": ("gauge", "The number of running requests."),
    "sglang:num_queue_reqs": ("gauge", "The number of requests in the waiting queue."),
    "sglang:token_usage": ("gauge", "The token usage."),
    "sglang:gen_throughput": ("gauge", "The generation throughput (token/s)."),
    "sglang:cache_hit_rate": ("gauge", "The prefix cache hit rate."),
    "sglang:prompt_tokens_total": ("counter", "Number of prefill tokens processed."),
    "sglang:generation_tokens_total": ("counter", "Number of generation tokens processed."),
    "sglang:num_requests_total": ("counter", "Number of requests processed."),
    "sglang:time_to_first_token_seconds": ("histogram", "Histogram of time to first token in seconds."),
    "sglang:e2e_request_latency_seconds": ("histogram", "Histogram of End-to-end request latency in seconds"),
    "sglang:http_requests_total": ("counter", "Total number of HTTP requests by endpoint and method"),
    "sglang:http_responses_total": ("counter", "Total number of HTTP responses by endpoint and status code"),
}
TOKENIZER = {"0.5.9": {"model_name"}, "0.5.23": {"model_name", "engine_type", "is_streaming"}}


@pytest.mark.parametrize("version", VERSIONS)
def test_without_enable_metrics_there_is_no_metrics_route(tmp_path: Path, version: str) -> None:
    """Nothing is mounted at /metrics: FastAPI's 404, not a 401, even with an API key (the key check
    lets /metrics through whether or not it is mounted)."""
    with fake_server(tmp_path, api_key="sk-lab", env={"FAKE_SGLANG_VERSION": version}) as (_process, url):
        status, _headers, body = scrape(url)
    assert status == 404 and json.loads(body) == {"detail": "Not Found"}


@pytest.mark.parametrize("version", VERSIONS)
def test_the_exposition_has_each_versions_names_types_and_labels(tmp_path: Path, version: str) -> None:
    with fake_server(tmp_path, env={"FAKE_SGLANG_VERSION": version}, extra_args=METRICS) as (_process, url):
        families = metrics(url)
        status, headers, body = scrape(url, {"Accept-Encoding": "gzip"})
    assert status == 200 and headers["content-encoding"] == "gzip" and parse(gzip.decompress(body).decode())
    for name, (kind, help_text) in TYPES_AND_HELP.items():
        assert (families[name].kind, families[name].help) == (kind, help_text), name
    tokenizer = TOKENIZER[version]
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:gen_throughput",
                 "sglang:cache_hit_rate", "sglang:num_used_tokens"):
        # Only TP rank 0 of the two reports (no --enable-metrics-for-all-schedulers).
        (labels,) = families[name].series()
        assert {key for key, _ in labels} == SCHEDULER, name
        assert dict(labels) == {"engine_type": "unified", "model_name": "glm-5", "moe_ep_rank": "0", "pp_rank": "0",
                                "tp_rank": "0"}
    for name in ("sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:num_requests_total"):
        assert {key for key, _ in next(iter(families[name].series()))} == tokenizer, name
    for name in ("sglang:time_to_first_token_seconds", "sglang:e2e_request_latency_seconds"):
        assert {key for key, _ in next(iter(families[name].series("_count")))} == tokenizer, name
    # 0.5.23 emits max_total_num_tokens from every rank at start-up; 0.5.9 with rank 0's log_stats.
    ranks = {dict(labels)["tp_rank"] for labels in families["sglang:max_total_num_tokens"].series()}
    assert ranks == ({"0"} if version == "0.5.9" else {"0", "1"})
    assert value(families, "sglang:max_total_num_tokens", tp_rank="0") == 1651200
    # The warm-up (GET /model_info, then an 8-token /generate of a 6-word prompt) is counted.
    assert value(families, "sglang:num_requests_total") == 1 and value(families, "sglang:generation_tokens_total") == 8
    assert value(families, "sglang:prompt_tokens_total") == 6
    assert value(families, "sglang:http_requests_total", endpoint="/model_info", method="GET") == 1
    assert value(families, "sglang:http_responses_total", endpoint="/generate", method="POST", status_code="200") == 1
    # The scrape counts itself on the way in.
    assert value(families, "sglang:http_requests_active", endpoint="/metrics", method="GET") == 1
    assert {key for key, _ in next(iter(families["sglang:http_responses_total"].series()))} == {
        "endpoint", "method", "status_code"}


@pytest.mark.parametrize("version", VERSIONS)
def test_metrics_need_no_api_key_and_a_refused_request_is_not_counted(tmp_path: Path, version: str) -> None:
    with fake_server(tmp_path, api_key="sk-lab", env={"FAKE_SGLANG_VERSION": version},
                     extra_args=METRICS) as (_process, url):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url + "/v1/models", timeout=30)
        assert refused.value.code == 401
        post(url, "/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 3}}, key="sk-lab")
        families = settled(url, "sglang:http_responses_total", 2, endpoint="/generate", status_code="200")  # no key
    assert value(families, "sglang:http_requests_total", endpoint="/v1/models") == 0
    assert value(families, "sglang:http_responses_total", endpoint="/generate", status_code="200") == 2  # + warm-up


@pytest.mark.parametrize("version", VERSIONS)
def test_counters_grow_by_what_was_served(tmp_path: Path, version: str) -> None:
    with fake_server(tmp_path, env={"FAKE_SGLANG_VERSION": version}, extra_args=METRICS) as (_process, url):
        before = metrics(url)
        post(url, "/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 7}})
        streamed = post(url, "/generate", {"text": "one two three four", "stream": True,
                                           "sampling_params": {"max_new_tokens": 5}})
        chat = json.loads(post(url, "/v1/chat/completions", {"model": "glm-5", "messages": [
            {"role": "user", "content": "17 + 25?"}]}))
        chat_label = {"endpoint": "/v1/chat/completions", "status_code": "200"}
        after = settled(url, "sglang:http_responses_total",
                        value(before, "sglang:http_responses_total", **chat_label) + 1, **chat_label)
    assert streamed.decode().count("data: {") == 5
    usage = chat["usage"]

    def grew(name: str, suffix: str = "", **labels: str) -> float:
        return value(after, name, suffix, **labels) - value(before, name, suffix, **labels)

    assert grew("sglang:num_requests_total") == 3
    assert grew("sglang:prompt_tokens_total") == 3 + 4 + usage["prompt_tokens"]
    assert grew("sglang:generation_tokens_total") == 7 + 5 + usage["completion_tokens"]
    assert grew("sglang:time_to_first_token_seconds", "_count") == 3
    assert grew("sglang:e2e_request_latency_seconds", "_count") == 3
    assert grew("sglang:http_requests_total", endpoint="/generate", method="POST") == 2
    assert grew("sglang:http_responses_total", endpoint="/v1/chat/completions", status_code="200") == 1
    if version == "0.5.23":  # the streamed one under is_streaming="true"
        assert grew("sglang:generation_tokens_total", is_streaming="true") == 5
        assert grew("sglang:num_requests_total", is_streaming="false") == 2


@pytest.mark.parametrize("version", VERSIONS)
def test_running_and_queued_gauges_follow_slow_requests(tmp_path: Path, version: str) -> None:
    """Two requests of 100 tokens at 20 ms a token, one slot (--max-running-requests 1): while the
    first runs the second waits, and the scheduler's decode log (every 5 steps here) reports 1
    running, 1 queued; once both end, the idle refresh brings both gauges back to 0."""
    env = {"FAKE_SGLANG_VERSION": version, "FAKE_SGLANG_TOKEN_S": "0.02", "FAKE_SGLANG_METRICS_IDLE_S": "0.5"}
    args = [*METRICS, "--decode-log-interval", "5", "--max-running-requests", "1"]
    with fake_server(tmp_path, env=env, extra_args=args) as (_process, url):
        before = metrics(url)
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 100}}
        done: list[bytes] = []
        threads = [threading.Thread(target=lambda: done.append(post(url, "/generate", body))) for _ in range(2)]
        for thread in threads:
            thread.start()
        seen: dict[str, float] = {}

        def both_reported() -> bool:
            families = metrics(url)
            seen.update(running=value(families, "sglang:num_running_reqs"),
                        queued=value(families, "sglang:num_queue_reqs"),
                        throughput=value(families, "sglang:gen_throughput"),
                        used=value(families, "sglang:num_used_tokens"))
            return seen["running"] == 1 and seen["queued"] == 1

        until(both_reported, "1 running and 1 queued")
        assert seen["throughput"] > 0 and seen["used"] > 3
        for thread in threads:
            thread.join(timeout=60)
        assert len(done) == 2

        def drained() -> bool:
            families = metrics(url)
            return value(families, "sglang:num_running_reqs") == 0 and value(families, "sglang:num_queue_reqs") == 0

        until(drained, "the gauges back at 0")
        after = metrics(url)
    assert value(after, "sglang:generation_tokens_total") - value(before, "sglang:generation_tokens_total") == 200
    assert value(after, "sglang:token_usage") == 0 and value(after, "sglang:gen_throughput") == 0


def test_0_5_9_holds_the_running_gauge_until_its_idle_refresh(tmp_path: Path) -> None:
    """0.5.9 refreshes an idle scheduler's stats only 30 s after its last log: right after a request
    ends, /metrics still counts it (0.5.23 refreshes at once, the previous test's case)."""
    env = {"FAKE_SGLANG_VERSION": "0.5.9", "FAKE_SGLANG_TOKEN_S": "0.02"}
    with fake_server(tmp_path, env=env, extra_args=[*METRICS, "--decode-log-interval", "5"]) as (_process, url):
        post(url, "/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 50}})
        families = metrics(url)
    assert value(families, "sglang:num_running_reqs") == 1
