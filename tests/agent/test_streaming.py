"""Token streaming in the runtime alone: `on_token` on every door, the in-process providers'
streams, the fallback to `complete`, and a streamed call that changes nothing else of a run
(hooks, history, checkpoints, model requests) or fails the way any model call does."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agent import (
    Agent,
    Decision,
    EchoProvider,
    LLMRequest,
    LLMResponse,
    ModelCallReport,
    ProviderConnectionError,
    RunCheckpointError,
    RunHooks,
    ScriptedProvider,
    StreamChunk,
    TokenDelta,
    ToolCall,
    can_resume,
    tool,
)
from agent.providers.scripted import Step
from tests.agent.support import answer, lookup_call, support_agent, without_volatile

REQUEST = LLMRequest("", [{"role": "user", "content": "Book a table."}], [], "m")


@tool(approval=True)
def refund(order_id: str) -> str:
    """Refund an order."""
    return f"refunded {order_id}"


class WholeOnly:
    """A provider of another library: `complete` and nothing else."""

    name = "whole-only"

    def __init__(self, steps: list[Step]) -> None:
        self._scripted = ScriptedProvider(steps)

    def complete(self, request: LLMRequest) -> LLMResponse:
        return self._scripted.complete(request)


class CutShort(ScriptedProvider):
    """Streams its first words, then ends (or fails) without the final chunk."""

    def __init__(self, steps: list[Step], failure: Exception | None = None) -> None:
        super().__init__(steps)
        self.failure = failure
        self.closed = False

    def stream(self, request: LLMRequest) -> Iterator[StreamChunk]:
        try:
            yield StreamChunk("Order ")
            yield StreamChunk("A-17 ")
            if self.failure is not None:
                raise self.failure
        finally:
            self.closed = True


# -- the in-process providers stream -------------------------------------------------------


def test_scripted_provider_streams_words_then_the_same_response() -> None:
    response = LLMResponse(content="  Order A-17 has\nshipped. ", usage={"outputTokens": 4})
    provider = ScriptedProvider([response])

    chunks = list(provider.stream(REQUEST))

    assert [c.text for c in chunks] == ["  ", "Order ", "A-17 ", "has\n", "shipped. ", ""]
    assert [c.response for c in chunks] == [None] * 5 + [response]
    assert provider.requests == [REQUEST]


def test_scripted_provider_raising_step_raises_before_any_chunk() -> None:
    provider = ScriptedProvider([ProviderConnectionError("down")])

    with pytest.raises(ProviderConnectionError):
        provider.stream(REQUEST)

    assert provider.requests == [REQUEST] and provider.remaining == 0


def test_echo_provider_streams_its_answer() -> None:
    provider = EchoProvider()

    chunks = list(provider.stream(REQUEST))

    assert [c.text for c in chunks] == ["echo: ", "Book ", "a ", "table.", ""]
    assert chunks[-1].response == provider.complete(REQUEST)


def test_a_reply_without_text_is_one_final_chunk() -> None:
    response = lookup_call()

    assert list(ScriptedProvider([response]).stream(REQUEST)) == [StreamChunk("", response)]


# -- on_token in a run ---------------------------------------------------------------------


def test_deltas_arrive_in_order_with_each_calls_iteration_across_a_tool_round() -> None:
    # Given a turn whose first model call says something and calls a tool, then answers
    steps = [lookup_call("Let me look that up."), answer("Order A-17 has shipped.")]
    watched, watched_provider = support_agent(steps)
    plain, plain_provider = support_agent(steps)
    reports: list[list[ModelCallReport]] = [[], []]
    progress: list[list[dict[str, Any]]] = [[], []]

    # When one agent runs it watching tokens and the other without
    deltas: list[TokenDelta] = []
    streamed = watched.run(
        "Where is A-17?",
        on_token=deltas.append,
        on_model_call=reports[0].append,
        on_progress=lambda c: progress[0].append(without_volatile(c.to_dict())),
    )
    whole = plain.run(
        "Where is A-17?",
        on_model_call=reports[1].append,
        on_progress=lambda c: progress[1].append(without_volatile(c.to_dict())),
    )

    # Then each call's words came in order, numbered with its iteration (1-based)
    assert deltas == [
        TokenDelta(1, "Let "),
        TokenDelta(1, "me "),
        TokenDelta(1, "look "),
        TokenDelta(1, "that "),
        TokenDelta(1, "up."),
        TokenDelta(2, "Order "),
        TokenDelta(2, "A-17 "),
        TokenDelta(2, "has "),
        TokenDelta(2, "shipped."),
    ]
    assert streamed.iterations == 2
    # And nothing else differs: the answer, the reports, every checkpoint, every request
    assert streamed.content == whole.content
    assert reports[0] == reports[1]
    assert progress[0] == progress[1]
    assert without_volatile(streamed.checkpoint.to_dict()) == without_volatile(
        whole.checkpoint.to_dict()
    )
    assert watched_provider.requests == plain_provider.requests


def test_without_on_token_the_provider_is_not_streamed() -> None:
    class NoStreamWanted(ScriptedProvider):
        def stream(self, request: LLMRequest) -> Iterator[StreamChunk]:
            raise AssertionError("stream called without on_token")

    provider = NoStreamWanted([answer("done")])
    result = Agent(provider=provider, model="m").run("hi")

    assert result.content == "done"


def test_a_provider_without_stream_is_called_whole_and_tells_no_tokens() -> None:
    # (a job system writes no token events for a provider that cannot stream)
    provider = WholeOnly([lookup_call(), answer("Order A-17 has shipped.")])
    agent = Agent(provider=provider, model="m", tools=support_agent([])[0].tools)
    deltas: list[TokenDelta] = []

    result = agent.run("Where is A-17?", on_token=deltas.append)

    assert result.content == "Order A-17 has shipped."
    assert deltas == []


def test_on_token_goes_with_a_hooks_object() -> None:
    class Count(RunHooks):
        calls = 0

        def after_model_call(self, report: ModelCallReport) -> None:
            Count.calls += 1

    agent, _ = support_agent([answer("Shipped.")])
    deltas: list[TokenDelta] = []

    agent.run("Where?", hooks=Count(), on_token=deltas.append)

    assert deltas == [TokenDelta(1, "Shipped.")] and Count.calls == 1


def test_on_token_must_be_callable() -> None:
    agent, _ = support_agent([answer("x")])

    with pytest.raises(TypeError, match="on_token"):
        agent.run("hi", on_token="print")  # type: ignore[arg-type]


# -- the other doors -----------------------------------------------------------------------


def test_follow_up_and_resume_on_error_stream_too() -> None:
    agent, _ = support_agent(
        [answer("First."), ProviderConnectionError("provider down"), answer("Second.")]
    )
    deltas: list[TokenDelta] = []
    agent.run("one", on_token=deltas.append)

    with pytest.raises(RunCheckpointError) as failed:
        agent.follow_up("two", on_token=deltas.append)
    agent.resume_on_error(failed.value.checkpoint, on_token=deltas.append)

    assert [d.text for d in deltas] == ["First.", "Second."]


def test_resume_after_a_pause_streams_the_next_model_call() -> None:
    provider = ScriptedProvider(
        [LLMResponse(tool_calls=[ToolCall("c1", "refund", {"order_id": "A"})]), answer("Done.")]
    )
    agent = Agent(provider=provider, model="m", tools=[refund])
    pause = agent.run("refund A", on_token=lambda d: None).pause
    assert pause is not None
    deltas: list[TokenDelta] = []

    result = agent.resume({pause.pending[0].request_id: Decision.approve()}, on_token=deltas.append)

    assert result.content == "Done."
    assert deltas == [TokenDelta(result.iterations, "Done.")]


# -- a streamed call that fails --------------------------------------------------------------


def test_a_stream_that_ends_without_its_response_is_a_resumable_provider_error() -> None:
    # Given a provider whose stream ends after two words, without the final chunk
    provider = CutShort([])
    agent = Agent(provider=provider, model="m")
    deltas: list[TokenDelta] = []
    reports: list[ModelCallReport] = []

    # When a run watches its tokens
    with pytest.raises(RunCheckpointError) as info:
        agent.run("Where is A-17?", on_token=deltas.append, on_model_call=reports.append)

    # Then the words came, and the run failed in its model call with a resumable error
    assert [d.text for d in deltas] == ["Order ", "A-17 "]
    err = info.value
    assert type(err.cause) is ProviderConnectionError and can_resume(err)
    assert err.checkpoint.failure_point == {"iteration": 1, "phase": "llm", "stage": "call-llm"}
    assert reports[-1].ok is False and reports[-1].error_type == "ProviderConnectionError"
    assert provider.closed


def test_a_stream_that_fails_midway_fails_as_its_error() -> None:
    provider = CutShort([], failure=ProviderConnectionError("connection broke mid-reply"))
    agent = Agent(provider=provider, model="m")

    with pytest.raises(RunCheckpointError) as info:
        agent.run("hi", on_token=lambda d: None)

    assert str(info.value.cause) == "connection broke mid-reply"
    assert provider.closed


def test_on_token_that_raises_fails_the_run_and_closes_the_stream() -> None:
    provider = CutShort([])
    agent = Agent(provider=provider, model="m")

    def refuse(delta: TokenDelta) -> None:
        raise RuntimeError("viewer went away")

    with pytest.raises(RunCheckpointError) as info:
        agent.run("hi", on_token=refuse)

    assert str(info.value.cause) == "viewer went away"
    assert provider.closed


def test_a_stream_of_something_else_is_a_type_error() -> None:
    class Odd(ScriptedProvider):
        def stream(self, request: LLMRequest) -> Iterator[Any]:
            yield "Order"

    with pytest.raises(RunCheckpointError) as info:
        Agent(provider=Odd([]), model="m").run("hi", on_token=lambda d: None)

    assert isinstance(info.value.cause, TypeError)
    assert "not a StreamChunk" in str(info.value.cause)
