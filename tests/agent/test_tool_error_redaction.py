"""A tool's exception text is redacted before the history, the hooks, the next request or the
result holds it (docs PLATFORM.md 1, "No secret in a checkpoint, also from tools")."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from agent import (
    Agent,
    LLMRequest,
    LLMResponse,
    ProgressReport,
    ScriptedProvider,
    ToolCall,
    ToolCallPhase,
    ToolCallReport,
    tool,
)

OPENAI_KEY = "sk-proj-Q3xT9vLm2NpR7sWk4YbZ8cDe"
ANTHROPIC_KEY = "sk-ant-api03-H8jK2mN5pQ7rT1vXy"
BEARER_TOKEN = "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0.dG9rZW4"
URL_PASSWORD = "hunter2-Pa55word"
ERROR_TEXT = (
    f"charge failed: key {OPENAI_KEY} (fallback {ANTHROPIC_KEY}) sent with "
    f"'Authorization: Bearer {BEARER_TOKEN}' to "
    f"https://svc-user:{URL_PASSWORD}@billing.internal.example/v2/charges?api_key=qwerty123456"
)
SECRETS = (OPENAI_KEY, ANTHROPIC_KEY, BEARER_TOKEN, URL_PASSWORD, "svc-user", "qwerty123456")


@tool
def charge(amount: int) -> str:
    """Charge the card."""
    raise RuntimeError(ERROR_TEXT)


@tool
def refund(amount: int) -> str:
    """Refund the card."""
    raise ValueError(f"refund refused for {OPENAI_KEY}")


def _calls(*names: str) -> LLMResponse:
    return LLMResponse(
        tool_calls=[ToolCall(f"c{i}", name, {"amount": 5}) for i, name in enumerate(names, 1)]
    )


def _blob(value: Any) -> str:
    return orjson.dumps(value, default=repr).decode()


def _assert_no_secret(where: str, text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret!r} is in {where}"


@pytest.mark.parametrize("parallel", [False, True])
def test_a_tool_error_quoting_secrets_reaches_nothing_verbatim(parallel: bool) -> None:
    # Given a tool whose exception quotes two API keys, a bearer token and a URL with
    # credentials, and another whose exception quotes a key
    provider = ScriptedProvider([_calls("charge", "refund"), LLMResponse(content="Sorry.")])
    agent = Agent(provider=provider, model="m", tools=[charge, refund], parallel_tools=parallel)
    reports: list[ToolCallReport] = []
    progress: list[ProgressReport] = []

    # When the model calls them and the run goes on
    result = agent.run("Charge me.", on_tool_call=reports.append, on_report=progress.append)

    # Then the history, the next request to the model, the hooks and the result hold no secret
    assert result.content == "Sorry."
    second: LLMRequest = provider.requests[1]
    _assert_no_secret("the next request", _blob(second.messages))
    _assert_no_secret("the result's checkpoint", result.checkpoint.to_json().decode())
    _assert_no_secret("agent.checkpoint()", _blob(agent.checkpoint().to_dict()))  # type: ignore[union-attr]
    _assert_no_secret("the tool-call reports", _blob([r.content for r in reports]))
    _assert_no_secret("the progress", _blob([p.checkpoint.to_dict() for p in progress]))
    # and the model still learns what failed, and where
    charged, refunded = (m["content"] for m in second.messages if m["role"] == "tool")
    assert charged.startswith("charge failed: key [redacted-key] (fallback [redacted-key])")
    assert "Authorization: Bearer [redacted-key]" in charged
    assert "https://[redacted]@billing.internal.example/v2/charges?api_key=[redacted]" in charged
    assert refunded == "refund refused for [redacted-key]"
    finished = [r for r in reports if r.phase is ToolCallPhase.FINISHED]
    assert sorted(str(r.content) for r in finished) == sorted([charged, refunded])
    assert all(r.ok is False for r in finished)


class _GatewayProvider(ScriptedProvider):
    """A provider whose key has no recognisable shape, and which says how to redact it."""

    KEY = "gw-live-8f3a61d0c2b94e77"

    def redact(self, text: str) -> str:
        return text.replace(self.KEY, "[redacted]")


def test_the_key_of_the_agents_provider_is_redacted_when_the_provider_exposes_it() -> None:
    @tool
    def call_gateway() -> str:
        """Call the gateway."""
        raise RuntimeError(f"gateway refused key {_GatewayProvider.KEY}")

    provider = _GatewayProvider([_calls("call_gateway"), LLMResponse(content="ok")])
    agent = Agent(provider=provider, model="m", tools=[call_gateway])

    result = agent.run("Go.")

    assert _GatewayProvider.KEY not in result.checkpoint.to_json().decode()
    assert provider.requests[1].messages[-1]["content"] == "gateway refused key [redacted]"


def test_a_hosts_redaction_runs_before_the_runtimes_own_rules() -> None:
    # Given a host that knows a secret of its own (the job system: secret environment values)
    seen: list[str] = []

    def host_redact(text: str) -> str:
        seen.append(text)
        return text.replace("plain-host-secret", "[redacted-secret]")

    @tool
    def fetch() -> str:
        """Fetch."""
        raise RuntimeError(f"fetch failed for plain-host-secret with {OPENAI_KEY}")

    provider = ScriptedProvider([_calls("fetch"), LLMResponse(content="ok")])
    agent = Agent(provider=provider, model="m", tools=[fetch], redact_tool_errors=host_redact)

    agent.run("Go.")

    assert seen == [f"fetch failed for plain-host-secret with {OPENAI_KEY}"]
    assert provider.requests[1].messages[-1]["content"] == (
        "fetch failed for [redacted-secret] with [redacted-key]"
    )


def test_an_error_without_secrets_reaches_the_model_unchanged() -> None:
    @tool
    def lookup() -> str:
        """Look up."""
        raise RuntimeError("order A-17 not found at https://shop.example/orders/A-17 (HTTP 404)")

    provider = ScriptedProvider([_calls("lookup"), LLMResponse(content="ok")])
    Agent(provider=provider, model="m", tools=[lookup]).run("Go.")

    assert provider.requests[1].messages[-1]["content"] == (
        "order A-17 not found at https://shop.example/orders/A-17 (HTTP 404)"
    )


def test_redact_tool_errors_must_be_callable() -> None:
    with pytest.raises(TypeError, match="redact_tool_errors"):
        Agent(provider=ScriptedProvider([]), model="m", redact_tool_errors="no")  # type: ignore[arg-type]


def test_an_error_text_that_cannot_be_redacted_is_withheld() -> None:
    def broken(text: str) -> str:
        raise RuntimeError("the host's rules failed")

    provider = ScriptedProvider([_calls("charge"), LLMResponse(content="ok")])
    agent = Agent(provider=provider, model="m", tools=[charge], redact_tool_errors=broken)

    result = agent.run("Go.")

    assert result.content == "ok"
    assert provider.requests[1].messages[-1]["content"] == (
        "RuntimeError (its message is withheld: it could not be redacted)"
    )


def test_the_real_providers_redact_their_own_key_and_endpoint() -> None:
    from agent import AnthropicProvider, OpenAIChatProvider

    key, url = "plainkey-without-shape-123", "https://gateway.corp.example/llm"
    for provider in (
        OpenAIChatProvider("m", api_key=key, base_url=url),
        AnthropicProvider("m", api_key=key, base_url=url),
    ):
        text = provider.redact(f"tool saw {key} while calling {url}/v1/x")
        assert key not in text and "gateway.corp.example" not in text
