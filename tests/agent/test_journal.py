"""The journal hooks (agent/journal.py): what a host keeps of the iteration in flight, and a run
that continues that iteration from it instead of calling the model again."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

from agent import (
    OUTCOME_UNKNOWN,
    Agent,
    AgentRunCheckpoint,
    InvalidRunInputError,
    IterationJournal,
    JournaledCall,
    LLMResponse,
    ResponseReport,
    RunCheckpointError,
    ScriptedProvider,
    Tool,
    ToolCall,
    ToolCallPhase,
    ToolCallReport,
    ToolContext,
    ToolEffect,
    tool,
)

THREE_CALLS = LLMResponse(
    content="working",
    tool_calls=[
        ToolCall("c1", "pay", {"n": 1}),
        ToolCall("c2", "pay", {"n": 2}),
        ToolCall("c3", "pay", {"n": 3}),
    ],
)


class Ledger:
    """A tool that counts its starts, with the key and attempt each one saw."""

    def __init__(self, effect: str = "idempotent", crash_on: int | None = None) -> None:
        self.starts: list[tuple[int, str, int]] = []
        self.crash_on = crash_on
        self.lock = threading.Lock()

        def pay(args: dict[str, Any], ctx: ToolContext) -> str:
            with self.lock:
                self.starts.append((args["n"], ctx.idempotency_key, ctx.attempt))
            if args["n"] == self.crash_on:
                raise KeyboardInterrupt  # stands for the process dying mid-call
            return f"paid {args['n']}"

        self.tool = Tool("pay", "Pay.", {"type": "object"}, pay, effect=effect)


class Keeper:
    """A host's journal, kept from the hooks as the job system keeps it."""

    def __init__(self) -> None:
        self.response: ResponseReport | None = None
        self.calls: dict[int, JournaledCall] = {}

    def on_response(self, report: ResponseReport) -> None:
        self.response, self.calls = report, {}

    def on_tool_call(self, report: ToolCallReport) -> None:
        self.calls[report.index] = JournaledCall(
            report.tool_call_id,
            report.idempotency_key,
            report.attempt,
            content=report.content,
            ok=report.ok,
            landed=bool(report.landed) if report.landed is not None else True,
        )

    def journal(self) -> IterationJournal:
        assert self.response is not None
        return IterationJournal(self.response.history_length, self.response.message, self.calls)


def interrupted_run(ledger: Ledger, keeper: Keeper) -> AgentRunCheckpoint:
    """Run until call `crash_on` dies; return the last progress the host persisted."""
    progress: list[AgentRunCheckpoint] = []
    agent = Agent(provider=ScriptedProvider([THREE_CALLS]), model="m", tools=[ledger.tool])
    with pytest.raises(KeyboardInterrupt):
        agent.run(
            "pay three",
            on_progress=progress.append,
            on_response=keeper.on_response,
            on_tool_call=keeper.on_tool_call,
        )
    return progress[-1]


def resumed(
    ledger: Ledger, checkpoint: AgentRunCheckpoint, journal: IterationJournal | None
) -> tuple[Any, ScriptedProvider]:
    provider = ScriptedProvider([LLMResponse(content="all paid")])
    agent = Agent(provider=provider, model="m", tools=[ledger.tool])
    return agent.resume_on_error(checkpoint, journal=journal), provider


def tool_contents(checkpoint: AgentRunCheckpoint) -> list[str]:
    return [m["content"] for m in checkpoint.history if m["role"] == "tool"]


def test_the_response_is_reported_before_any_of_its_tools_runs() -> None:
    order: list[str] = []
    ledger = Ledger()
    agent = Agent(
        provider=ScriptedProvider([THREE_CALLS, LLMResponse(content="ok")]),
        model="m",
        tools=[ledger.tool],
    )

    def on_response(report: ResponseReport) -> None:
        order.append(f"response {report.history_length} {len(report.message['toolCalls'])}")

    def on_tool_call(report: ToolCallReport) -> None:
        order.append(f"{report.phase} {report.index}")

    agent.run("pay", on_response=on_response, on_tool_call=on_tool_call)
    assert order[0] == "response 1 3"
    assert order[1:] == [f"{p} {i}" for i in range(3) for p in ("started", "finished")]


def test_without_a_journal_every_call_gets_its_own_key_and_attempt_one() -> None:
    ledger = Ledger()
    agent = Agent(
        provider=ScriptedProvider([THREE_CALLS, THREE_CALLS, LLMResponse(content="ok")]),
        model="m",
        tools=[ledger.tool],
    )
    agent.run("pay")
    keys = [key for _, key, _ in ledger.starts]
    assert len(keys) == 6 and len(set(keys)) == 6
    assert {attempt for _, _, attempt in ledger.starts} == {1}


@pytest.mark.parametrize("effect", ["idempotent", "read_only"])
def test_a_resumed_iteration_reruns_only_the_interrupted_call_with_its_key(effect: str) -> None:
    ledger, keeper = Ledger(effect, crash_on=2), Keeper()
    checkpoint = interrupted_run(ledger, keeper)
    first_key_of_2 = ledger.starts[1][1]
    ledger.crash_on = None
    result, provider = resumed(ledger, checkpoint, keeper.journal())
    # no second model call for the iteration in flight: the only request is the answer's
    assert len(provider.requests) == 1
    assert Counter(n for n, _, _ in ledger.starts) == {1: 1, 2: 2, 3: 1}
    assert ledger.starts[2] == (2, first_key_of_2, 2)  # same key, next attempt
    assert ledger.starts[3][2] == 1  # never started before: attempt 1
    assert tool_contents(result.checkpoint) == ["paid 1", "paid 2", "paid 3"]


def test_an_interrupted_unsafe_call_is_not_run_again_and_says_outcome_unknown() -> None:
    ledger, keeper = Ledger("unsafe", crash_on=2), Keeper()
    checkpoint = interrupted_run(ledger, keeper)
    ledger.crash_on = None
    result, _ = resumed(ledger, checkpoint, keeper.journal())
    assert Counter(n for n, _, _ in ledger.starts) == {1: 1, 2: 1, 3: 1}
    contents = tool_contents(result.checkpoint)
    assert contents[0] == "paid 1" and contents[2] == "paid 3"
    assert contents[1].startswith(OUTCOME_UNKNOWN) and "may or may not" in contents[1]


def test_the_resumed_turn_sends_the_model_what_an_uninterrupted_one_sends() -> None:
    ledger, keeper = Ledger(crash_on=3), Keeper()
    checkpoint = interrupted_run(ledger, keeper)
    ledger.crash_on = None
    _, provider = resumed(ledger, checkpoint, keeper.journal())

    plain = ScriptedProvider([THREE_CALLS, LLMResponse(content="all paid")])
    Agent(provider=plain, model="m", tools=[Ledger().tool]).run("pay three")
    assert provider.requests[0].to_dict() == plain.requests[1].to_dict()


def test_a_journal_of_another_point_of_the_history_is_ignored() -> None:
    ledger, keeper = Ledger(crash_on=2), Keeper()
    checkpoint = interrupted_run(ledger, keeper)
    journal = keeper.journal()
    stale = IterationJournal(journal.history_length + 2, journal.message, journal.calls)
    ledger.crash_on = None
    provider = ScriptedProvider([THREE_CALLS, LLMResponse(content="ok")])
    agent = Agent(provider=provider, model="m", tools=[ledger.tool])
    agent.resume_on_error(checkpoint, journal=stale)
    assert len(provider.requests) == 2  # the model was asked again


def test_the_checkpoint_after_a_journaled_iteration_is_v1() -> None:
    ledger, keeper = Ledger(crash_on=1), Keeper()
    checkpoint = interrupted_run(ledger, keeper)
    ledger.crash_on = None
    result, _ = resumed(ledger, checkpoint, keeper.journal())
    again = AgentRunCheckpoint.from_json(result.checkpoint.to_json())
    assert again.version == 1 and again == result.checkpoint


def test_a_journal_message_without_tool_calls_is_refused() -> None:
    with pytest.raises(InvalidRunInputError, match=r"journal\.message"):
        IterationJournal(1, {"role": "assistant", "content": "hi"})


def test_effects_are_checked_where_they_are_given() -> None:
    with pytest.raises(ValueError, match="effect must be one of"):
        Tool("t", "", {}, lambda args: None, effect="maybe")
    with pytest.raises(ValueError, match=r"@tool\(effect=...\)"):
        tool(effect="sometimes")

    @tool(effect="unsafe")
    def charge(amount: int) -> str:
        """Charge."""
        return "ok"

    assert charge.effect is ToolEffect.UNSAFE
    assert Tool("t", "", {}, lambda args: None).effect is ToolEffect.IDEMPOTENT


def parallel_agent(ledger: Ledger, barrier: threading.Barrier) -> Agent:
    def slow(args: dict[str, Any], ctx: ToolContext) -> str:
        barrier.wait(timeout=5)  # every call must be running at once to pass
        return ledger.tool.execute(args, ctx)  # type: ignore[no-any-return]

    parallel = Tool("pay", "Pay.", {"type": "object"}, slow)
    provider = ScriptedProvider([THREE_CALLS, LLMResponse(content="ok")])
    return Agent(provider=provider, model="m", tools=[parallel], parallel_tools=True)


def test_parallel_calls_run_at_once_and_keep_the_models_order() -> None:
    ledger = Ledger()
    result = parallel_agent(ledger, threading.Barrier(3)).run("pay")
    assert tool_contents(result.checkpoint) == ["paid 1", "paid 2", "paid 3"]
    assert [m.get("toolCallId") for m in result.checkpoint.history if m["role"] == "tool"] == [
        "c1",
        "c2",
        "c3",
    ]


def test_a_parallel_call_that_fails_the_run_lets_the_others_finish_and_report() -> None:
    ledger, finished = Ledger(), []

    def hook(report: ToolCallReport) -> None:
        if report.phase is ToolCallPhase.FINISHED:
            if report.index == 0:
                raise RuntimeError("lease lost")
            finished.append(report.index)

    with pytest.raises(RunCheckpointError) as failed:
        parallel_agent(ledger, threading.Barrier(3)).run("pay", on_tool_call=hook)
    assert isinstance(failed.value.cause, RuntimeError)
    assert sorted(finished) == [1, 2]
    assert failed.value.checkpoint.failure_point["phase"] == "tool"


def test_parallel_tools_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="parallel_tools"):
        Agent(provider=ScriptedProvider([]), model="m", parallel_tools="yes")  # type: ignore[arg-type]
