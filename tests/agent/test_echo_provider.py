"""EchoProvider: the model for local runs. It answers with the last user message, prefixed
`echo: `, calls no tool, counts usage in words, never runs out and can be shared by threads."""

from __future__ import annotations

import threading
from typing import Any

from agent import Agent, EchoProvider, LLMProvider, LLMRequest, tool

LOOKUP_TOOL = {
    "name": "lookup_order",
    "description": "Look up an order by id.",
    "inputSchema": {"type": "object", "properties": {"order_id": {"type": "string"}}},
}


def request(messages: list[dict[str, Any]], system: str = "", tools: Any = ()) -> LLMRequest:
    return LLMRequest(system, messages, list(tools), "m")


def test_it_is_a_provider_named_echo() -> None:
    provider = EchoProvider()
    assert isinstance(provider, LLMProvider)
    assert provider.name == "echo"


def test_it_answers_with_the_last_user_message() -> None:
    messages = [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "echo: first question"},
        {"role": "user", "content": "Where is order A-17?"},
        {"role": "tool", "content": "{}", "toolCallId": "c1", "toolName": "t"},
    ]
    response = EchoProvider().complete(request(messages))
    assert response.content == "echo: Where is order A-17?"
    assert response.tool_calls == ()
    assert response.stop_reason == "stop"


def test_without_a_user_message_it_answers_the_bare_prefix() -> None:
    assert EchoProvider().complete(request([])).content == "echo: "
    only_assistant = [{"role": "assistant", "content": "hello"}]
    assert EchoProvider().complete(request(only_assistant)).content == "echo: "


def test_usage_counts_whitespace_separated_words() -> None:
    # system: 5 words; messages: 3 + 2 + 4 words
    messages = [
        {"role": "user", "content": "Book a table."},
        {"role": "assistant", "content": "echo:  Book"},
        {"role": "user", "content": "for two,\tplease\n now"},
    ]
    response = EchoProvider().complete(request(messages, system="You are a concise agent."))
    assert response.content == "echo: for two,\tplease\n now"
    assert response.usage == {"inputTokens": 14, "outputTokens": 5}
    assert EchoProvider().complete(request([])).usage == {"inputTokens": 0, "outputTokens": 1}


def test_it_calls_no_tool_even_when_tools_are_offered() -> None:
    offered = request([{"role": "user", "content": "look up A-17"}], tools=[LOOKUP_TOOL])
    response = EchoProvider().complete(offered)
    assert response.tool_calls == ()
    assert response.content == "echo: look up A-17"


def test_an_agent_turn_with_tools_ends_after_one_model_call() -> None:
    ran: list[str] = []

    @tool
    def lookup_order(order_id: str) -> dict[str, str]:
        """Look up an order by id."""
        ran.append(order_id)
        return {"orderId": order_id}

    agent = Agent(provider=EchoProvider(), model="m", tools=[lookup_order])
    result = agent.run("Where is A-17?")
    assert result.content == "echo: Where is A-17?"
    assert result.iterations == 1
    assert ran == []
    assert result.usage == {"inputTokens": 3, "outputTokens": 4}
    assert agent.follow_up("Thanks!").content == "echo: Thanks!"


def test_it_never_runs_out() -> None:
    provider = EchoProvider()
    for n in range(5000):
        assert provider.complete(request([{"role": "user", "content": f"m{n}"}])).content == (
            f"echo: m{n}"
        )


def test_one_instance_serves_many_threads() -> None:
    provider = EchoProvider()
    wrong: list[str] = []
    start = threading.Barrier(8)

    def calls(worker: int) -> None:
        start.wait()
        for n in range(500):
            text = f"worker {worker} call {n}"
            response = provider.complete(request([{"role": "user", "content": text}]))
            if response.content != f"echo: {text}" or response.usage != {
                "inputTokens": 4,
                "outputTokens": 5,
            }:
                wrong.append(f"{text} -> {response.content!r} {response.usage}")

    threads = [threading.Thread(target=calls, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert wrong == []
    assert not any(thread.is_alive() for thread in threads)
