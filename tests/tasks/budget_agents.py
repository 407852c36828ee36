"""The agent the budget tests' workers load: a provider named "fake" that keeps its own log of
the calls it answered and the tokens it reported (a Redis list, read by the tests), so a test
checks the windows from the provider's side, not from the ledger's.

Settings, from the worker's environment:
    AGENTJOBS_TEST_PROVIDER_LOG    the list key of the log (default test:provider-log)
    AGENTJOBS_TEST_INPUT_TOKENS    input tokens each answer reports (default 20)
    AGENTJOBS_TEST_OUTPUT_TOKENS   output tokens each answer reports (default 10)
    AGENTJOBS_TEST_MAX_TOKENS      the provider's max_tokens, its output cap (default 50)
    AGENTJOBS_TEST_CALL_S          how long each call takes (default 0)
A message containing "rate-limit-once" is answered 429 with retry-after 1 s the first time.
"""

from __future__ import annotations

import os
import time

import orjson
import redis

from agent import Agent, LLMRequest, LLMResponse, ProviderHTTPError

LOG_KEY = "test:provider-log"


class MeteredProvider:
    name = "fake"

    def __init__(self) -> None:
        self.log_key = os.environ.get("AGENTJOBS_TEST_PROVIDER_LOG", LOG_KEY)
        self.tokens_in = int(os.environ.get("AGENTJOBS_TEST_INPUT_TOKENS", "20"))
        self.tokens_out = int(os.environ.get("AGENTJOBS_TEST_OUTPUT_TOKENS", "10"))
        self.max_tokens = int(os.environ.get("AGENTJOBS_TEST_MAX_TOKENS", "50"))
        self.call_s = float(os.environ.get("AGENTJOBS_TEST_CALL_S", "0"))
        self.redis = redis.Redis.from_url(os.environ["REDIS_URL"])

    def complete(self, request: LLMRequest) -> LLMResponse:
        text = str(request.messages[-1].get("content") or "")
        started = time.time() * 1000
        if "rate-limit-once" in text and self.redis.incr(f"test:429:{text}") == 1:
            self._log(text, started, 0, 429)
            raise ProviderHTTPError("fake: slow down", status=429, retry_after_s=1.0)
        if self.call_s:
            time.sleep(self.call_s)
        self._log(text, started, self.tokens_in + self.tokens_out, 200)
        usage = {"inputTokens": self.tokens_in, "outputTokens": self.tokens_out}
        return LLMResponse(content=f"answered: {text}", usage=usage)

    def _log(self, text: str, started: float, tokens: int, status: int) -> None:
        at = time.time() * 1000
        entry = {"text": text, "start": started, "at": at, "tokens": tokens, "status": status}
        self.redis.rpush(self.log_key, orjson.dumps(entry))


def build_metered_agent() -> Agent:
    return Agent(provider=MeteredProvider(), model="m1", id="metered")
