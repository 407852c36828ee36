"""The agent the console's browser tests drive (tests/tasks/test_console.py), loaded by the
test workers as "console". The turn's message is `<tag> <mode>`:

    slow      calls wait(60): a turn that stays running until someone cancels it
    flaky     the provider refuses the request as malformed (HTTP 400, not resumable) while
              the Redis key console:<tag>:broken exists, so the turn is dead-lettered
              non_resumable; once the key is gone a replay succeeds
    (else)    answers "echo <mode>" at once
"""

from __future__ import annotations

import os
import time
from typing import Any

from agent import Agent, LLMRequest, LLMResponse, ProviderHTTPError, ToolCall, tool


def _redis() -> Any:
    import redis

    return redis.Redis.from_url(os.environ["REDIS_URL"])


def broken_key(tag: str) -> str:
    return f"console:{tag}:broken"


class _ConsoleProvider:
    name = "console"

    def complete(self, request: LLMRequest) -> LLMResponse:
        last_user = max(i for i, m in enumerate(request.messages) if m.get("role") == "user")
        tag, mode = [*str(request.messages[last_user]["content"]).split(), ""][:2]
        results = [m["content"] for m in request.messages[last_user:] if m.get("role") == "tool"]
        if results:
            return LLMResponse(content="done: " + " | ".join(str(r) for r in results))
        if mode == "slow":
            return LLMResponse(tool_calls=[ToolCall("c1", "wait", {"seconds": 60})])
        if mode == "flaky" and _redis().exists(broken_key(tag)):
            raise ProviderHTTPError("the provider refused the request as malformed", status=400)
        return LLMResponse(content=f"echo {mode}")


@tool(effect="read_only")
def wait(seconds: int) -> str:
    """Wait a while."""
    time.sleep(seconds)
    return f"waited {seconds}s"


def build_console_agent() -> Agent:
    return Agent(provider=_ConsoleProvider(), model="test-model", tools=[wait])
