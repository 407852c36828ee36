"""A whole Agent turn with a tool round through each real provider, over a local server."""

from __future__ import annotations

from typing import Any

import orjson
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


# ---------------------------------------------------------------------------------------------
# what the providers send in the reference's cases: no system prompt and no tools (p04), the
# reference's numbers (p05), and the wrap-up call with the tools withheld (p01)


def openai_reply(content: str | None, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return {"choices": [{"message": message, "finish_reason": "tool_calls" if calls else "stop"}]}


def openai_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def anthropic_reply(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    tool_use = any(b["type"] == "tool_use" for b in blocks)
    return {"content": blocks, "stop_reason": "tool_use" if tool_use else "end_turn"}


def test_openai_without_system_prompt_or_tools_sends_neither(server: ScriptedServer) -> None:
    server.reply(200, openai_reply("Hello! How can I help you today?"))
    provider = OpenAIChatProvider("gpt-test", base_url=f"{server.origin}/v1", api_key=OPENAI_KEY)
    Agent(provider=provider, model="gpt-test").run("Hi there")
    assert server.received[0].json() == {
        "model": "gpt-test",
        "messages": [{"role": "user", "content": "Hi there"}],
    }


def test_anthropic_without_system_prompt_or_tools_sends_neither(server: ScriptedServer) -> None:
    server.reply(200, anthropic_reply([{"type": "text", "text": "Hello!"}]))
    provider = AnthropicProvider("claude-test", api_key=ANTHROPIC_KEY, base_url=server.origin)
    Agent(provider=provider, model="claude-test").run("Hi there")
    body = server.received[0].json()
    assert "system" not in body and "tools" not in body
    assert body["messages"] == [{"role": "user", "content": "Hi there"}]


@tool
def measure(**numbers: float) -> dict[str, Any]:
    """Echo the numbers back."""
    return numbers


def test_openai_numbers_go_back_as_the_reference_writes_them(server: ScriptedServer) -> None:
    arguments = '{"qty": 2.0, "neg": -0.0, "tiny": 1e-6, "big": 1E21}'
    server.reply(200, openai_reply(None, [openai_call("call_1", "measure", arguments)]))
    server.reply(200, openai_reply("Measured."))
    provider = OpenAIChatProvider("gpt-test", base_url=f"{server.origin}/v1", api_key=OPENAI_KEY)
    agent = Agent(provider=provider, model="gpt-test", tools=[measure])
    agent.run("Measure it.")
    second = server.received[1].body
    expected = '{"qty":2,"neg":0,"tiny":0.000001,"big":1e+21}'
    assert orjson.dumps(expected).decode() in second.decode(), "the call's arguments"
    assert second.count(orjson.dumps(expected)) == 2, "...and the tool's result"
    checkpoint = agent.checkpoint()
    assert checkpoint is not None
    assert expected.encode() in checkpoint.to_json()


def test_anthropic_numbers_go_back_as_the_reference_writes_them(server: ScriptedServer) -> None:
    server.reply(
        200,
        anthropic_reply(
            [{"type": "tool_use", "id": "toolu_1", "name": "measure", "input": {"qty": 2.0}}]
        ),
    )
    server.reply(200, anthropic_reply([{"type": "text", "text": "Measured."}]))
    provider = AnthropicProvider("claude-test", api_key=ANTHROPIC_KEY, base_url=server.origin)
    Agent(provider=provider, model="claude-test", tools=[measure]).run("Measure it.")
    second = server.received[1].body
    assert b'"input":{"qty":2}' in second
    assert b'"content":"{\\"qty\\":2}"' in second


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_the_wrap_up_call_withholds_the_tools(server: ScriptedServer, kind: str) -> None:
    if kind == "openai":
        server.reply(
            200, openai_reply(None, [openai_call("call_1", "get_weather", '{"city":"Paris"}')])
        )
        server.reply(200, openai_reply("Paris was not checked."))
        provider: Any = OpenAIChatProvider(
            "gpt-test", base_url=f"{server.origin}/v1", api_key=OPENAI_KEY
        )
    else:
        use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "P"}}
        server.reply(200, anthropic_reply([use]))
        server.reply(200, anthropic_reply([{"type": "text", "text": "Paris was not checked."}]))
        provider = AnthropicProvider("claude-test", api_key=ANTHROPIC_KEY, base_url=server.origin)
    agent = Agent(provider=provider, model="m", tools=[get_weather], max_iterations=1)
    result = agent.run("Weather in Paris?")
    assert result.content == "Paris was not checked."
    first, wrap_up = (r.json() for r in server.received)
    assert "tools" in first and "tools" not in wrap_up
    assert "action budget for this turn is exhausted" in str(wrap_up["messages"][-1])
