"""A person in the loop, in the runtime alone (agent/pauses.py): approvals, questions, a paused
run resumed by another process, and what a paused instance refuses."""

from __future__ import annotations

from typing import Any

import pytest

from agent import (
    REJECTED,
    Agent,
    AgentRunCheckpoint,
    Decision,
    InvalidRunInputError,
    LLMResponse,
    RequestKind,
    RunPause,
    RunPausedError,
    ScriptedProvider,
    ToolCall,
    ToolContext,
    ask_user,
    tool,
)

ran: list[str] = []


@tool
def lookup(order_id: str) -> str:
    """Look an order up."""
    ran.append(f"lookup {order_id}")
    return f"{order_id}: shipped"


@tool(approval=True, effect="unsafe")
def refund(order_id: str) -> str:
    """Refund an order."""
    ran.append(f"refund {order_id}")
    return f"refunded {order_id}"


def big_refunds_only(args: dict[str, Any], ctx: ToolContext) -> bool:
    return int(args["amount"]) > 100


@tool(approval=big_refunds_only)
def credit(amount: int) -> str:
    """Credit an amount."""
    ran.append(f"credit {amount}")
    return f"credited {amount}"


def broken_check(args: dict[str, Any], ctx: ToolContext) -> bool:
    raise RuntimeError("policy service down")


@tool(approval=broken_check)
def wire(amount: int) -> str:
    """Wire money."""
    ran.append(f"wire {amount}")
    return "wired"


@pytest.fixture(autouse=True)
def clear_ran() -> None:
    ran.clear()


def agent_with(*calls: ToolCall) -> tuple[Agent, ScriptedProvider]:
    provider = ScriptedProvider([LLMResponse(tool_calls=list(calls)), LLMResponse(content="done")])
    tools = [lookup, refund, credit, wire, ask_user]
    return Agent(provider=provider, model="m", tools=tools), provider


def tool_contents(checkpoint: AgentRunCheckpoint) -> list[str]:
    return [m["content"] for m in checkpoint.history if m["role"] == "tool"]


def test_a_call_that_needs_approval_pauses_after_the_others_ran() -> None:
    agent, _ = agent_with(
        ToolCall("c1", "refund", {"order_id": "A"}), ToolCall("c2", "lookup", {"order_id": "A"})
    )
    result = agent.run("refund A")
    assert result.stop_reason == "paused" and result.content == ""
    assert result.pause is not None
    [request] = result.pause.pending
    assert (request.kind, request.tool, request.tool_call_id, request.index) == (
        RequestKind.APPROVAL,
        "refund",
        "c1",
        0,
    )
    assert dict(request.args) == {"order_id": "A"}
    assert ran == ["lookup A"]  # the other call ran before the pause; the refund did not


def test_approve_runs_the_call_and_the_model_is_not_asked_again_for_its_response() -> None:
    agent, provider = agent_with(
        ToolCall("c1", "refund", {"order_id": "A"}), ToolCall("c2", "lookup", {"order_id": "A"})
    )
    pause = agent.run("refund A").pause
    assert pause is not None
    result = agent.resume({pause.pending[0].request_id: Decision.approve()})
    assert result.content == "done"
    assert ran == ["lookup A", "refund A"]  # lookup did not run again
    assert len(provider.requests) == 2
    assert tool_contents(result.checkpoint) == ["refunded A", "A: shipped"]


def test_approve_with_edited_args_runs_the_edited_call() -> None:
    agent, _ = agent_with(ToolCall("c1", "refund", {"order_id": "A"}))
    pause = agent.run("refund A").pause
    assert pause is not None
    agent.resume({pause.pending[0].request_id: Decision.approve({"order_id": "B"})})
    assert ran == ["refund B"]


def test_reject_gives_the_model_the_message_and_runs_nothing() -> None:
    agent, provider = agent_with(ToolCall("c1", "refund", {"order_id": "A"}))
    pause = agent.run("refund A").pause
    assert pause is not None
    result = agent.resume({pause.pending[0].request_id: Decision.reject("over the limit")})
    assert ran == []
    assert tool_contents(result.checkpoint) == [f"{REJECTED} over the limit"]
    assert provider.requests[-1].messages[-1]["content"] == "[rejected] over the limit"


def test_ask_user_waits_for_the_answer_which_is_the_tool_result_verbatim() -> None:
    agent, _ = agent_with(ToolCall("c1", "ask_user", {"question": "Which order?"}))
    pause = agent.run("refund my order").pause
    assert pause is not None
    [question] = pause.pending
    assert (question.kind, question.question) == (RequestKind.QUESTION, "Which order?")
    result = agent.resume({question.request_id: Decision.answer("  A-17, the blue one ")})
    assert tool_contents(result.checkpoint) == ["  A-17, the blue one "]


def test_a_pause_resumes_in_another_process_from_its_json() -> None:
    agent, provider = agent_with(
        ToolCall("c1", "lookup", {"order_id": "A"}), ToolCall("c2", "refund", {"order_id": "A"})
    )
    pause = agent.run("refund A").pause
    assert pause is not None
    saved = pause.to_json()
    # a fresh instance, as a later process builds it
    later = Agent(provider=provider, model="m", tools=[lookup, refund])
    restored = RunPause.from_json(saved)
    result = later.resume({restored.pending[0].request_id: Decision.approve()}, pause=restored)
    assert result.content == "done" and ran == ["lookup A", "refund A"]


def test_deciding_only_some_requests_pauses_again_with_the_rest() -> None:
    agent, _ = agent_with(
        ToolCall("c1", "refund", {"order_id": "A"}), ToolCall("c2", "ask_user", {"question": "?"})
    )
    pause = agent.run("x").pause
    assert pause is not None
    approval = next(r for r in pause.pending if r.kind is RequestKind.APPROVAL)
    again = agent.resume({approval.request_id: Decision.approve()})
    assert again.stop_reason == "paused" and again.pause is not None
    assert [r.kind for r in again.pause.pending] == [RequestKind.QUESTION]
    assert ran == ["refund A"]
    done = agent.resume({again.pause.pending[0].request_id: Decision.answer("yes")})
    assert done.content == "done" and ran == ["refund A"]


def test_an_approval_callable_decides_and_fails_closed() -> None:
    agent, _ = agent_with(ToolCall("c1", "credit", {"amount": 20}))
    assert agent.run("small").content == "done" and ran == ["credit 20"]
    agent, _ = agent_with(ToolCall("c1", "credit", {"amount": 500}))
    assert agent.run("big").stop_reason == "paused"
    agent, _ = agent_with(ToolCall("c1", "wire", {"amount": 1}))
    assert agent.run("wire").stop_reason == "paused", "a check that raises must ask"


def test_a_paused_instance_refuses_other_doors_until_answered_or_abandoned() -> None:
    agent, _ = agent_with(ToolCall("c1", "refund", {"order_id": "A"}))
    result = agent.run("refund A")
    with pytest.raises(RunPausedError, match=r"agent\.resume"):
        agent.run("something else")
    with pytest.raises(RunPausedError):
        agent.resume_on_error(result.checkpoint)
    assert agent.abandon_pause() is True
    assert agent.paused is None
    assert agent.abandon_pause() is False


def test_decisions_that_do_not_fit_are_refused_by_name() -> None:
    agent, _ = agent_with(
        ToolCall("c1", "refund", {"order_id": "A"}), ToolCall("c2", "ask_user", {"question": "?"})
    )
    pause = agent.run("x").pause
    assert pause is not None
    approval = next(r for r in pause.pending if r.kind is RequestKind.APPROVAL)
    question = next(r for r in pause.pending if r.kind is RequestKind.QUESTION)
    with pytest.raises(InvalidRunInputError, match="names no pending request"):
        agent.resume({"req-nope": Decision.approve()})
    with pytest.raises(InvalidRunInputError, match=r"approval takes Decision\.approve"):
        agent.resume({approval.request_id: Decision.answer("yes")})
    with pytest.raises(InvalidRunInputError, match=r"question takes Decision\.answer"):
        agent.resume({question.request_id: Decision.approve()})
    assert agent.paused is pause  # a refused resume keeps the pause


def test_approval_must_be_a_bool_or_a_callable() -> None:
    with pytest.raises(TypeError, match="approval"):
        tool(approval="yes")  # type: ignore[arg-type]
