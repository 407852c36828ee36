"""The agent that wrote the reference fixtures (compat README), rebuilt here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agent import Agent, LLMResponse, ScriptedProvider, Tool, ToolCall, tool
from agent.providers.scripted import Step

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
