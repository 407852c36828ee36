"""The demo agent: a scripted model steered by directives in the user message, so the demo and
the integration tests can ask for failures from outside the worker. Not in the production
registry: the demo registers it in its own worker's environment (AGENTJOBS_AGENTS), and so do
the tests.

Directives (words in the message):
  fail:503x2      the first 2 model calls of this turn fail with HTTP 503 (resumable)
  fail:429x1@2    the first call fails with 429 and retry-after 2 s
  fail:401        every call fails with 401 (not resumable: dead-lettered at once)
  rounds:3        call the `lookup_order` tool in 3 iterations before answering
  slow:1.5        each tool call takes 1.5 s (time to kill a worker mid-turn)
  think:0.2       each model call takes 0.2 s (an I/O-bound provider)
  refund:D-4      ask for refund_order(D-4), a tool that needs a person's approval
Counters live in Redis under the demo key prefix, so they survive retries in other processes:
`calls` (model calls per turn) and `tool` (tool executions per turn and iteration).
"""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass
from typing import Any

from agent import (
    Agent,
    LLMProvider,
    LLMRequest,
    LLMResponse,
    ProviderHTTPError,
    ToolCall,
    fnv1a,
    tool,
)
from tasks.providers import provider_from_settings
from tasks.queue.context import job_context

_DIRECTIVE = re.compile(r"\b(fail|rounds|slow|think|refund):([0-9A-Za-z.@-]+)")


@dataclass(frozen=True)
class Directives:
    fail_status: int | None = None
    fail_times: int = 0
    retry_after_s: float | None = None
    rounds: int = 0
    slow_s: float = 0.0
    think_s: float = 0.0
    refund: str = ""

    @classmethod
    def read(cls, text: str) -> Directives:
        values: dict[str, Any] = {}
        for name, raw in _DIRECTIVE.findall(text):
            if name == "fail":
                status, _, rest = raw.partition("x")
                times, _, after = rest.partition("@")
                values["fail_status"] = int(status)
                values["fail_times"] = int(times) if times else 1_000_000
                values["retry_after_s"] = float(after) if after else None
            elif name == "rounds":
                values["rounds"] = int(raw)
            elif name == "slow":
                values["slow_s"] = float(raw)
            elif name == "think":
                values["think_s"] = float(raw)
            elif name == "refund":
                values["refund"] = raw
        return cls(**values)


def _last_user(request: LLMRequest) -> tuple[int, str]:
    for index in range(len(request.messages) - 1, -1, -1):
        message = request.messages[index]
        if message.get("role") == "user":
            return index, str(message.get("content", ""))
    return -1, ""


def turn_key(messages: list[dict[str, Any]], last_user_index: int) -> str:
    """Names one turn of one conversation: a fingerprint of the history up to its user turn."""
    seen = "\u241e".join(
        f"{m.get('role')}:{m.get('content')}" for m in messages[: last_user_index + 1]
    )
    return fnv1a(seen)


def demo_counter(name: str) -> str:
    return f"{job_context().keys.prefix}:demo:{name}"


class DirectiveProvider:
    name = "demo-directives"

    def complete(self, request: LLMRequest) -> LLMResponse:
        index, text = _last_user(request)
        directives = Directives.read(text)
        key = turn_key(request.messages, index)
        if directives.think_s:
            time.sleep(directives.think_s)
        if directives.fail_status is not None:
            calls = job_context().redis.incr(demo_counter(f"calls:{key}"))
            if int(calls) <= directives.fail_times:
                raise ProviderHTTPError(
                    f"demo provider refused call {calls} (HTTP {directives.fail_status})",
                    status=directives.fail_status,
                    retry_after_s=directives.retry_after_s,
                )
        rounds_done = sum(1 for m in request.messages[index + 1 :] if m.get("role") == "tool")
        if directives.refund and not rounds_done:
            call = ToolCall("call_refund", "refund_order", {"orderId": directives.refund})
            return LLMResponse(content="", tool_calls=[call])
        if rounds_done < directives.rounds:
            call = ToolCall(
                id=f"call_{rounds_done + 1}",
                name="lookup_order",
                args={"orderId": f"A-{rounds_done + 1}", "turn": key, "round": rounds_done + 1},
            )
            return LLMResponse(content="", tool_calls=[call])
        return LLMResponse(content=f"Done: {text[:60]}")


@tool(description="Look up an order by id (demo: counts its own executions in Redis).")
def lookup_order(
    orderId: str,
    turn: str = "",
    round: int = 0,
) -> dict[str, Any]:
    context = job_context()
    slow_s = Directives.read(orderId).slow_s
    context.redis.hincrby(demo_counter(f"tool:{turn}"), str(round), 1)
    if slow_s:
        time.sleep(slow_s)
    return {"orderId": orderId, "status": "shipped", "eta": "2026-09-01"}


@tool(
    description="Refund an order (demo). Needs a person's approval first.",
    approval=True,
    effect="unsafe",
)
def refund_order(orderId: str) -> dict[str, Any]:
    return {"orderId": orderId, "refunded": True}


class _SlowAwareProvider(DirectiveProvider):
    """Passes the slow: directive to the tool through its arguments."""

    def complete(self, request: LLMRequest) -> LLMResponse:
        response = super().complete(request)
        if not response.tool_calls:
            return response
        _, text = _last_user(request)
        slow = Directives.read(text).slow_s
        if not slow:
            return response
        calls = [
            ToolCall(c.id, c.name, {**c.args, "orderId": f"{c.args['orderId']} slow:{slow}"})
            for c in response.tool_calls
        ]
        return LLMResponse(content=response.content, tool_calls=calls)


@functools.cache
def _provider() -> LLMProvider:
    # One provider per worker process, shared by every turn's Agent: its HTTP client keeps its
    # connections across turns (providers are thread-safe; an Agent runs one turn at a time).
    return provider_from_settings(job_context().settings) or _SlowAwareProvider()


def build_demo_agent() -> Agent:
    """The demo's agent: a real provider when AGENTJOBS_PROVIDER names one, else directives."""
    provider = _provider()
    return Agent(
        provider=provider,
        model="demo-model",
        system="You are a concise support agent.",
        tools=[lookup_order, refund_order],
        max_iterations=8,
    )
