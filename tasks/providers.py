"""Which model provider a worker's agents use, from its Settings (AGENTJOBS_PROVIDER and
friends, README.md "Model provider").

Built where agents are built (an agent factory, once per worker process), so a deployment
switches from a scripted provider to a real model without code changes. Everything the provider
gets comes from the Settings, never from the environment behind them.
"""

from __future__ import annotations

from agent import AnthropicProvider, EchoProvider, LLMProvider, OpenAIChatProvider
from agent.providers import anthropic, openai
from tasks.core.settings import Settings, SettingsError


def provider_from_settings(settings: Settings) -> LLMProvider | None:
    """The configured provider, or None for `scripted` (the factory's own scripted default).
    `echo` is EchoProvider, which needs no key and no model name.

    A missing key raises SettingsError naming the variable; no error quotes a key.
    """
    if settings.provider == "scripted":
        return None
    if settings.provider == "echo":
        return EchoProvider()
    if settings.provider == "openai":
        base_url = settings.openai_base_url or openai.DEFAULT_BASE_URL
        if not settings.openai_api_key and base_url == openai.DEFAULT_BASE_URL:
            raise SettingsError("OPENAI_API_KEY must be set when AGENTJOBS_PROVIDER=openai")
        return OpenAIChatProvider(
            settings.model,
            base_url=base_url,
            api_key=settings.openai_api_key,
            timeout_s=settings.provider_timeout_s,
        )
    if not settings.anthropic_api_key:
        raise SettingsError("ANTHROPIC_API_KEY must be set when AGENTJOBS_PROVIDER=anthropic")
    return AnthropicProvider(
        settings.model,
        api_key=settings.anthropic_api_key,
        base_url=settings.anthropic_base_url or anthropic.DEFAULT_BASE_URL,
        timeout_s=settings.provider_timeout_s,
    )
