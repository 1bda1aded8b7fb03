"""A small HTTP client for the checks: JSON requests and Server-Sent-Event streams, each timed.

Errors never raise: a reply carries the status (None when the server could not be reached) and an
error text, so that every check can say what happened. The API key travels only in the
Authorization header and is never part of a reply.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import requests

REQUEST_TIMEOUT_S = 300.0  # a long answer from GLM-5 at ~10 tok/s single stream takes tens of seconds
CONNECT_TIMEOUT_S = 5.0


@dataclass
class Reply:
    status: int | None
    body: Any = None  # parsed JSON, None when the body was not JSON
    text: str = ""  # the raw body, cut short, for details
    seconds: float = 0.0
    error: str = ""  # why there is no status or no JSON


@dataclass
class StreamEvent:
    at_s: float  # since the request was sent
    data: dict[str, Any]


@dataclass
class StreamReply:
    status: int | None
    events: list[StreamEvent] = field(default_factory=list)
    done: bool = False  # "data: [DONE]" was seen
    seconds: float = 0.0
    error: str = ""
    text: str = ""  # the body of a non-200 answer


class Api:
    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = (CONNECT_TIMEOUT_S, timeout_s)
        self.session = requests.Session()
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"
        self.http_seconds = 0.0  # time spent waiting on the server, summed over all requests

    def _reply(self, response: requests.Response, began: float) -> Reply:
        seconds = time.perf_counter() - began
        self.http_seconds += seconds
        try:
            body = response.json()
            error = ""
        except ValueError:
            body, error = None, "the body is not JSON"
        return Reply(response.status_code, body, response.text[:500], seconds, error)

    def get(self, path: str, timeout_s: float | None = None) -> Reply:
        began = time.perf_counter()
        try:
            response = self.session.get(self.base_url + path,
                                        timeout=(CONNECT_TIMEOUT_S, timeout_s) if timeout_s else self.timeout)
        except requests.RequestException as exc:
            self.http_seconds += time.perf_counter() - began
            return Reply(None, seconds=time.perf_counter() - began, error=_reason(exc))
        return self._reply(response, began)

    def post(self, path: str, body: dict[str, Any]) -> Reply:
        began = time.perf_counter()
        try:
            response = self.session.post(self.base_url + path, json=body, timeout=self.timeout)
        except requests.RequestException as exc:
            self.http_seconds += time.perf_counter() - began
            return Reply(None, seconds=time.perf_counter() - began, error=_reason(exc))
        return self._reply(response, began)

    def stream(self, path: str, body: dict[str, Any]) -> StreamReply:
        """POST with ``stream: true`` and collect the SSE ``data:`` events with their arrival times."""
        began = time.perf_counter()
        reply = StreamReply(None)
        try:
            with self.session.post(self.base_url + path, json=body, timeout=self.timeout, stream=True) as response:
                reply.status = response.status_code
                if response.status_code != 200:
                    reply.text = response.text[:500]
                else:
                    _read_events(response, began, reply)
        except requests.RequestException as exc:
            reply.error = _reason(exc)
        reply.seconds = time.perf_counter() - began
        self.http_seconds += reply.seconds
        return reply


def _read_events(response: requests.Response, began: float, reply: StreamReply) -> None:
    for raw in response.iter_lines():
        line = raw.decode("utf-8", errors="replace").strip() if raw else ""
        if not line.startswith("data:"):
            continue  # blank separators, comments
        payload = line[len("data:"):].strip()
        if payload == "[DONE]":
            reply.done = True
            continue
        try:
            data = json.loads(payload)
        except ValueError:
            reply.error = f"an event is not JSON: {payload[:120]}"
            continue
        if isinstance(data, dict):
            reply.events.append(StreamEvent(time.perf_counter() - began, data))


def _reason(exc: requests.RequestException) -> str:
    if isinstance(exc, requests.ConnectionError):
        return f"cannot connect: {type(exc).__name__}"
    if isinstance(exc, requests.Timeout):
        return "timed out"
    return f"{type(exc).__name__}: {exc}"[:300]
