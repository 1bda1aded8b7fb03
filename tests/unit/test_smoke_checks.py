"""The smoke test's judging, on reply shapes as sglang 0.5.9 builds them (protocol.py, serving_chat.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpunode.stages.smoke import checks
from gpunode.stages.smoke.client import StreamEvent


def chunk(delta: dict[str, Any], finish: str | None = None, usage: dict[str, Any] | None = None) -> dict[str, Any]:
    full = {"role": None, "content": None, "reasoning_content": None, "tool_calls": None, **delta}
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "glm-5", "usage": usage,
            "choices": [{"index": 0, "delta": full, "logprobs": None, "finish_reason": finish, "matched_stop": None}]}


def events(*datas: dict[str, Any]) -> list[StreamEvent]:
    return [StreamEvent(0.1 * (i + 1), data) for i, data in enumerate(datas)]


def call(name: str = "get_weather", arguments: str = '{"city": "Paris", "unit": "celsius"}') -> list[dict[str, Any]]:
    return [{"id": "call_1", "index": 0, "type": "function", "function": {"name": name, "arguments": arguments}}]


def test_requests_ask_what_the_checks_need() -> None:
    off = checks.answer_body("glm-5", stream=False)
    assert off["temperature"] == 0 and off["chat_template_kwargs"] == {"enable_thinking": False}
    assert "17 + 25" in off["messages"][0]["content"]
    on = checks.reasoning_body("glm-5", stream=True)
    assert "chat_template_kwargs" not in on and on["stream_options"] == {"include_usage": True}
    tool = checks.tool_body("glm-5", stream=False)
    assert tool["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert tool["tools"][0]["function"]["parameters"]["required"] == ["city", "unit"]


def test_known_answer() -> None:
    assert checks.verify_answer({"content": "42"})[0]
    assert checks.verify_answer({"content": "The answer is 42."})[0]
    ok, detail = checks.verify_answer({"content": "41"})
    assert not ok and "does not hold 42" in detail
    assert not checks.verify_answer({"content": "420"})[0]
    assert not checks.verify_answer({"content": None})[0]


def test_reasoning_on_and_off() -> None:
    assert checks.verify_reasoning_on({"reasoning_content": "17 + 25 = 42"})[0]
    assert not checks.verify_reasoning_on({"reasoning_content": None})[0]
    assert checks.verify_reasoning_off({"reasoning_content": None})[0]
    assert checks.verify_reasoning_off({"reasoning_content": ""})[0]
    ok, detail = checks.verify_reasoning_off({"reasoning_content": "thinking anyway"})
    assert not ok and "enable_thinking false" in detail


def test_tool_call_verdicts() -> None:
    assert checks.verify_tool_calls(call(), "tool_calls") == (
        True, "get_weather(city='Paris', unit='celsius'), finish_reason tool_calls")
    cases = {
        "called 'other_function'": (call(name="other_function"), "tool_calls"),
        "arguments are not JSON": (call(arguments='{"city": "Paris"'), "tool_calls"),
        "arguments lack unit": (call(arguments='{"city": "Paris"}'), "tool_calls"),
        "not a JSON object": (call(arguments="[1]"), "tool_calls"),
        "finish_reason 'stop'": (call(), "stop"),
        "no tool_calls": (None, "tool_calls"),
    }
    for expected, (calls, finish) in cases.items():
        ok, detail = checks.verify_tool_calls(calls, finish)
        assert not ok and expected in detail, (expected, detail)


def test_first_choice_reports_errors_and_odd_bodies() -> None:
    assert checks.first_choice({"object": "error", "message": "Tool 'x' not found", "code": 400}) == (
        "the server answered an error: Tool 'x' not found")
    assert checks.first_choice([]) == "the reply is not a JSON object"
    assert checks.first_choice({"choices": []}) == "the reply has no choices"
    assert checks.first_choice({"choices": [{"message": {"content": "42"}, "finish_reason": "stop"}]}) == (
        {"content": "42"}, "stop")


def test_models() -> None:
    assert checks.verify_models({"object": "list", "data": [{"id": "glm-5"}]}, "glm-5")[0]
    ok, detail = checks.verify_models({"data": [{"id": "default"}]}, "glm-5")
    assert not ok and "default" in detail


def test_stream_assembly_of_content_reasoning_and_tool_calls() -> None:
    streamed = checks.assemble(events(
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning_content": "17 + 25 "}),
        chunk({"reasoning_content": "= 42"}),
        chunk({"tool_calls": [{"id": "call_1", "index": 0, "type": "function",
                               "function": {"name": "get_weather", "arguments": ""}}]}),
        chunk({"tool_calls": [{"id": None, "index": 0, "type": "function",
                               "function": {"name": None, "arguments": '{"city": "Par'}}]}),
        chunk({"tool_calls": [{"id": None, "index": 0, "type": "function",
                               "function": {"name": None, "arguments": 'is", "unit": "celsius"}'}}]}),
        chunk({}, "tool_calls"),
        {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [],
         "usage": {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14}},
    ))
    assert streamed.reasoning == "17 + 25 = 42" and streamed.content == ""
    assert streamed.finish_reason == "tool_calls" and streamed.completion_tokens == 5
    assert json.loads(streamed.tool_calls[0]["function"]["arguments"]) == {"city": "Paris", "unit": "celsius"}
    assert streamed.tool_calls[0]["function"]["name"] == "get_weather" and streamed.tool_calls[0]["id"] == "call_1"
    assert checks.verify_tool_calls(streamed.tool_calls, streamed.finish_reason)[0]
    assert streamed.first_delta_s == pytest.approx(0.2) and streamed.last_delta_s == pytest.approx(0.6)
    assert checks.decode_rate(streamed) == pytest.approx((5 - 1) / (0.6 - 0.2))


def test_stream_error_event_is_a_problem() -> None:
    streamed = checks.assemble(events({"error": {"message": "boom", "code": 400}}))
    assert streamed.problems and "boom" in streamed.problems[0]
    assert checks.decode_rate(streamed) is None
