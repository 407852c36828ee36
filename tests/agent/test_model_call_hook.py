"""on_model_call: the runtime reports each model call as it starts and finishes, so a host can
check for cancellation before the model is called and keep telemetry (model, usage, errors)."""

from __future__ import annotations

from typing import Any

import pytest

from agent import (
    Agent,
    LLMResponse,
    ModelCallPhase,
    ModelCallReport,
    ProviderTimeoutError,
    RunCheckpointError,
    ScriptedProvider,
    ToolCall,
    ToolCallReport,
    tool,
)
from agent.providers.scripted import Step

STARTED, FINISHED = ModelCallPhase.STARTED, ModelCallPhase.FINISHED


@tool
def lookup(order_id: str) -> str:
    """Look an order up."""
    return f"{order_id}: shipped"


def agent_on(steps: list[Step]) -> tuple[Agent, ScriptedProvider]:
    provider = ScriptedProvider(steps)
    return Agent(provider=provider, model="m", tools=[lookup]), provider


def report(phase: ModelCallPhase, iteration: int, **fields: Any) -> ModelCallReport:
    # Every run here makes one model call per iteration: the call's number is the iteration.
    fields.setdefault("call_number", iteration)
    return ModelCallReport(phase, "m", iteration, provider="scripted", **fields)


def test_each_model_call_reports_started_then_finished_with_its_usage() -> None:
    seen: list[ModelCallReport | ToolCallReport] = []
    agent, _ = agent_on(
        [
            LLMResponse(
                tool_calls=[ToolCall("c1", "lookup", {"order_id": "A"})],
                usage={"input_tokens": 12, "output_tokens": 3, "detail": {"cached": 1}},
            ),
            LLMResponse(content="done"),
        ]
    )
    result = agent.run("where?", on_model_call=seen.append, on_tool_call=seen.append)
    assert result.content == "done"
    assert [type(r).__name__ for r in seen] == [
        "ModelCallReport",
        "ModelCallReport",
        "ToolCallReport",
        "ToolCallReport",
        "ModelCallReport",
        "ModelCallReport",
    ]
    model_reports = [r for r in seen if isinstance(r, ModelCallReport)]
    assert model_reports == [
        report(STARTED, 1),
        # the integer counts only: a provider's other details are not token counts
        report(FINISHED, 1, ok=True, usage={"input_tokens": 12, "output_tokens": 3}),
        report(STARTED, 2),
        report(FINISHED, 2, ok=True),  # this response has no usage
    ]


def test_a_provider_failure_reports_finished_not_ok_and_still_fails_the_run() -> None:
    seen: list[ModelCallReport] = []
    agent, _ = agent_on([ProviderTimeoutError("model took too long")])
    with pytest.raises(RunCheckpointError) as failed:
        agent.run("where?", on_model_call=seen.append)
    assert isinstance(failed.value.cause, ProviderTimeoutError)
    assert seen == [
        report(STARTED, 1),
        report(FINISHED, 1, ok=False, error_type="ProviderTimeoutError"),
    ]


def test_a_hook_that_raises_at_started_means_the_model_is_never_called() -> None:
    def cancelled(report: ModelCallReport) -> None:
        if report.phase is STARTED:
            raise RuntimeError("turn cancelled")

    agent, provider = agent_on([LLMResponse(content="never sent")])
    with pytest.raises(RunCheckpointError) as failed:
        agent.run("where?", on_model_call=cancelled)
    assert provider.requests == []
    assert isinstance(failed.value.cause, RuntimeError)
    assert str(failed.value.cause) == "turn cancelled"
    assert failed.value.checkpoint.failure_point is not None
    assert failed.value.checkpoint.failure_point["phase"] == "llm"


def test_follow_up_and_resume_on_error_take_the_hook_too() -> None:
    seen: list[ModelCallReport] = []
    agent, _ = agent_on(
        [
            LLMResponse(content="first"),
            LLMResponse(content="second"),
            ProviderTimeoutError("slow"),
            LLMResponse(content="third"),
        ]
    )
    agent.run("one")
    agent.follow_up("two", on_model_call=seen.append)
    with pytest.raises(RunCheckpointError) as failed:
        agent.follow_up("three")
    agent.resume_on_error(failed.value.checkpoint, on_model_call=seen.append)
    assert seen == [
        report(STARTED, 1),
        report(FINISHED, 1, ok=True),
        report(STARTED, 1),
        report(FINISHED, 1, ok=True),
    ]


def test_the_phases_are_the_documented_strings() -> None:
    assert [phase.value for phase in ModelCallPhase] == ["started", "finished"]
