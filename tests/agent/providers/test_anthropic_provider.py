"""AnthropicProvider against a local Messages-API-shaped server: what goes over the wire, what
comes back, and thinking blocks echoed exactly."""

from __future__ import annotations

from typing import Any

import pytest
from provider_servers import ANTHROPIC_KEY, ScriptedServer

from agent.errors import ProviderHTTPError, ProviderResponseError, not_resumable_reason
from agent.messages import LLMRequest, ToolCall, assistant_message, tool_message
from agent.providers.anthropic import AnthropicProvider

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
# Awkward on purpose: quotes, backslashes, newlines, non-BMP text, base64 punctuation.
THOUGHT = 'The user wants "Paris" \\ and Oslo.\nCheck both 🌦️ — then answer.'
SIGNATURE = "EqQBCkYIBxgCKkB3+/sig==\\u0000/ErUBCkYIBxgC+Zz9=="
REDACTED_DATA = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIw=="


def message(blocks: list[dict[str, Any]], stop_reason: str = "end_turn") -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test-2025",
        "content": blocks,
        "stop_reason": stop_reason,
        "usage": {"input_tokens": 120, "output_tokens": 44, "cache_read_input_tokens": 0},
    }


@pytest.fixture
def provider(server: ScriptedServer) -> AnthropicProvider:
    return AnthropicProvider("claude-test", api_key=ANTHROPIC_KEY, base_url=server.origin)


def test_tool_round_with_thinking_echoes_the_blocks_exactly(
    server: ScriptedServer, provider: AnthropicProvider
) -> None:
    # Given a model that thinks, then calls two tools, then answers
    server.reply(
        200,
        message(
            [
                {"type": "thinking", "thinking": THOUGHT, "signature": SIGNATURE},
                {"type": "redacted_thinking", "data": REDACTED_DATA},
                {"type": "text", "text": "Let me check."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
                {
                    "type": "tool_use",
                    "id": "toolu_2",
                    "name": "get_weather",
                    "input": {"city": "Oslo"},
                },
            ],
            stop_reason="tool_use",
        ),
    )
    server.reply(
        200, message([{"type": "text", "text": "Paris "}, {"type": "text", "text": "is sunny."}])
    )
    user = {"role": "user", "content": "Paris or Oslo?", "futureThing": 1}

    # When the first call is made
    response = provider.complete(
        LLMRequest(system_prompt="Be brief.", messages=[user], tools=[WEATHER_TOOL], model="m")
    )

    # Then text, tool calls, thinking (in our wire shape), usage and stop reason come back
    assert response.content == "Let me check."
    assert response.tool_calls == (
        ToolCall(id="toolu_1", name="get_weather", args={"city": "Paris"}),
        ToolCall(id="toolu_2", name="get_weather", args={"city": "Oslo"}),
    )
    assert response.thinking_blocks == (
        {"type": "thinking", "content": THOUGHT, "signature": SIGNATURE},
        {"type": "redacted_thinking", "content": REDACTED_DATA},
    )
    assert response.stop_reason == "tool_use"
    assert response.usage is not None
    assert (response.usage["inputTokens"], response.usage["outputTokens"]) == (120, 44)
    assert response.usage["raw"]["cache_read_input_tokens"] == 0
    # And the server got a Messages API request
    sent = server.received[0]
    assert sent.path == "/v1/messages"
    assert sent.headers["x-api-key"] == ANTHROPIC_KEY
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in sent.headers
    assert sent.json() == {
        "model": "claude-test",
        "max_tokens": 4096,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "Paris or Oslo?"}],
        "tools": [
            {
                "name": "get_weather",
                "description": "Current weather for a city.",
                "input_schema": WEATHER_TOOL["inputSchema"],
            }
        ],
    }

    # When the tool results go back (the assistant turn as the runtime records it)
    history = [
        user,
        assistant_message(response),
        tool_message("toolu_1", "get_weather", "sunny"),
        tool_message("toolu_2", "get_weather", "rain"),
    ]
    final = provider.complete(
        LLMRequest(system_prompt="Be brief.", messages=history, tools=[WEATHER_TOOL], model="m")
    )

    # Then thinking comes first and unchanged, and both results share one user turn
    assert final.content == "Paris is sunny."
    assert server.received[1].json()["messages"] == [
        {"role": "user", "content": "Paris or Oslo?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": THOUGHT, "signature": SIGNATURE},
                {"type": "redacted_thinking", "data": REDACTED_DATA},
                {"type": "text", "text": "Let me check."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
                {
                    "type": "tool_use",
                    "id": "toolu_2",
                    "name": "get_weather",
                    "input": {"city": "Oslo"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "rain"},
            ],
        },
    ]
    # Byte-exact: the signature's JSON encoding is in the raw bytes sent.
    assert (
        b'"signature":"EqQBCkYIBxgCKkB3+/sig==\\\\u0000/ErUBCkYIBxgC+Zz9=="'
        in server.received[1].body
    )


def test_thinking_from_a_stored_checkpoint_is_echoed_with_only_the_api_keys(
    server: ScriptedServer, provider: AnthropicProvider
) -> None:
    # Given history read from a checkpoint: extra keys on blocks, a tool-only turn with no text
    server.reply(200, message([{"type": "text", "text": "done"}]))
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": "",
            "thinkingBlocks": [
                {"type": "thinking", "content": THOUGHT, "signature": SIGNATURE, "summary": False},
                {"type": "redacted_thinking", "content": REDACTED_DATA, "providerMeta": {"x": 1}},
            ],
            "toolCalls": [{"id": "t1", "name": "noop", "args": {}, "providerMeta": {"y": 2}}],
        },
        {"role": "tool", "content": "ok", "toolCallId": "t1", "toolName": "noop"},
    ]

    provider.complete(LLMRequest(system_prompt="", messages=history, tools=[], model="m"))

    body = server.received[0].json()
    assert "system" not in body and "tools" not in body
    assert body["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": THOUGHT, "signature": SIGNATURE},
            {"type": "redacted_thinking", "data": REDACTED_DATA},
            {"type": "tool_use", "id": "t1", "name": "noop", "input": {}},
        ],
    }


def test_system_messages_inside_history_join_the_system_prompt(
    server: ScriptedServer, provider: AnthropicProvider
) -> None:
    server.reply(200, message([{"type": "text", "text": "ok"}]))
    history = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "system", "content": "Now answer in French."},
        {"role": "user", "content": "c"},
    ]

    provider.complete(LLMRequest(system_prompt="Base.", messages=history, tools=[], model="m"))

    body = server.received[0].json()
    assert body["system"] == "Base.\n\nNow answer in French."
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]


def test_thinking_budget_and_max_tokens_are_sent(server: ScriptedServer) -> None:
    server.reply(200, message([{"type": "text", "text": "ok"}]))
    provider = AnthropicProvider(
        "claude-test",
        api_key=ANTHROPIC_KEY,
        base_url=server.origin,
        max_tokens=16000,
        thinking_budget_tokens=8000,
    )

    provider.complete(LLMRequest("", [{"role": "user", "content": "x"}], [], "m"))

    body = server.received[0].json()
    assert body["max_tokens"] == 16000
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 8000}


def test_prompt_too_long_is_not_resumable(
    server: ScriptedServer, provider: AnthropicProvider
) -> None:
    server.reply(
        400,
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "prompt is too long: 208310 tokens > 200000 maximum",
            },
        },
    )

    with pytest.raises(ProviderHTTPError) as info:
        provider.complete(LLMRequest("", [{"role": "user", "content": "x"}], [], "m"))

    assert info.value.status == 400
    assert not_resumable_reason(info.value) == "context-window"


@pytest.mark.parametrize(
    "body",
    [
        {"type": "message"},
        {"content": [{"type": "tool_use", "id": "t", "name": "n", "input": "city=Paris"}]},
        {"content": [{"type": "text", "text": None}]},
        {"content": [{"type": "thinking", "signature": "s"}]},
    ],
)
def test_unexpected_answer_shape_is_a_response_error(
    server: ScriptedServer, provider: AnthropicProvider, body: dict[str, Any]
) -> None:
    server.reply(200, body)

    with pytest.raises(ProviderResponseError):
        provider.complete(LLMRequest("", [{"role": "user", "content": "x"}], [], "m"))


def test_a_key_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)

    with pytest.raises(ValueError, match="ANTHROPIC_API_KEY"):
        AnthropicProvider("claude-test")


def test_key_and_base_url_default_from_the_environment(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY + "\n")  # as read from a secrets file
    monkeypatch.setenv("ANTHROPIC_BASE_URL", f"{server.origin}/proxy/")
    server.reply(200, message([{"type": "text", "text": "ok"}]))

    AnthropicProvider("claude-test").complete(
        LLMRequest("", [{"role": "user", "content": "x"}], [], "m")
    )

    assert server.received[0].path == "/proxy/v1/messages"
    assert server.received[0].headers["x-api-key"] == ANTHROPIC_KEY
