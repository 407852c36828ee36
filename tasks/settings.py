"""Settings: environment variables first, then celeryconfig.py, then the defaults below."""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


class SettingsError(ValueError):
    code = "ERR_SETTINGS"


@dataclass(frozen=True)
class Settings:
    redis_url: str = DEFAULT_REDIS_URL
    broker_url: str = DEFAULT_REDIS_URL
    result_backend: str = DEFAULT_REDIS_URL
    key_prefix: str = "agentjobs"
    max_attempts: int = 5
    backoff_base_s: float = 2.0
    backoff_max_s: float = 300.0
    max_deliveries: int = 3
    lease_ttl_s: float = 30.0
    pump_interval_s: float = 0.5
    # A queued turn at the head of its conversation that no worker started for this long is
    # woken again (its message was lost with a dead worker or a failed publish).
    stall_after_s: float = 60.0
    # How long after a turn ends the pump checks that its Celery result was stored.
    result_grace_s: float = 5.0
    record_ttl_s: int = 7 * 24 * 3600
    index_shards: int = 16
    turn_queue: str = "agentjobs.turns"
    retry_queue: str = "agentjobs.retry"
    agents: Mapping[str, str] = field(default_factory=dict)


_NUMBERS: dict[str, tuple[str, type]] = {
    "AGENTJOBS_MAX_ATTEMPTS": ("max_attempts", int),
    "AGENTJOBS_BACKOFF_BASE_S": ("backoff_base_s", float),
    "AGENTJOBS_BACKOFF_MAX_S": ("backoff_max_s", float),
    "AGENTJOBS_MAX_DELIVERIES": ("max_deliveries", int),
    "AGENTJOBS_LEASE_TTL_S": ("lease_ttl_s", float),
    "AGENTJOBS_PUMP_INTERVAL_S": ("pump_interval_s", float),
    "AGENTJOBS_STALL_AFTER_S": ("stall_after_s", float),
    "AGENTJOBS_RECORD_TTL_S": ("record_ttl_s", int),
    "AGENTJOBS_RESULT_GRACE_S": ("result_grace_s", float),
    "AGENTJOBS_INDEX_SHARDS": ("index_shards", int),
}


def parse_agents(text: str, variable: str = "AGENTJOBS_AGENTS") -> dict[str, str]:
    """ "name=module:factory,name2=module:factory" -> {name: "module:factory"}."""
    agents: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, target = item.partition("=")
        if not sep or not name.strip() or ":" not in target:
            raise SettingsError(f"{variable}: {item!r} is not name=module:factory")
        agents[name.strip()] = target.strip()
    return agents


def _config_module() -> Any:
    name = os.environ.get("CELERY_CONFIG_MODULE", "celeryconfig")
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        return None


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    config = _config_module()
    values: dict[str, Any] = {}
    redis_url = env.get("REDIS_URL") or getattr(config, "REDIS_URL", None) or DEFAULT_REDIS_URL
    values["redis_url"] = redis_url
    values["broker_url"] = env.get("CELERY_BROKER_URL") or redis_url
    values["result_backend"] = env.get("CELERY_RESULT_BACKEND") or redis_url
    values["key_prefix"] = env.get("AGENTJOBS_KEY_PREFIX") or getattr(
        config, "AGENTJOBS_KEY_PREFIX", "agentjobs"
    )
    for variable, (attr, kind) in _NUMBERS.items():
        raw = env.get(variable)
        if raw is None:
            raw = getattr(config, variable, None)
        if raw is None:
            continue
        try:
            number = kind(raw)
        except (TypeError, ValueError):
            raise SettingsError(f"{variable}={raw!r} is not a {kind.__name__}") from None
        if number <= 0:
            raise SettingsError(f"{variable} must be greater than 0, got {raw!r}")
        values[attr] = number
    agents = dict(getattr(config, "AGENTS", {}) or {})
    agents.update(parse_agents(env.get("AGENTJOBS_AGENTS", "")))
    values["agents"] = agents
    values["turn_queue"] = env.get("AGENTJOBS_TURN_QUEUE") or Settings.turn_queue
    values["retry_queue"] = env.get("AGENTJOBS_RETRY_QUEUE") or Settings.retry_queue
    settings = Settings(**values)
    if settings.backoff_max_s < settings.backoff_base_s:
        raise SettingsError("AGENTJOBS_BACKOFF_MAX_S must be at least AGENTJOBS_BACKOFF_BASE_S")
    return settings
