"""Tool timeouts (docs/operations.md, "Cancel and deadlines"): a call past its limit is left
behind, the model reads `[timed out] ...` as its result, and the loop goes on."""

from __future__ import annotations

import contextvars
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agent import (
    Agent,
    LLMResponse,
    RunCheckpointError,
    ScriptedProvider,
    Tool,
    ToolAbort,
    ToolCall,
    ToolCallPhase,
    ToolCallReport,
    tool,
)

DONE = LLMResponse(content="done")


def call(tool_name: str, call_id: str = "c1", **args: Any) -> LLMResponse:
    return LLMResponse(tool_calls=[ToolCall(call_id, tool_name, args)])


def agent_with(
    *tools: Tool, steps: list[LLMResponse] | None = None, **options: Any
) -> tuple[Agent, ScriptedProvider]:
    provider = ScriptedProvider(steps or [call(tools[0].name), DONE])
    return Agent(provider=provider, model="m", tools=tools, **options), provider


def tool_results(provider: ScriptedProvider, request: int = 1) -> list[str]:
    return [m["content"] for m in provider.requests[request].messages if m["role"] == "tool"]


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at the end of each test, so no blocked tool thread outlives it for long."""
    event = threading.Event()
    yield event
    event.set()


def blocking_tool(
    release: threading.Event,
    *,
    name: str = "slow",
    timeout_s: float | None = None,
    after: Callable[[], Any] = lambda: "late result",
    returned: threading.Event | None = None,
) -> Tool:
    """A tool that waits up to 5 s for `release`, then returns (or raises) what `after` does."""

    def execute(args: dict[str, Any]) -> Any:
        release.wait(5)
        try:
            return after()
        finally:
            if returned is not None:
                returned.set()

    return Tool(name, "Waits.", {"type": "object"}, execute, timeout_s=timeout_s)


# ---------------------------------------------------------------------------------------------
# a call past its limit


def test_a_call_past_its_limit_is_left_behind_and_the_model_reads_timed_out() -> None:
    sleeper = Tool(
        "lookup_order", "Sleeps.", {"type": "object"}, lambda args: time.sleep(5), timeout_s=0.3
    )
    agent, provider = agent_with(sleeper)
    started = time.monotonic()
    result = agent.run("where is my order?")
    elapsed = time.monotonic() - started
    assert result.content == "done"
    assert 0.3 <= elapsed < 0.8
    assert tool_results(provider) == [
        "[timed out] lookup_order did not finish within 0.3 s; it may still complete in the "
        "background."
    ]


def test_the_agents_limit_applies_to_a_tool_without_its_own(release: threading.Event) -> None:
    agent, provider = agent_with(blocking_tool(release), tool_timeout_s=0.2)
    started = time.monotonic()
    agent.run("go")
    assert time.monotonic() - started < 0.7
    assert tool_results(provider) == [
        "[timed out] slow did not finish within 0.2 s; it may still complete in the background."
    ]


def test_a_tools_own_limit_wins_over_the_agents(release: threading.Event) -> None:
    tight = blocking_tool(release, timeout_s=0.2)
    agent, provider = agent_with(tight, tool_timeout_s=30)
    started = time.monotonic()
    agent.run("go")
    assert time.monotonic() - started < 0.7
    assert tool_results(provider)[0].startswith("[timed out] slow did not finish within 0.2 s")


def test_a_tools_longer_limit_wins_over_a_shorter_agent_default() -> None:
    @tool(timeout_s=5)
    def patient() -> str:
        """Takes half a second."""
        time.sleep(0.5)
        return "finished"

    agent, provider = agent_with(patient, tool_timeout_s=0.1)
    agent.run("go")
    assert tool_results(provider) == ["finished"]


def test_the_finished_report_of_a_timed_out_call_is_not_ok(release: threading.Event) -> None:
    seen: list[ToolCallReport] = []
    agent, _ = agent_with(blocking_tool(release, timeout_s=0.1))
    agent.run("go", on_tool_call=seen.append)
    assert [(r.phase, r.tool, r.tool_call_id, r.ok, r.landed) for r in seen] == [
        (ToolCallPhase.STARTED, "slow", "c1", None, None),
        (ToolCallPhase.FINISHED, "slow", "c1", False, False),
    ]
    assert (seen[1].content or "").startswith("[timed out]")


@pytest.mark.parametrize("late", ["returns", "raises"])
def test_a_late_result_never_reaches_history(release: threading.Event, late: str) -> None:
    def after() -> str:
        if late == "raises":
            raise RuntimeError("late failure")
        return "late result"

    returned = threading.Event()
    slow = blocking_tool(release, timeout_s=0.1, after=after, returned=returned)
    agent, provider = agent_with(slow, steps=[call("slow"), DONE, DONE])
    agent.run("go")
    before = agent.checkpoint()
    assert before is not None
    release.set()
    assert returned.wait(2), "the tool thread did not get to return"
    time.sleep(0.05)  # let the thread hand its result over, if it were going to
    after_return = agent.checkpoint()
    assert after_return is not None
    assert after_return.history == before.history
    agent.follow_up("and now?")
    sent = str(provider.requests[-1].messages)
    assert "late result" not in sent and "late failure" not in sent


def test_two_timed_out_identical_calls_get_no_identical_call_note(
    release: threading.Event,
) -> None:
    both = LLMResponse(
        tool_calls=[ToolCall("c1", "slow", {"q": 1}), ToolCall("c2", "slow", {"q": 1})]
    )
    agent, provider = agent_with(blocking_tool(release, timeout_s=0.1), steps=[both, DONE])
    agent.run("go")
    results = tool_results(provider)
    assert len(results) == 2 and results[0] == results[1]
    assert all("[identical call" not in text for text in results)


def test_a_later_hung_call_does_not_wait_for_an_earlier_one(release: threading.Event) -> None:
    steps = [call("slow", "c1"), call("slow", "c2"), call("slow", "c3"), DONE]
    agent, provider = agent_with(blocking_tool(release, timeout_s=0.15), steps=steps)
    started = time.monotonic()
    agent.run("go")
    assert time.monotonic() - started < 0.45 + 0.5
    assert all(text.startswith("[timed out]") for text in tool_results(provider, 3))


# ---------------------------------------------------------------------------------------------
# a call within its limit


@tool
def lookup_order(order_id: str) -> dict[str, Any]:
    """Look an order up."""
    if order_id == "bad":
        raise ValueError("no such order")
    return {"orderId": order_id, "status": "shipped"}


@pytest.mark.parametrize("order_id", ["A-17", "bad"])
def test_a_fast_call_with_a_limit_gives_what_it_gives_without(order_id: str) -> None:
    texts = []
    for limit in (None, 2.0):
        steps = [call("lookup_order", order_id=order_id), DONE]
        agent, provider = agent_with(lookup_order, steps=steps, tool_timeout_s=limit)
        started = time.monotonic()
        agent.run("where?")
        assert time.monotonic() - started < 0.5
        texts.append(tool_results(provider))
    assert texts[0] == texts[1]
    assert texts[0] == (
        ['{"orderId":"A-17","status":"shipped"}'] if order_id == "A-17" else ["no such order"]
    )


def test_a_tool_abort_within_the_limit_still_stops_the_run() -> None:
    def abort(args: dict[str, Any]) -> Any:
        raise ToolAbort("card declined for good")

    agent, _ = agent_with(Tool("charge", "Charges.", {"type": "object"}, abort, timeout_s=2))
    with pytest.raises(RunCheckpointError) as failed:
        agent.run("pay")
    assert isinstance(failed.value.cause, ToolAbort)


def test_only_a_call_with_a_limit_runs_in_a_thread_of_its_own() -> None:
    threads: list[threading.Thread] = []

    def where(args: dict[str, Any]) -> str:
        threads.append(threading.current_thread())
        return "here"

    for limit in (None, 1.0):
        agent, _ = agent_with(Tool("where", "Where?", {"type": "object"}, where, timeout_s=limit))
        agent.run("go")
    inline, limited = threads
    assert inline is threading.current_thread()
    assert limited is not threading.current_thread() and limited.daemon


def test_a_limited_call_sees_the_callers_context_variables() -> None:
    tenant: contextvars.ContextVar[str] = contextvars.ContextVar("tenant", default="none")
    tenant.set("acme")
    agent, provider = agent_with(
        Tool("tenant", "Whose?", {"type": "object"}, lambda args: tenant.get(), timeout_s=1)
    )
    agent.run("go")
    assert tool_results(provider) == ["acme"]


# ---------------------------------------------------------------------------------------------
# the options


def test_tool_takes_timeout_s_bare_or_with_arguments() -> None:
    @tool(timeout_s=2)
    def limited() -> str:
        """Limited."""
        return ""

    assert lookup_order.timeout_s is None
    assert limited.timeout_s == 2.0
    assert Tool("t", "", {}, lambda args: None).timeout_s is None
    assert Agent(provider=ScriptedProvider([]), model="m").tool_timeout_s is None


BAD_VALUES: list[tuple[object, type[Exception]]] = [
    (0, ValueError),
    (-1, ValueError),
    (math.nan, ValueError),
    (math.inf, ValueError),
    ("2", TypeError),
    (True, TypeError),
    ([2], TypeError),
]


@pytest.mark.parametrize(("value", "error"), BAD_VALUES)
def test_a_bad_limit_is_refused_naming_the_parameter(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match=r"Tool 't': timeout_s"):
        Tool("t", "", {}, lambda args: None, timeout_s=value)
    with pytest.raises(error, match=r"@tool\(timeout_s=\.\.\.\)"):
        tool(timeout_s=value)
    with pytest.raises(error, match=r"Agent\(tool_timeout_s=\.\.\.\)"):
        Agent(provider=ScriptedProvider([]), model="m", tool_timeout_s=value)
