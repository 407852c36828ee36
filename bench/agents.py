"""The agents bench/throughput.py registers in its own worker's environment: a provider that
answers at once, and one that takes PROVIDER_SLEEP_S per call, as an I/O-bound model does."""

from __future__ import annotations

import time

from agent import Agent, LLMRequest, LLMResponse

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
