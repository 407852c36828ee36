"""Which model provider a process uses, from its environment.

Read once where agents are built (a worker's agent factory), so one deployment switches from the
scripted demo provider to a real model without code changes. Every value is read from `environ`
only, never from the process environment behind it, so a caller's mapping is the whole truth.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from agent.messages import LLMProvider
from agent.providers import anthropic, openai
from agent.providers._http import check_api_key, check_base_url

PROVIDER_VAR = "AGENTJOBS_PROVIDER"
MODEL_VAR = "AGENTJOBS_MODEL"
TIMEOUT_VAR = "AGENTJOBS_PROVIDER_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 60.0
PROVIDERS = ("scripted", "openai", "anthropic")


def provider_from_env(environ: Mapping[str, str] = os.environ) -> LLMProvider | None:
    """The configured provider, or None for `scripted` (use the embedded scripted default).

    A missing or malformed value raises ValueError naming the variable (never quoting a key).
    """
    choice = environ.get(PROVIDER_VAR, "").strip().lower() or "scripted"
    if choice not in PROVIDERS:
        raise ValueError(f"{PROVIDER_VAR} must be one of {', '.join(PROVIDERS)}; got {choice!r}")
    if choice == "scripted":
        return None
    model = environ.get(MODEL_VAR, "").strip()
    if not model:
        raise ValueError(f"{MODEL_VAR} must name the model when {PROVIDER_VAR}={choice}")
    timeout_s = _timeout_s(environ)
    if choice == "openai":
        base_url = _url(environ, "OPENAI_BASE_URL", openai.DEFAULT_BASE_URL)
        api_key = _key(environ, "OPENAI_API_KEY")
        if not api_key and base_url == openai.DEFAULT_BASE_URL:
            raise ValueError(f"OPENAI_API_KEY must be set when {PROVIDER_VAR}=openai")
        return openai.OpenAIChatProvider(
            model, base_url=base_url, api_key=api_key, timeout_s=timeout_s
        )
    api_key = _key(environ, "ANTHROPIC_API_KEY")
    if not api_key:
        raise ValueError(f"ANTHROPIC_API_KEY must be set when {PROVIDER_VAR}=anthropic")
    return anthropic.AnthropicProvider(
        model,
        api_key=api_key,
        base_url=_url(environ, "ANTHROPIC_BASE_URL", anthropic.DEFAULT_BASE_URL),
        timeout_s=timeout_s,
    )


def _optional(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name, "").strip()
    return value or None


def _url(environ: Mapping[str, str], name: str, default: str) -> str:
    return check_base_url(_optional(environ, name) or default, name)


def _key(environ: Mapping[str, str], name: str) -> str:
    """The key, or '' when unset: '' tells the provider not to look further."""
    value = _optional(environ, name)
    return check_api_key(value, name) if value else ""


def _timeout_s(environ: Mapping[str, str]) -> float:
    raw = _optional(environ, TIMEOUT_VAR)
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{TIMEOUT_VAR} must be a positive number of seconds; got {raw!r}")
    return value
