"""What the smoke test asks and how it judges the answers: pure functions, no I/O.

Shapes follow sglang 0.5.9's OpenAI-compatible server (entrypoints/openai/protocol.py,
serving_chat.py): ``choices[0].message`` has ``content``, ``reasoning_content`` (the glm45
reasoning parser; ``chat_template_kwargs: {"enable_thinking": false}`` turns thinking off) and
``tool_calls`` (``function.name``, ``function.arguments`` a JSON string); a forced call finishes
with ``finish_reason == "tool_calls"``. Streams send deltas of the same fields, a last chunk with
the finish_reason, then ``data: [DONE]``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from gpunode.stages.smoke.client import StreamEvent

KNOWN_QUESTION = "What is 17 + 25? Answer with the number only."
KNOWN_ANSWER = "42"
TOOL_QUESTION = "What is the weather in Paris right now? Use the tool."
TOOL_NAME = "get_weather"
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "the city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
ANSWER_MAX_TOKENS = 32
REASONING_MAX_TOKENS = 128  # enough tokens to time decoding; thinking need not finish to be seen
TOOL_MAX_TOKENS = 128


Verdict = tuple[bool, str]


# ----------------------------------------------------------------------------- requests
def chat_body(served_name: str, question: str, *, thinking: bool, stream: bool, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": served_name,
        "messages": [{"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": stream,
    }
    if not thinking:
        body["chat_template_kwargs"] = {"enable_thinking": False}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def answer_body(served_name: str, *, stream: bool) -> dict[str, Any]:
    return chat_body(served_name, KNOWN_QUESTION, thinking=False, stream=stream, max_tokens=ANSWER_MAX_TOKENS)


def reasoning_body(served_name: str, *, stream: bool) -> dict[str, Any]:
    return chat_body(served_name, KNOWN_QUESTION, thinking=True, stream=stream, max_tokens=REASONING_MAX_TOKENS)


def tool_body(served_name: str, *, stream: bool) -> dict[str, Any]:
    body = chat_body(served_name, TOOL_QUESTION, thinking=False, stream=stream, max_tokens=TOOL_MAX_TOKENS)
    body["tools"] = [WEATHER_TOOL]
    body["tool_choice"] = {"type": "function", "function": {"name": TOOL_NAME}}
    return body


# ----------------------------------------------------------------------------- replies
def first_choice(body: Any) -> tuple[dict[str, Any], str | None] | str:
    """(message, finish_reason) of choices[0], or why the body has none."""
    if not isinstance(body, dict):
        return "the reply is not a JSON object"
    if body.get("object") == "error" or "error" in body:
        return f"the server answered an error: {str(body.get('message') or body.get('error'))[:200]}"
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return "the reply has no choices"
    message = choices[0].get("message")
    if not isinstance(message, dict):
        return "choices[0] has no message"
    return message, choices[0].get("finish_reason")


def _short(text: Any, limit: int = 80) -> str:
    value = repr(text)
    return value if len(value) <= limit else value[: limit - 3] + "..."


def verify_models(body: Any, served_name: str) -> Verdict:
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return False, "no 'data' list in /v1/models"
    names = [item.get("id") for item in data if isinstance(item, dict)]
    if served_name in names:
        return True, f"lists {served_name!r}"
    return False, f"{served_name!r} is not listed (listed: {', '.join(map(str, names)) or 'nothing'})"


def verify_answer(message: dict[str, Any]) -> Verdict:
    content = message.get("content")
    if not isinstance(content, str) or not content.strip():
        return False, f"no content (content={_short(content)})"
    if re.search(rf"(?<!\d){KNOWN_ANSWER}(?!\d)", content):
        return True, f"content {_short(content.strip())} holds {KNOWN_ANSWER}"
    return False, f"content {_short(content.strip())} does not hold {KNOWN_ANSWER} (17 + 25)"


def verify_reasoning_on(message: dict[str, Any]) -> Verdict:
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning.strip():
        return True, f"reasoning_content has {len(reasoning)} characters"
    return False, f"reasoning_content is empty with thinking on ({_short(reasoning)}); is --reasoning-parser glm45 set?"


def verify_reasoning_off(message: dict[str, Any]) -> Verdict:
    reasoning = message.get("reasoning_content")
    if reasoning is None or (isinstance(reasoning, str) and not reasoning.strip()):
        return True, "no reasoning_content with enable_thinking false"
    return False, f"reasoning_content present with enable_thinking false: {_short(reasoning)}"


def verify_tool_calls(tool_calls: Any, finish_reason: Any) -> Verdict:
    """One call to the forced function, arguments a JSON object with the required keys, and
    finish_reason "tool_calls"."""
    if not isinstance(tool_calls, list) or not tool_calls:
        return False, f"no tool_calls (finish_reason={_short(finish_reason)})"
    call: dict[str, Any] = tool_calls[0] if isinstance(tool_calls[0], dict) else {}
    function: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else {}
    name = function.get("name")
    if name != TOOL_NAME:
        return False, f"called {_short(name)}, expected {TOOL_NAME!r}"
    raw = function.get("arguments")
    try:
        arguments = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError as exc:
        return False, f"arguments are not JSON ({exc.msg} at {exc.pos}): {_short(raw)}"
    if not isinstance(arguments, dict):
        return False, f"arguments are not a JSON object: {_short(raw)}"
    required = WEATHER_TOOL["function"]["parameters"]["required"]
    missing = [key for key in required if key not in arguments]
    if missing:
        return False, f"arguments lack {', '.join(missing)}: {_short(raw)}"
    if finish_reason != "tool_calls":
        return False, f"finish_reason {_short(finish_reason)}, expected 'tool_calls'"
    return True, f"{TOOL_NAME}({', '.join(f'{k}={arguments[k]!r}' for k in required)}), finish_reason tool_calls"


# ----------------------------------------------------------------------------- streams
@dataclass
class Assembled:
    """A streamed chat completion put back together from its deltas."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    chunks: int = 0
    text_deltas: int = 0
    first_delta_s: float | None = None  # arrival of the first delta carrying any text
    last_delta_s: float | None = None
    completion_tokens: int | None = None  # from the usage chunk (stream_options.include_usage)
    problems: list[str] = field(default_factory=list)

    def message(self) -> dict[str, Any]:
        return {"content": self.content or None, "reasoning_content": self.reasoning or None,
                "tool_calls": self.tool_calls or None}


def _merge_tool_delta(calls: dict[int, dict[str, Any]], delta: dict[str, Any], position: int) -> None:
    """serving_chat.py sends a call's id and name first, then argument pieces with id and name null."""
    index = delta.get("index")
    index = index if isinstance(index, int) else position
    call = calls.setdefault(index, {"id": None, "type": "function", "function": {"name": None, "arguments": ""}})
    if delta.get("id"):
        call["id"] = delta["id"]
    function = delta.get("function") or {}
    if function.get("name"):
        call["function"]["name"] = function["name"]
    if isinstance(function.get("arguments"), str):
        call["function"]["arguments"] += function["arguments"]


def assemble(events: list[StreamEvent]) -> Assembled:
    out = Assembled()
    calls: dict[int, dict[str, Any]] = {}
    for event in events:
        data = event.data
        out.chunks += 1
        if isinstance(data.get("usage"), dict) and data["usage"].get("completion_tokens") is not None:
            out.completion_tokens = int(data["usage"]["completion_tokens"])
        if "error" in data:
            out.problems.append(f"error event: {str(data['error'])[:200]}")
        for choice in data.get("choices") or []:
            delta = choice.get("delta") or {}
            got_text = False
            for key, attr in (("content", "content"), ("reasoning_content", "reasoning")):
                piece = delta.get(key)
                if isinstance(piece, str) and piece:
                    setattr(out, attr, getattr(out, attr) + piece)
                    got_text = True
            for position, tool_delta in enumerate(delta.get("tool_calls") or []):
                if isinstance(tool_delta, dict):
                    _merge_tool_delta(calls, tool_delta, position)
                    got_text = True
            if got_text:
                out.text_deltas += 1
                out.first_delta_s = event.at_s if out.first_delta_s is None else out.first_delta_s
                out.last_delta_s = event.at_s
            if choice.get("finish_reason"):
                out.finish_reason = choice["finish_reason"]
    out.tool_calls = [calls[index] for index in sorted(calls)]
    return out


def decode_rate(assembled: Assembled) -> float | None:
    """Single-stream decode speed, tokens/s, between the first and the last text delta."""
    if assembled.first_delta_s is None or assembled.last_delta_s is None:
        return None
    span = assembled.last_delta_s - assembled.first_delta_s
    tokens = assembled.completion_tokens if assembled.completion_tokens is not None else assembled.text_deltas
    if span <= 0 or tokens < 2:
        return None
    return (tokens - 1) / span
