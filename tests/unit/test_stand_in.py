"""The stand-in server's strictness, checked against what sglang 0.5.9 really does (the texts and
behaviour come from its source; tests/image/test_stand_in_parser.py compares the flag data with the
real parser in the built image)."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from gpunode.stages.serve import readiness

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


@pytest.mark.parametrize(("fraction", "serves"), [("0.05", False), ("0.62", True)])
def test_a_memory_fraction_below_the_weights_leaves_no_kv_pool_as_sglang_says(tmp_path: Path, fraction: str,
                                                                             serves: bool) -> None:
    """sglang 0.5.9 model_runner_kv_cache_mixin.py:143-149 and 415-419: after weights that leave 37.10 of
    94.97 GB, a --mem-fraction-static below 0.61 leaves the KV pool nothing: the scheduler raises, and
    gpunode's diagnosis names it (kv_cache_no_room) with its fix."""
    with fake_server(tmp_path, wait=False, extra_args=["--mem-fraction-static", fraction]) as (process, url):
        result = readiness.wait_ready(process, readiness.HttpHealthProbe(url), timeout_s=30)
        said = process.log_text()
    if serves:
        assert result.ready and "Not enough memory" not in said
    else:
        assert not result.ready and result.diagnosis is not None and result.diagnosis.key == "kv_cache_no_room"
        assert ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: "
                f"self.server_args.mem_fraction_static={fraction}") in said


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


# A stream of this many tokens is ~27 MB (each item carries the whole text so far): far more than a
# socket's buffers hold (Linux's default send buffer tops out at 4 MB, and the test's receive buffer
# is set to a few KB), so a server whose client stops reading blocks with the request in flight.
STREAM_TOKENS = 2000


class HeldStream:
    """A streamed /generate whose first item has been read: the request is in flight, and stays so
    until ``finish()`` reads the rest (the server blocks on the full socket meanwhile)."""

    def __init__(self, url: str, tokens: int) -> None:
        port = int(url.rsplit(":", 1)[1])
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: no autotuning
        sock.connect(("127.0.0.1", port))
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.connection.sock = sock
        body = {"input_ids": [1, 2, 3], "stream": True, "sampling_params": {"max_new_tokens": tokens}}
        self.connection.request("POST", "/generate", json.dumps(body), {"Content-Type": "application/json"})
        self.response = self.connection.getresponse()
        assert self.response.status == 200
        self.first = self._item(self.response.readline())

    @staticmethod
    def _item(line: bytes) -> dict:
        assert line.startswith(b"data: "), line[:80]
        return json.loads(line[len(b"data: "):])

    def finish(self) -> tuple[dict, bool]:
        """The last item, and whether the stream ended with [DONE]."""
        last, done = self.first, False
        for line in self.response:
            if line.startswith(b"data: [DONE]"):
                done = True
            elif line.startswith(b"data: "):
                last = self._item(line)
        self.connection.close()
        return last, done


def until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Poll for an event; the timeout only keeps a broken server from hanging the suite."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not seen in {timeout_s:.0f} s"
        time.sleep(0.02)


def test_sigterm_drains_in_flight_requests_while_health_answers_503(tmp_path: Path) -> None:
    """Ordered by the server's own events, not by sleeps: the request is in flight (its first item
    came back, the rest waits on the test), SIGTERM starts the drain, which logs the request as
    remaining; health answers 503 while the process lives on; the request then completes and the
    drain exits 0."""
    env = {"FAKE_SGLANG_TOKEN_S": "0", "FAKE_SGLANG_DRAIN_TICK_S": "0.3"}
    with fake_server(tmp_path, env=env) as (process, url):
        stream = HeldStream(url, STREAM_TOKENS)
        assert stream.first["meta_info"]["completion_tokens"] == 1
        process.proc.send_signal(signal.SIGTERM)
        # The drain thread starts once the server is draining; its tick counts the held request.
        until(lambda: "Gracefully exiting... Remaining number of requests 1." in process.log_path.read_text(),
              "the drain counting the in-flight request")
        assert status(url, "/health") == 503 and status(url, "/health_generate") == 503
        assert process.proc.poll() is None  # still finishing the request
        last, done = stream.finish()
        assert last["meta_info"]["completion_tokens"] == STREAM_TOKENS and done  # finished, not cut off
        assert process.proc.wait(timeout=30) == 0
        log = process.log_path.read_text().splitlines()

    def first(text: str) -> int:
        return next(index for index, line in enumerate(log) if text in line)

    sigterm = first("SIGTERM received. signum=None frame=None. Draining requests and shutting down...")
    remaining = first("Gracefully exiting... Remaining number of requests 1. Remaining requests remaining_rids=[")
    health = first("Health check request received during shutdown. Returning 503.")
    drained = first("Gracefully exiting... Remaining number of requests 0. Remaining requests remaining_rids=[].")
    assert sigterm < remaining < health < drained
