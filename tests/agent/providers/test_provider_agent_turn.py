"""A whole Agent turn with a tool round through each real provider, over a local server."""

from __future__ import annotations

from typing import Any

import pytest
from provider_servers import ANTHROPIC_KEY, OPENAI_KEY, ScriptedServer

from agent import Agent, AgentRunCheckpoint, RunCheckpointError, can_resume, tool
from agent.errors import ProviderHTTPError
from agent.providers.anthropic import AnthropicProvider
from agent.providers.openai import OpenAIChatProvider

SIGNATURE = "ErUBCkYIBxgCKkDx+/9ab==\\n"
THOUGHT = 'Paris weather: call the tool. "Quotes" 🌦️'


@tool
def get_weather(city: str) -> dict[str, Any]:
    """Current weather for a city."""
    return {"tempC": 21, "sky": "sunny", "city": city}


WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}


def test_openai_agent_turn_with_a_tool_round(server: ScriptedServer) -> None:
    # Given an OpenAI-compatible server that asks for the weather, then answers
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
    }
    server.reply(
        200,
        {
            "choices": [
                {
                    "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {"prompt_tokens": 50, "completion_tokens": 10},
        },
    )
    server.reply(
        200,
        {
            "choices": [{"message": {"content": "Sunny, 21 °C."}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 80, "completion_tokens": 6},
        },
    )
    provider = OpenAIChatProvider("gpt-test", base_url=f"{server.origin}/v1", api_key=OPENAI_KEY)
    agent = Agent(provider=provider, model="gpt-test", system="Be brief.", tools=[get_weather])

    # When the agent runs a turn
    result = agent.run("Weather in Paris?")

    # Then the answer is the model's, after the tool ran with the model's arguments
    assert result.content == "Sunny, 21 °C."
    assert result.iterations == 2
    first, second = (r.json() for r in server.received)
    assert first["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather for a city.",
                "parameters": WEATHER_SCHEMA,
            },
        }
    ]
    assert second["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {
            "role": "tool",
            "content": '{"tempC":21,"sky":"sunny","city":"Paris"}',
            "tool_call_id": "call_1",
        },
    ]
    assert len({r.client_port for r in server.received}) == 1


def test_anthropic_turn_survives_an_overload_and_resumes_with_thinking_intact(
    server: ScriptedServer,
) -> None:
    # Given a model that thinks and calls a tool, an overload, then an answer
    server.reply(
        200,
        {
            "content": [
                {"type": "thinking", "thinking": THOUGHT, "signature": SIGNATURE},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
            ],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 40, "output_tokens": 12},
        },
    )
    server.reply(
        529,
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        headers={"retry-after": "3"},
    )
    server.reply(
        200, {"content": [{"type": "text", "text": "Sunny in Paris."}], "stop_reason": "end_turn"}
    )
    provider = AnthropicProvider("claude-test", api_key=ANTHROPIC_KEY, base_url=server.origin)
    agent = Agent(provider=provider, model="claude-test", tools=[get_weather])

    # When the turn fails on its second model call
    with pytest.raises(RunCheckpointError) as info:
        agent.run("Weather in Paris?")

    # Then it is resumable, and the provider's status and wait are on the cause
    err = info.value
    assert can_resume(err)
    assert isinstance(err.cause, ProviderHTTPError)
    assert (err.cause.status, err.cause.retry_after_s) == (529, 3.0)

    # When the stored checkpoint (through JSON, as a job system keeps it) is resumed
    checkpoint = AgentRunCheckpoint.from_json(err.checkpoint.to_json())
    result = agent.resume_on_error(checkpoint)

    # Then the answer arrives, and the thinking block went back exactly, before the tool use
    assert result.content == "Sunny in Paris."
    for sent in (server.received[1], server.received[2]):
        assistant = sent.json()["messages"][1]
        assert assistant["role"] == "assistant"
        assert assistant["content"][0] == {
            "type": "thinking",
            "thinking": THOUGHT,
            "signature": SIGNATURE,
        }
        assert assistant["content"][1]["type"] == "tool_use"
        assert sent.json()["messages"][2] == {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": '{"tempC":21,"sky":"sunny","city":"Paris"}',
                }
            ],
        }
