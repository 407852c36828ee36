"""The agent that wrote the reference fixtures (compat README), rebuilt here."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import orjson

from agent import Agent, LLMResponse, ScriptedProvider, Tool, ToolCall, tool
from agent.providers.scripted import Step
from tests.conftest import COMPAT_DIR

SYSTEM = "You are a concise support agent."
IDENTITY = {"tenant": "acme", "principal": "user-42", "conversationId": "conv-001"}
ORDER_ANSWER = "Order A-17 has shipped; ETA 2026-09-01."


@tool(description="Look up an order by id.")
def lookup_order(orderId: str) -> dict[str, Any]:
    return {"orderId": orderId, "status": "shipped", "eta": "2026-09-01"}


def charge_card_that_times_out(calls: list[dict[str, Any]] | None = None) -> Tool:
    def execute(args: dict[str, Any]) -> Any:
        if calls is not None:
            calls.append(args)
        raise RuntimeError("payment gateway timeout")

    return Tool(
        name="charge_card",
        description="Charge the card on file.",
        input_schema={
            "type": "object",
            "properties": {"amount": {"type": "number"}},
            "required": ["amount"],
        },
        execute=execute,
    )


def support_agent(
    steps: Sequence[Step],
    *,
    named: bool = True,
    tools: Sequence[Tool] = (lookup_order,),
    **layers: Any,
) -> tuple[Agent, ScriptedProvider]:
    provider = ScriptedProvider(steps)
    agent = Agent(
        provider=provider,
        model="mock-model",
        system=SYSTEM,
        tools=tools,
        id="support-agent" if named else None,
        max_iterations=6,
        **layers,
    )
    return agent, provider


def lookup_call(text: str = "") -> LLMResponse:
    return LLMResponse(
        content=text,
        tool_calls=[ToolCall(id="call_1", name="lookup_order", args={"orderId": "A-17"})],
    )


def answer(text: str) -> LLMResponse:
    return LLMResponse(content=text)


def without_volatile(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """runId and checkpointedAt differ on every run (compat README)."""
    return {k: v for k, v in checkpoint.items() if k not in ("runId", "checkpointedAt")}


def exact_fixture(name: str, drop: Sequence[str] = ()) -> bytes:
    """A reference file as compact JSON with every number token exactly as that runtime wrote
    it (parsing to Python numbers and writing them again would prove nothing about them)."""
    text = (COMPAT_DIR / name).read_text(encoding="utf-8")
    value = json.loads(text, parse_int=orjson.Fragment, parse_float=orjson.Fragment)
    if drop:
        value = {k: v for k, v in value.items() if k not in drop}
    return orjson.dumps(value)


# ---------------------------------------------------------------------------------------------
# helpers for the rule-by-rule tests

RUN_ID_PATTERN = r"^run-\d+-\d+$"


def wire_checkpoint(**fields: Any) -> dict[str, Any]:
    """A valid v1 checkpoint in wire shape (one finished turn); keyword args replace keys."""
    base: dict[str, Any] = {
        "version": 1,
        "runId": "run-1796000000000-1",
        "history": [
            {"role": "user", "content": "Where is my order A-17?"},
            {"role": "assistant", "content": ORDER_ANSWER},
        ],
        "lastCompletedIteration": 1,
        "originalInput": {"message": "Where is my order A-17?"},
        "checkpointedAt": 1796000000000,
    }
    base.update(fields)
    return base


def drop(wire: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in wire.items() if k not in keys}


def plain_agent(steps: Sequence[Step], **options: Any) -> tuple[Agent, ScriptedProvider]:
    """An agent with no tools and no id unless given: the smallest thing that runs a turn."""
    provider = ScriptedProvider(steps)
    options.setdefault("model", "mock-model")
    return Agent(provider=provider, **options), provider


def sent_messages(provider: ScriptedProvider, index: int = 0) -> list[dict[str, Any]]:
    return [dict(m) for m in provider.requests[index].messages]


def system_prompts(provider: ScriptedProvider) -> list[str]:
    return [r.system_prompt for r in provider.requests]


def tool_call(call_id: str, name: str, **args: Any) -> LLMResponse:
    return LLMResponse(content="", tool_calls=[ToolCall(id=call_id, name=name, args=args)])


def wire_of(agent: Agent) -> dict[str, Any]:
    checkpoint = agent.checkpoint()
    assert checkpoint is not None, "the agent has no conversation yet"
    return checkpoint.to_dict()
