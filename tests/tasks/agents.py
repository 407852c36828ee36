"""Agent factories the test workers load by name (TEST_AGENTS in tests/tasks/conftest.py)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import orjson

from agent import (
    Agent,
    LLMRequest,
    LLMResponse,
    OpenAIChatProvider,
    ProviderHTTPError,
    ToolCall,
    ToolContext,
    ask_user,
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


# -- the journal: a response with three calls, a process killed during one of them ------------


def _journal_redis() -> Any:
    import redis

    return redis.Redis.from_url(os.environ["REDIS_URL"])


class _ThreeCallProvider:
    """Asks for pay(1), pay(2), pay(3) in one response, then answers. The turn's message is
    `<tag> kill:<n> [slow:<m>]`: its calls are counted under journal:<tag>:model, the tool
    kills its worker during the first start of call n, and takes 2 s over call m."""

    name = "three-calls"

    def complete(self, request: LLMRequest) -> LLMResponse:
        tag, kill, *slow = str(request.messages[0]["content"]).split()
        _journal_redis().incr(f"journal:{tag}:model")
        if any(m.get("role") == "tool" for m in request.messages):
            return LLMResponse(content="all paid")
        kill_at = int(kill.removeprefix("kill:"))
        slow_at = int(slow[0].removeprefix("slow:")) if slow else 0
        args = {"tag": tag, "kill": kill_at, "slow": slow_at}
        calls = [ToolCall(id=f"c{n}", name="pay", args={"n": n, **args}) for n in (1, 2, 3)]
        return LLMResponse(tool_calls=calls)


def _pay_tool(effect: str, parallel: bool) -> Any:
    @tool(effect=effect)
    def pay(n: int, tag: str, kill: int, ctx: ToolContext, slow: int = 0) -> str:
        """Pay item n; each start is recorded with the key and attempt it saw."""
        start = {"n": n, "key": ctx.idempotency_key, "attempt": ctx.attempt}
        _journal_redis().rpush(f"journal:{tag}:starts", orjson.dumps(start))
        if n == kill and ctx.attempt == 1:
            if parallel:
                time.sleep(1.0)  # the other calls finish and are journaled meanwhile
            os.kill(os.getpid(), signal.SIGKILL)
        if n == slow:
            time.sleep(2.0)
        return f"paid {n}"

    return pay


def _journal_agent(effect: str, parallel: bool) -> Agent:
    return Agent(
        provider=_ThreeCallProvider(),
        model="test-model",
        tools=[_pay_tool(effect, parallel)],
        parallel_tools=parallel,
    )


def build_journal_idempotent() -> Agent:
    return _journal_agent("idempotent", parallel=False)


def build_journal_unsafe() -> Agent:
    return _journal_agent("unsafe", parallel=False)


def build_journal_parallel_idempotent() -> Agent:
    return _journal_agent("idempotent", parallel=True)


def build_journal_parallel_unsafe() -> Agent:
    return _journal_agent("unsafe", parallel=True)


# -- people in the loop: a refund that needs a person's yes, a question ---------------------


class _PersonProvider:
    """The turn's message is `<tag> <mode>`. Modes: `refund` asks for lookup(A) and refund(A)
    in one response; `ask` asks the person which order; `credit:<n>` asks for credit(n) (an
    approval callable: more than 100 needs a person). Then it answers with the tool results.
    Model calls are counted under pause:<tag>:model."""

    name = "person"

    def complete(self, request: LLMRequest) -> LLMResponse:
        last_user = max(i for i, m in enumerate(request.messages) if m.get("role") == "user")
        tag, mode = str(request.messages[last_user]["content"]).split()[:2]
        _journal_redis().incr(f"pause:{tag}:model")
        results = [m["content"] for m in request.messages[last_user:] if m.get("role") == "tool"]
        if results:
            return LLMResponse(content="done: " + " | ".join(results))
        if mode == "refund":
            calls = [
                ToolCall("c1", "lookup", {"order_id": "A", "tag": tag}),
                ToolCall("c2", "refund", {"order_id": "A", "tag": tag}),
            ]
        elif mode == "ask":
            calls = [ToolCall("c1", "ask_user", {"question": "Which order?"})]
        else:
            calls = [ToolCall("c1", "credit", {"amount": int(mode.split(":")[1]), "tag": tag})]
        return LLMResponse(tool_calls=calls)


def _ran(tag: str, what: str) -> None:
    _journal_redis().rpush(f"pause:{tag}:runs", what)


@tool(effect="read_only")
def lookup(order_id: str, tag: str) -> str:
    """Look an order up."""
    _ran(tag, f"lookup {order_id}")
    return f"{order_id} shipped"


@tool(approval=True, effect="unsafe")
def refund(order_id: str, tag: str) -> str:
    """Refund an order."""
    _ran(tag, f"refund {order_id}")
    return f"refunded {order_id}"


def _big(args: dict[str, Any], ctx: ToolContext) -> bool:
    return int(args["amount"]) > 100


@tool(approval=_big)
def credit(amount: int, tag: str) -> str:
    """Credit an amount."""
    _ran(tag, f"credit {amount}")
    return f"credited {amount}"


def build_person_agent() -> Agent:
    return Agent(
        provider=_PersonProvider(),
        model="test-model",
        tools=[lookup, refund, credit, ask_user],
    )


# -- a tool whose exception text quotes secrets ---------------------------------------------

# The worker's environment holds this under a secret-looking name (tests/tasks/test_security.py).
LEAKY_TOOL_ENV = "BILLING_GATEWAY_TOKEN"


@tool
def charge_card(amount: int) -> str:
    """Charge the card on file."""
    raise RuntimeError(
        f"charge of {amount} failed: key sk-proj-Q3xT9vLm2NpR7sWk4YbZ8cDe, fallback "
        "sk-ant-api03-H8jK2mN5pQ7rT1vXy, 'Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.c2VjcmV0.x' "
        "to https://svc-user:hunter2-Pa55word@billing.internal.example/v2/charges, gateway "
        f"token {os.environ.get(LEAKY_TOOL_ENV, '')}"
    )


class _EchoToolProvider:
    """Asks for charge_card, then answers with the tool's text verbatim, as a model may."""

    name = "echo-tool"

    def complete(self, request: LLMRequest) -> LLMResponse:
        results = [str(m["content"]) for m in request.messages if m.get("role") == "tool"]
        if results:
            return LLMResponse(content="the tool said: " + results[-1])
        return LLMResponse(tool_calls=[ToolCall("c1", "charge_card", {"amount": 5})])


def build_leaky_tool_agent() -> Agent:
    return Agent(provider=_EchoToolProvider(), model="test-model", tools=[charge_card])
