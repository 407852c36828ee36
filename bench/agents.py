"""The agents bench/throughput.py registers in its own worker's environment: a provider that
answers at once, and one that takes PROVIDER_SLEEP_S per call, as an I/O-bound model does."""

from __future__ import annotations

import time

from agent import Agent, LLMRequest, LLMResponse, ToolCall, tool

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
