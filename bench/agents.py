"""The agents bench/throughput.py registers in its own worker's environment: a provider that
answers at once, and one that takes PROVIDER_SLEEP_S per call, as an I/O-bound model does.
bench/journal.py's take tool rounds; bench/streaming.py's call a local model server over HTTP,
streamed or not."""

from __future__ import annotations

import functools
import time

from agent import Agent, LLMRequest, LLMResponse, OpenAIChatProvider, ToolCall, tool
from tasks.providers import provider_from_settings
from tasks.queue.context import job_context

PROVIDER_SLEEP_S = 0.2


class InstantProvider:
    name = "instant"

    def complete(self, request: LLMRequest) -> LLMResponse:
        return LLMResponse(content="ok")


class SleepingProvider:
    name = "sleeping"

    def complete(self, request: LLMRequest) -> LLMResponse:
        time.sleep(PROVIDER_SLEEP_S)
        return LLMResponse(content="ok")


# One provider per worker process, shared by every turn's Agent (the README's pattern).
_INSTANT = InstantProvider()
_SLEEPING = SleepingProvider()


def build_instant_agent() -> Agent:
    return Agent(provider=_INSTANT, model="bench")


def build_sleeping_agent() -> Agent:
    return Agent(provider=_SLEEPING, model="bench")


# -- bench/journal.py: tool rounds -------------------------------------------------------------

TOOL_RESULT = "order A-1042: shipped 2026-11-28 by parcel, tracking 1Z999AA10123456784"


class RoundsProvider:
    """Asks for one tool call per round for `rounds` rounds of each turn, then answers, with
    no wait: what is measured is the job system's own work per round."""

    name = "rounds"

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds

    def complete(self, request: LLMRequest) -> LLMResponse:
        # Tool messages since the turn's user message: the rounds this turn has had.
        done = 0
        for message in reversed(request.messages):
            if message.get("role") == "user":
                break
            done += message.get("role") == "tool"
        if done >= self.rounds:
            return LLMResponse(content=f"done after {done} rounds")
        call = ToolCall(id=f"call_{done + 1}", name="lookup", args={"orderId": "A-1042"})
        return LLMResponse(content="", tool_calls=[call])


@tool
def lookup(orderId: str) -> str:  # the model's argument name
    """Look an order up."""
    return TOOL_RESULT


_ONE_ROUND = RoundsProvider(1)
_THREE_ROUNDS = RoundsProvider(3)


def build_one_round_agent() -> Agent:
    return Agent(provider=_ONE_ROUND, model="bench", tools=[lookup])


def build_three_rounds_agent() -> Agent:
    return Agent(provider=_THREE_ROUNDS, model="bench", tools=[lookup])


# -- bench/streaming.py: a real provider over HTTP, streamed or not ----------------------------


@functools.cache
def _openai() -> OpenAIChatProvider:
    """The OpenAI provider of the worker's settings (AGENTJOBS_PROVIDER=openai, pointed at
    bench/streaming.py's server by OPENAI_BASE_URL), built on first use: other benches import
    this module without those settings."""
    provider = provider_from_settings(job_context().settings)
    assert isinstance(provider, OpenAIChatProvider), "set AGENTJOBS_PROVIDER=openai"
    return provider


class CompleteOnly:
    """A provider without `stream`: the runtime calls `complete` and tells the whole text as one
    delta, so the turn streams nothing while it waits (bench/streaming.py's baseline)."""

    def __init__(self, provider: OpenAIChatProvider) -> None:
        self._provider = provider
        self.name = provider.name

    def complete(self, request: LLMRequest) -> LLMResponse:
        return self._provider.complete(request)


def build_streaming_agent() -> Agent:
    return Agent(provider=_openai(), model="bench")


def build_complete_only_agent() -> Agent:
    return Agent(provider=CompleteOnly(_openai()), model="bench")
