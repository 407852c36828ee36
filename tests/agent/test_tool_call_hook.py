"""on_tool_call: the runtime reports each registered tool call as it starts and finishes, so a
host (the job system's event stream) can follow tool calls without wrapping tools."""

from __future__ import annotations

import pytest

from agent import (
    Agent,
    LLMResponse,
    RunCheckpointError,
    ScriptedProvider,
    ToolCall,
    ToolCallPhase,
    ToolCallReport,
    tool,
)


@tool
def lookup(order_id: str) -> str:
    """Look an order up."""
    if order_id == "bad":
        raise ValueError("no such order")
    return f"{order_id}: shipped"


def agent_calling(*calls: ToolCall) -> Agent:
    steps = [LLMResponse(tool_calls=list(calls)), LLMResponse(content="done")]
    return Agent(provider=ScriptedProvider(steps), model="m", tools=[lookup])


def test_each_call_reports_started_then_finished_in_the_models_order() -> None:
    seen: list[ToolCallReport] = []
    agent = agent_calling(
        ToolCall("c1", "lookup", {"order_id": "A"}), ToolCall("c2", "lookup", {"order_id": "bad"})
    )
    assert agent.run("where?", on_tool_call=seen.append).content == "done"
    assert [(r.phase, r.tool, r.tool_call_id, r.ok, r.index, r.attempt) for r in seen] == [
        (ToolCallPhase.STARTED, "lookup", "c1", None, 0, 1),
        (ToolCallPhase.FINISHED, "lookup", "c1", True, 0, 1),
        (ToolCallPhase.STARTED, "lookup", "c2", None, 1, 1),
        (ToolCallPhase.FINISHED, "lookup", "c2", False, 1, 1),  # it raised
    ]
    # finished carries the tool message content; both phases carry one key per call
    assert seen[1].content == "A: shipped" and seen[3].content == "no such order"
    assert seen[0].idempotency_key == seen[1].idempotency_key != seen[2].idempotency_key


def test_a_call_to_an_unknown_tool_reports_nothing() -> None:
    seen: list[ToolCallReport] = []
    agent_calling(ToolCall("c1", "nope", {})).run("x", on_tool_call=seen.append)
    assert seen == []


def test_a_hook_that_raises_stops_the_run_with_a_checkpoint() -> None:
    def refuse(report: ToolCallReport) -> None:
        raise RuntimeError("event store unavailable")

    agent = agent_calling(ToolCall("c1", "lookup", {"order_id": "A"}))
    with pytest.raises(RunCheckpointError) as failed:
        agent.run("where?", on_tool_call=refuse)
    assert isinstance(failed.value.cause, RuntimeError)
    assert failed.value.checkpoint.failure_point is not None
    assert failed.value.checkpoint.failure_point["phase"] == "tool"
