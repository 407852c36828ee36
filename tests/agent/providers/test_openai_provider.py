"""OpenAIChatProvider against a local OpenAI-compatible server: what goes over the wire, what
comes back."""

from __future__ import annotations

from typing import Any

import pytest
from provider_servers import OPENAI_KEY, ScriptedServer

from agent.errors import ProviderHTTPError, ProviderResponseError, not_resumable_reason
from agent.messages import LLMRequest, LLMResponse, ToolCall, assistant_message, tool_message
from agent.providers.openai import OpenAIChatProvider

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "inputSchema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def completion(
    content: str | None,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: str = "stop",
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "gpt-test-2025",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 31, "completion_tokens": 9, "total_tokens": 40},
    }


def function_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.fixture
def provider(server: ScriptedServer) -> OpenAIChatProvider:
    return OpenAIChatProvider("gpt-test", base_url=f"{server.origin}/v1", api_key=OPENAI_KEY)


def test_tool_call_round_then_final_answer(
    server: ScriptedServer, provider: OpenAIChatProvider
) -> None:
    # Given a server that asks for a tool, then answers
    server.reply(
        200,
        completion(
            None, [function_call("call_1", "get_weather", '{"city":"Paris"}')], "tool_calls"
        ),
    )
    server.reply(200, completion("Sunny, 21 °C in Paris."))
    user = {
        "role": "user",
        "content": "Weather in Paris?",
        "futureThing": {"kept": "in the record"},
    }
    first = LLMRequest(
        system_prompt="You are terse.", messages=[user], tools=[WEATHER_TOOL], model="agent-model"
    )

    # When the first call is made
    response = provider.complete(first)

    # Then the tool call comes back parsed, with usage and the finish reason
    assert response == LLMResponse(
        content="",
        tool_calls=(ToolCall(id="call_1", name="get_weather", args={"city": "Paris"}),),
        usage={
            "inputTokens": 31,
            "outputTokens": 9,
            "raw": {"prompt_tokens": 31, "completion_tokens": 9, "total_tokens": 40},
        },
        stop_reason="tool_calls",
    )
    # And the server got a Chat Completions request: system first, unknown keys dropped
    sent = server.received[0]
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert sent.headers["content-type"] == "application/json"
    assert sent.json() == {
        "model": "gpt-test",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Weather in Paris?"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Current weather for a city.",
                    "parameters": WEATHER_TOOL["inputSchema"],
                },
            }
        ],
    }

    # When the conversation goes on with the assistant turn and the tool's result
    assistant = assistant_message(response)
    assistant["toolCalls"][0]["providerMeta"] = {"gemini": "signature"}
    history = [user, assistant, tool_message("call_1", "get_weather", '{"temp":21}')]
    final = provider.complete(
        LLMRequest(
            system_prompt="You are terse.", messages=history, tools=[WEATHER_TOOL], model="m"
        )
    )

    # Then the answer is the content, and the tool round went out in OpenAI's shape
    assert final.content == "Sunny, 21 °C in Paris."
    assert final.tool_calls == () and final.stop_reason == "stop"
    assert server.received[1].json()["messages"][1:] == [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [function_call("call_1", "get_weather", '{"city":"Paris"}')],
        },
        {"role": "tool", "content": '{"temp":21}', "tool_call_id": "call_1"},
    ]


def test_no_system_message_and_no_tools_when_there_are_none(
    server: ScriptedServer, provider: OpenAIChatProvider
) -> None:
    server.reply(200, completion("hello"))

    provider.complete(
        LLMRequest(
            system_prompt="", messages=[{"role": "user", "content": "hi"}], tools=[], model="m"
        )
    )

    assert server.received[0].json() == {
        "model": "gpt-test",
        "messages": [{"role": "user", "content": "hi"}],
    }


def test_assistant_text_beside_tool_calls_and_several_calls(
    server: ScriptedServer, provider: OpenAIChatProvider
) -> None:
    server.reply(
        200,
        completion(
            "Checking both.",
            [
                function_call("a", "get_weather", '{"city": "Oslo"}'),
                function_call("b", "get_time", ""),
            ],
            "tool_calls",
        ),
    )

    response = provider.complete(
        LLMRequest(
            system_prompt="", messages=[{"role": "user", "content": "x"}], tools=[], model="m"
        )
    )

    assert response.content == "Checking both."
    assert [(c.id, c.name, dict(c.args)) for c in response.tool_calls] == [
        ("a", "get_weather", {"city": "Oslo"}),
        ("b", "get_time", {}),
    ]

    # And echoed back, the text stays beside the calls and arguments go out as compact JSON
    server.reply(200, completion("done"))
    history = [{"role": "user", "content": "x"}, assistant_message(response)]
    provider.complete(LLMRequest("", history, [], "m"))
    assert server.received[1].json()["messages"][1] == {
        "role": "assistant",
        "content": "Checking both.",
        "tool_calls": [
            function_call("a", "get_weather", '{"city":"Oslo"}'),
            function_call("b", "get_time", "{}"),
        ],
    }


def test_a_refusal_is_the_answer(server: ScriptedServer, provider: OpenAIChatProvider) -> None:
    body = completion(None)
    body["choices"][0]["message"]["refusal"] = "I can't help with that."
    server.reply(200, body)

    response = provider.complete(LLMRequest("", [{"role": "user", "content": "x"}], [], "m"))

    assert response.content == "I can't help with that."


@pytest.mark.parametrize("arguments", ['{"city": "Par', "[1]", '"Paris"'])
def test_tool_arguments_that_are_not_a_json_object_are_a_response_error(
    server: ScriptedServer, provider: OpenAIChatProvider, arguments: str
) -> None:
    server.reply(
        200, completion(None, [function_call("c", "get_weather", arguments)], "tool_calls")
    )

    with pytest.raises(ProviderResponseError) as info:
        provider.complete(LLMRequest("", [{"role": "user", "content": "x"}], [], "m"))

    assert "get_weather" in str(info.value)


@pytest.mark.parametrize(
    "body", [{"choices": []}, {"object": "list"}, {"choices": [{"message": {"content": 7}}]}]
)
def test_unexpected_answer_shape_is_a_response_error(
    server: ScriptedServer, provider: OpenAIChatProvider, body: dict[str, Any]
) -> None:
    server.reply(200, body)

    with pytest.raises(ProviderResponseError):
        provider.complete(LLMRequest("", [{"role": "user", "content": "x"}], [], "m"))


def test_context_length_refusal_is_not_resumable(
    server: ScriptedServer, provider: OpenAIChatProvider
) -> None:
    # The message alone would not say so: the code must reach the error.
    body = {
        "error": {
            "message": "Too many tokens in this request.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    server.reply(400, body)

    with pytest.raises(ProviderHTTPError) as info:
        provider.complete(LLMRequest("", [{"role": "user", "content": "x" * 50}], [], "m"))

    assert info.value.status == 400
    assert not_resumable_reason(info.value) == "context-window"
    assert "invalid_request_error/context_length_exceeded" in str(info.value)


def test_a_key_is_required_for_the_default_endpoint_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)

    with pytest.raises(ValueError, match="OPENAI_API_KEY"):
        OpenAIChatProvider("gpt-test")
    local = OpenAIChatProvider("llama", base_url="http://127.0.0.1:11434/v1")

    assert local.base_url == "http://127.0.0.1:11434/v1"


def test_key_and_base_url_default_from_the_environment(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", f"{server.origin}/compat/v1/")
    server.reply(200, completion("ok"))

    OpenAIChatProvider("gpt-test").complete(
        LLMRequest("", [{"role": "user", "content": "x"}], [], "m")
    )

    assert server.received[0].path == "/compat/v1/chat/completions"
    assert server.received[0].headers["authorization"] == f"Bearer {OPENAI_KEY}"


def test_keyless_compatible_server_gets_no_authorization_header(server: ScriptedServer) -> None:
    server.reply(200, completion("ok"))

    OpenAIChatProvider("llama", base_url=f"{server.origin}/v1", api_key="").complete(
        LLMRequest("", [{"role": "user", "content": "x"}], [], "m")
    )

    assert "authorization" not in server.received[0].headers
