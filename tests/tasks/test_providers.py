"""provider_from_settings (tasks/providers.py): the provider a deployment chose, built from its
Settings alone, against a real HTTP server; AGENTJOBS_PROVIDER_TIMEOUT_S reaches the provider,
also in a worker; AGENTJOBS_PROVIDER=echo needs no key, no model name and no server."""

from __future__ import annotations

import time
from typing import Any

import pytest

from agent import (
    AnthropicProvider,
    EchoProvider,
    LLMRequest,
    OpenAIChatProvider,
    ProviderTimeoutError,
)
from tasks import TurnDeadLettered, run_turn
from tasks.core.settings import SettingsError, load_settings
from tasks.providers import provider_from_settings
from tasks.queue.context import job_context
from tests.tasks.model_server import model_server

OPENAI_KEY = "sk-test-0penai-SECRET-key-4f9a2c"
ANTHROPIC_KEY = "sk-ant-test-SECRET-key-77b1e0"


def request() -> LLMRequest:
    return LLMRequest("", [{"role": "user", "content": "x"}], [], "m")


@pytest.fixture(autouse=True)
def process_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    # The provider gets what the Settings hold, never the process environment behind them.
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
        monkeypatch.setenv(name, "http://process-env.invalid" if "URL" in name else "sk-process")


@pytest.mark.parametrize(
    "environ", [{}, {"AGENTJOBS_PROVIDER": "scripted"}, {"AGENTJOBS_PROVIDER": " "}]
)
def test_scripted_is_the_default_and_means_none(environ: dict[str, str]) -> None:
    assert provider_from_settings(load_settings(environ)) is None


@pytest.mark.parametrize("value", ["echo", "Echo", " echo "])
def test_echo_needs_no_key_and_no_model(value: str) -> None:
    # Given AGENTJOBS_PROVIDER=echo and neither AGENTJOBS_MODEL nor a key in the Settings
    settings = load_settings({"AGENTJOBS_PROVIDER": value})
    # When the provider is built, Then it is an EchoProvider, which answers without a network
    provider = provider_from_settings(settings)
    assert isinstance(provider, EchoProvider)
    response = provider.complete(request())
    assert response.content == "echo: x"
    assert response.usage == {"inputTokens": 1, "outputTokens": 2}


def test_openai_from_settings_calls_the_configured_server() -> None:
    with model_server() as server:
        settings = load_settings(
            {
                "AGENTJOBS_PROVIDER": "OpenAI",
                "AGENTJOBS_MODEL": "gpt-test",
                "OPENAI_BASE_URL": f"{server.origin}/v1",
                "OPENAI_API_KEY": OPENAI_KEY,
                "AGENTJOBS_PROVIDER_TIMEOUT_S": "2.5",
            }
        )
        provider = provider_from_settings(settings)
        assert isinstance(provider, OpenAIChatProvider)
        assert (provider.model, provider.timeout_s) == ("gpt-test", 2.5)
        assert provider.complete(request()).content == "ok"
    (received,) = server.received
    assert received.path == "/v1/chat/completions"
    assert received.headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert received.body["model"] == "gpt-test"


def test_anthropic_from_settings_calls_the_configured_server() -> None:
    with model_server() as server:
        settings = load_settings(
            {
                "AGENTJOBS_PROVIDER": "anthropic",
                "AGENTJOBS_MODEL": "claude-test",
                "ANTHROPIC_BASE_URL": server.origin,
                "ANTHROPIC_API_KEY": ANTHROPIC_KEY,
            }
        )
        provider = provider_from_settings(settings)
        assert isinstance(provider, AnthropicProvider)
        assert provider.timeout_s == 60.0
        assert provider.complete(request()).content == "ok"
    assert server.received[0].headers["x-api-key"] == ANTHROPIC_KEY


def test_the_provider_timeout_setting_bounds_a_model_call() -> None:
    # Given a model that takes 2 s and AGENTJOBS_PROVIDER_TIMEOUT_S=0.3
    with model_server(delay_s=2.0) as server:
        provider = provider_from_settings(
            load_settings(
                {
                    "AGENTJOBS_PROVIDER": "openai",
                    "AGENTJOBS_MODEL": "m",
                    "OPENAI_BASE_URL": server.origin,
                    "AGENTJOBS_PROVIDER_TIMEOUT_S": "0.3",
                }
            )
        )
        assert provider is not None
        started = time.monotonic()
        # When the provider calls it, Then the call times out after 0.3 s, not 2 s
        with pytest.raises(ProviderTimeoutError):
            provider.complete(request())
        assert time.monotonic() - started < 1.5


def test_defaults_point_at_the_public_apis() -> None:
    openai = provider_from_settings(
        load_settings(
            {"AGENTJOBS_PROVIDER": "openai", "AGENTJOBS_MODEL": "m", "OPENAI_API_KEY": "sk-x"}
        )
    )
    anthropic = provider_from_settings(
        load_settings(
            {"AGENTJOBS_PROVIDER": "anthropic", "AGENTJOBS_MODEL": "m", "ANTHROPIC_API_KEY": "k"}
        )
    )
    assert isinstance(openai, OpenAIChatProvider) and openai.base_url == "https://api.openai.com/v1"
    assert isinstance(anthropic, AnthropicProvider)
    assert anthropic.base_url == "https://api.anthropic.com"


def test_an_openai_compatible_server_needs_no_key() -> None:
    with model_server() as server:
        provider = provider_from_settings(
            load_settings(
                {
                    "AGENTJOBS_PROVIDER": "openai",
                    "AGENTJOBS_MODEL": "llama3",
                    "OPENAI_BASE_URL": f"{server.origin}/v1",
                }
            )
        )
        assert isinstance(provider, OpenAIChatProvider)
        provider.complete(request())
    assert "authorization" not in server.received[0].headers, "the process's key was sent"


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"AGENTJOBS_PROVIDER": "openai", "AGENTJOBS_MODEL": "m"}, "OPENAI_API_KEY"),
        ({"AGENTJOBS_PROVIDER": "anthropic", "AGENTJOBS_MODEL": "m"}, "ANTHROPIC_API_KEY"),
    ],
)
def test_a_missing_key_is_refused_by_name(environ: dict[str, str], variable: str) -> None:
    with pytest.raises(SettingsError, match=f"^{variable} must be set"):
        provider_from_settings(load_settings(environ))


@pytest.mark.integration
def test_a_workers_agents_get_the_provider_timeout(make_jobs: Any) -> None:
    # Given a worker whose demo agent is configured for a model server that takes 3 s, with
    # AGENTJOBS_PROVIDER_TIMEOUT_S=0.5 and a single attempt
    with model_server(delay_s=3.0) as server:
        jobs = make_jobs(
            AGENTJOBS_PROVIDER="openai",
            AGENTJOBS_MODEL="m",
            OPENAI_BASE_URL=f"{server.origin}/v1",
            AGENTJOBS_PROVIDER_TIMEOUT_S="0.5",
            AGENTJOBS_MAX_ATTEMPTS="1",
        )
        jobs.worker()
        started = time.monotonic()
        # When a turn runs, Then its model call times out at 0.5 s and the turn is dead-lettered
        with pytest.raises(TurnDeadLettered) as caught:
            run_turn.delay(agent="demo", conversation_id="t", message="hi").get(timeout=30)
        assert time.monotonic() - started < 2.5
    assert caught.value.reason == "max_attempts"
    entry = job_context().dead_letters.get(caught.value.entry_id)
    assert entry is not None and entry["errorType"] == "ProviderTimeoutError"
    assert len(server.received) == 1


@pytest.mark.integration
def test_a_worker_with_agentjobs_provider_echo_answers_by_echo(make_jobs: Any) -> None:
    # Given a worker whose demo agent builds its provider from settings, with
    # AGENTJOBS_PROVIDER=echo and no model name or key
    jobs = make_jobs(AGENTJOBS_PROVIDER="echo")
    jobs.worker()
    # When a turn runs, Then the demo agent answers with the echo of its message, in one call
    reply = run_turn.delay(agent="demo", conversation_id="e", message="Book a table.").get(
        timeout=30
    )
    assert reply["content"] == "echo: Book a table."
    assert reply["attempts"] == 1
