"""Agent factories the test workers load by name (TEST_AGENTS in tests/tasks/conftest.py)."""

from __future__ import annotations

import os
import signal
from typing import Any

from agent import (
    Agent,
    LLMRequest,
    LLMResponse,
    OpenAIChatProvider,
    ProviderHTTPError,
    ToolCall,
    tool,
)
from tasks.demo.agents import _SlowAwareProvider, lookup_order


def _directive_agent(agent_id: str) -> Agent:
    return Agent(
        provider=_SlowAwareProvider(), model="test-model", tools=[lookup_order], id=agent_id
    )


def build_billing_agent() -> Agent:
    return _directive_agent("billing")


def build_support_agent() -> Agent:
    return _directive_agent("support")


@tool
def crash_worker() -> str:
    """Kills the process running it, as the OOM killer would."""
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


class _CrashProvider:
    name = "crash"

    def complete(self, request: LLMRequest) -> LLMResponse:
        if any(m.get("role") == "tool" for m in request.messages):
            return LLMResponse(content="survived")
        return LLMResponse(tool_calls=[ToolCall(id="c1", name="crash_worker", args={})])


def build_crasher_agent() -> Agent:
    return Agent(provider=_CrashProvider(), model="test-model", tools=[crash_worker])


class _LeakyProvider:
    """Fails the way a careless gateway does: its error text quotes the key and the URL."""

    name = "leaky"

    def complete(self, request: LLMRequest) -> LLMResponse:
        key = os.environ.get("OPENAI_API_KEY", "")
        status = 401 if "status:401" in str(request.messages[-1].get("content")) else 503
        raise ProviderHTTPError(
            f"upstream said no for key {key} at https://gateway.internal.example/v1/chat "
            f"(HTTP {status})",
            status=status,
        )


def build_leaky_agent() -> Agent:
    return Agent(provider=_LeakyProvider(), model="test-model")


def build_nothing() -> Any:
    return None


# The test's OpenAI-compatible server, for agents on a real HTTP provider.
TEST_OPENAI_BASE_URL = "AGENTJOBS_TEST_OPENAI_BASE_URL"


def build_openai_agent() -> Agent:
    """An agent on the real OpenAI provider, talking to the server the test started."""
    provider = OpenAIChatProvider(
        model="fake-model",
        base_url=os.environ[TEST_OPENAI_BASE_URL],
        api_key="sk-test-0123456789abcdef",
    )
    return Agent(provider=provider, model="fake-model", id="openai")


def build_raising() -> Any:
    raise RuntimeError("the model's settings are missing")
