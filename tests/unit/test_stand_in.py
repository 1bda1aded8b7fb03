"""The stand-in server's strictness, checked against what sglang 0.5.9 really does (the texts and
behaviour come from its source; tests/image/test_stand_in_parser.py compares the flag data with the
real parser in the built image)."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gpunode.serve import readiness

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.process import fake_server  # noqa: E402 - tests/ put on the path just above


def post(url: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def status(url: str, path: str) -> int:
    try:
        with urllib.request.urlopen(url + path, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.parametrize(("args", "error"), [
    (["--disable-radix-cahce"], "launch_server.py: error: unrecognized arguments: --disable-radix-cahce"),
    (["--kv-cache-dtype", "bf61"], "launch_server.py: error: argument --kv-cache-dtype: invalid choice: 'bf61' "
                                   "(choose from 'auto', 'fp8_e5m2', 'fp8_e4m3', 'bf16', 'bfloat16', 'fp4_e2m1')"),
    (["--tp-size", "8x"], "launch_server.py: error: argument --tensor-parallel-size/--tp-size: invalid int value: '8x'"),
])
def test_a_bad_flag_exits_2_with_the_real_parsers_words(tmp_path: Path, args: list[str], error: str) -> None:
    """The three cases were run against sglang 0.5.9 in the image: exit 2, this last stderr line."""
    with fake_server(tmp_path, wait=False, extra_args=args) as (process, url):
        result = readiness.wait_ready(process, lambda: None, timeout_s=10)
        assert process.proc.wait(timeout=10) == 2
        lines = process.log_text().splitlines()
    assert lines[0].startswith("usage: launch_server.py [-h] --model-path MODEL_PATH")
    assert lines[-1] == error
    assert result.diagnosis is not None and result.diagnosis.key == "bad_argument" and result.diagnosis.evidence == error


def test_without_parser_flags_reasoning_and_tool_calls_stay_text(tmp_path: Path) -> None:
    with fake_server(tmp_path, parsers=False) as (_process, url):
        chat = post(url, "/v1/chat/completions", {"model": "glm-5", "messages": [{"role": "user", "content": "17 + 25?"}]})
        message = chat["choices"][0]["message"]
        assert message["reasoning_content"] is None and "</think>42" in message["content"]
        tool = {"type": "function", "function": {"name": "weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
        forced = post(url, "/v1/chat/completions", {"model": "glm-5", "messages": [{"role": "user", "content": "hi"}],
                                                    "tools": [tool], "tool_choice": "required"})
        choice = forced["choices"][0]
        assert choice["message"]["tool_calls"] is None and choice["finish_reason"] == "stop"
        assert json.loads(choice["message"]["content"]) == [{"name": "weather", "parameters": {"city": "Paris"}}]
    with fake_server(tmp_path) as (_process, url):
        chat = post(url, "/v1/chat/completions", {"model": "glm-5", "messages": [{"role": "user", "content": "17 + 25?"}]})
        assert chat["choices"][0]["message"]["reasoning_content"] and chat["choices"][0]["message"]["content"] == "42"


def test_sigterm_drains_in_flight_requests_while_health_answers_503(tmp_path: Path) -> None:
    env = {"FAKE_SGLANG_TOKEN_S": "0.01", "FAKE_SGLANG_DRAIN_TICK_S": "0.3"}
    with fake_server(tmp_path, env=env) as (process, url):
        done: dict = {}
        slow = threading.Thread(target=lambda: done.update(post(url, "/generate", {
            "input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 150}})))
        slow.start()
        time.sleep(0.3)
        process.proc.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        assert status(url, "/health") == 503 and status(url, "/health_generate") == 503
        assert process.proc.poll() is None  # still finishing the request
        slow.join(timeout=30)
        assert done["meta_info"]["completion_tokens"] == 150  # the in-flight request was finished
        assert process.proc.wait(timeout=10) == 0
        log = process.log_text()
    assert "SIGTERM received. signum=None frame=None. Draining requests and shutting down..." in log
    assert "Health check request received during shutdown. Returning 503." in log
    assert "Gracefully exiting... Remaining number of requests 1. Remaining requests remaining_rids=[" in log
    assert "Gracefully exiting... Remaining number of requests 0. Remaining requests remaining_rids=[]." in log
