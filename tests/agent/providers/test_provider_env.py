"""provider_from_env: the provider a deployment chose, from the environment mapping given."""

from __future__ import annotations

import pytest
from provider_servers import ANTHROPIC_KEY, OPENAI_KEY, ScriptedServer

from agent.messages import LLMRequest
from agent.providers.anthropic import AnthropicProvider
from agent.providers.env import provider_from_env
from agent.providers.openai import OpenAIChatProvider


@pytest.fixture(autouse=True)
def no_process_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    # provider_from_env must read only the mapping it is given, never the process environment.
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
        monkeypatch.setenv(name, "http://process-env.invalid" if "URL" in name else "sk-process")


@pytest.mark.parametrize(
    "environ", [{}, {"AGENTJOBS_PROVIDER": "scripted"}, {"AGENTJOBS_PROVIDER": " "}]
)
def test_scripted_is_the_default_and_means_none(environ: dict[str, str]) -> None:
    assert provider_from_env(environ) is None


def test_openai_from_env_calls_the_configured_server(server: ScriptedServer) -> None:
    environ = {
        "AGENTJOBS_PROVIDER": "OpenAI",
        "AGENTJOBS_MODEL": "gpt-test",
        "OPENAI_BASE_URL": f"{server.origin}/v1",
        "OPENAI_API_KEY": OPENAI_KEY,
        "AGENTJOBS_PROVIDER_TIMEOUT_S": "2.5",
    }
    server.reply(200, {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]})

    provider = provider_from_env(environ)

    assert isinstance(provider, OpenAIChatProvider)
    assert (provider.model, provider.timeout_s) == ("gpt-test", 2.5)
    assert (
        provider.complete(LLMRequest("", [{"role": "user", "content": "x"}], [], "m")).content
        == "ok"
    )
    assert server.received[0].headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert server.received[0].json()["model"] == "gpt-test"


def test_anthropic_from_env_calls_the_configured_server(server: ScriptedServer) -> None:
    environ = {
        "AGENTJOBS_PROVIDER": "anthropic",
        "AGENTJOBS_MODEL": "claude-test",
        "ANTHROPIC_BASE_URL": server.origin,
        "ANTHROPIC_API_KEY": ANTHROPIC_KEY,
    }
    server.reply(200, {"content": [{"type": "text", "text": "ok"}]})

    provider = provider_from_env(environ)

    assert isinstance(provider, AnthropicProvider)
    assert provider.timeout_s == 60.0
    assert (
        provider.complete(LLMRequest("", [{"role": "user", "content": "x"}], [], "m")).content
        == "ok"
    )
    assert server.received[0].headers["x-api-key"] == ANTHROPIC_KEY


def test_defaults_point_at_the_public_apis() -> None:
    openai = provider_from_env(
        {"AGENTJOBS_PROVIDER": "openai", "AGENTJOBS_MODEL": "m", "OPENAI_API_KEY": "sk-x"}
    )
    anthropic = provider_from_env(
        {"AGENTJOBS_PROVIDER": "anthropic", "AGENTJOBS_MODEL": "m", "ANTHROPIC_API_KEY": "k"}
    )

    assert isinstance(openai, OpenAIChatProvider) and openai.base_url == "https://api.openai.com/v1"
    assert isinstance(anthropic, AnthropicProvider)
    assert anthropic.base_url == "https://api.anthropic.com"


def test_openai_compatible_server_without_a_key() -> None:
    provider = provider_from_env(
        {
            "AGENTJOBS_PROVIDER": "openai",
            "AGENTJOBS_MODEL": "llama3",
            "OPENAI_BASE_URL": "http://127.0.0.1:11434/v1",
        }
    )

    assert isinstance(provider, OpenAIChatProvider)


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"AGENTJOBS_PROVIDER": "gemini"}, "AGENTJOBS_PROVIDER"),
        ({"AGENTJOBS_PROVIDER": "openai", "OPENAI_API_KEY": "k"}, "AGENTJOBS_MODEL"),
        ({"AGENTJOBS_PROVIDER": "openai", "AGENTJOBS_MODEL": "m"}, "OPENAI_API_KEY"),
        ({"AGENTJOBS_PROVIDER": "anthropic", "AGENTJOBS_MODEL": "m"}, "ANTHROPIC_API_KEY"),
        (
            {
                "AGENTJOBS_PROVIDER": "openai",
                "AGENTJOBS_MODEL": "m",
                "OPENAI_BASE_URL": "api.example",
            },
            "OPENAI_BASE_URL",
        ),
        (
            {
                "AGENTJOBS_PROVIDER": "anthropic",
                "AGENTJOBS_MODEL": "m",
                "ANTHROPIC_API_KEY": "k",
                "ANTHROPIC_BASE_URL": "ftp://x",
            },
            "ANTHROPIC_BASE_URL",
        ),
        (
            {"AGENTJOBS_PROVIDER": "anthropic", "AGENTJOBS_MODEL": "m", "ANTHROPIC_API_KEY": "a b"},
            "ANTHROPIC_API_KEY",
        ),
        (
            {
                "AGENTJOBS_PROVIDER": "openai",
                "AGENTJOBS_MODEL": "m",
                "OPENAI_API_KEY": "k",
                "AGENTJOBS_PROVIDER_TIMEOUT_S": "soon",
            },
            "AGENTJOBS_PROVIDER_TIMEOUT_S",
        ),
        (
            {
                "AGENTJOBS_PROVIDER": "openai",
                "AGENTJOBS_MODEL": "m",
                "OPENAI_API_KEY": "k",
                "AGENTJOBS_PROVIDER_TIMEOUT_S": "0",
            },
            "AGENTJOBS_PROVIDER_TIMEOUT_S",
        ),
    ],
)
def test_bad_values_name_the_variable(environ: dict[str, str], variable: str) -> None:
    with pytest.raises(ValueError, match=variable):
        provider_from_env(environ)


def test_a_bad_key_is_not_quoted_in_the_error() -> None:
    environ = {
        "AGENTJOBS_PROVIDER": "anthropic",
        "AGENTJOBS_MODEL": "m",
        "ANTHROPIC_API_KEY": "sk-ant-secret part",
    }

    with pytest.raises(ValueError) as info:
        provider_from_env(environ)

    assert "secret" not in str(info.value)
