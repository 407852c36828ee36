"""Settings: the one reader of the job system's configuration.

Every process (workers, the pump, clients, the CLI) builds one `Settings` from its environment;
celeryconfig.py takes Celery's values from it, and a worker's agent factories take the model
provider from it (tasks/providers.py). Each value is checked here, and a bad one is refused with
an error that names its environment variable. The variables, their defaults and meanings are
listed in README.md ("Settings"). celeryconfig.py's `AGENTS` dict is input, not a source of
settings: it is passed in as `registry`, and AGENTJOBS_AGENTS adds to it and wins.

API keys are held with repr=False, and no error quotes a key or a URL (URLs may embed
credentials).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from tasks.core.limits import (
    Budgets,
    LimitError,
    PerTenant,
    TokenCap,
    parse_budgets,
    parse_max_running,
    parse_token_caps,
    parse_weights,
)
from tasks.core.state_url import CLUSTER_SCHEME, SENTINEL_SCHEME, StateURLError, parse_state_url

_T = TypeVar("_T")

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
PROVIDERS = ("scripted", "openai", "anthropic", "echo")
# What a turn does once its tenant's token cap is reached (AGENTJOBS_TENANT_OVER_LIMIT).
OVER_LIMIT = ("wait", "dead_letter")
# The providers that call a model by name (AGENTJOBS_MODEL): echo and scripted need none.
NAMED_MODEL_PROVIDERS = ("openai", "anthropic")
# Redis Cluster has 16384 hash slots: more index shards than that cannot spread further.
MAX_INDEX_SHARDS = 16384
# The longest duration any setting may name (ten years): every time the scripts store is an
# integer of ms, far inside a double's exact range.
MAX_SECONDS = 10 * 365 * 24 * 3600
# Streamed text held longer than a minute would not be streaming any more.
MAX_TOKEN_FLUSH_MS = 60_000

_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_QUEUE = re.compile(r"[^\s,]+")
# Environment variables whose values redact() removes from stored and logged text.
_SECRET_NAME = re.compile(r"(?:API_KEY|_TOKEN|_SECRET|PASSWORD)$")
_MIN_SECRET_LEN = 8
# The ssl_cert_reqs values Celery's Redis result backend and kombu's Redis transport both read.
_CERT_REQS = ("required", "optional", "none", "CERT_REQUIRED", "CERT_OPTIONAL", "CERT_NONE")


class SettingsError(ValueError):
    """A setting with a value the job system cannot use; the message names the variable."""

    code = "ERR_SETTINGS"


@dataclass(frozen=True)
class Settings:
    redis_url: str = DEFAULT_REDIS_URL
    # Where turn records, conversations, dead letters and events live (tasks/store/client.py): one
    # Redis, a Redis Cluster or a Sentinel group's master.
    state_url: str = DEFAULT_REDIS_URL
    broker_url: str = DEFAULT_REDIS_URL
    result_backend: str = DEFAULT_REDIS_URL
    key_prefix: str = "agentjobs"
    max_attempts: int = 5
    backoff_base_s: float = 2.0
    backoff_max_s: float = 300.0
    max_deliveries: int = 3
    # A dead worker's turn resumes once its lease runs out; the running worker renews it well
    # before that, so a short lease is cheap and recovery is fast.
    lease_ttl_s: float = 9.0
    pump_interval_s: float = 0.5
    # A queued turn at the head of its conversation that no worker started for this long is
    # woken again (its message was lost with a dead worker or a failed publish).
    stall_after_s: float = 10.0
    # A turn must end within this many seconds of its submission (run_turn's deadline_s
    # overrides it), retries included; past it the pump dead-letters it as deadline_exceeded.
    turn_deadline_s: float = 3600.0
    # The longest deadline a turn may ask for (run_turn's deadline_s): every stored time stays
    # an integer of ms, and a typo cannot park a conversation for a century.
    max_deadline_s: float = 7 * 24 * 3600.0
    # A turn paused for a person's decision waits this long at most, then it is dead-lettered
    # as pause_expired. Time paused does not count toward its deadline.
    pause_ttl_s: float = 7 * 24 * 3600.0
    # How long after a turn ends the pump checks that its Celery result was stored.
    result_grace_s: float = 5.0
    # A worker told to stop (SIGTERM, a deploy) hands its turns over at their next check point
    # and exits within this; a turn still stuck in a tool then is handed over as last persisted.
    shutdown_grace_s: float = 30.0
    # Finished turn records, dead-letter replay markers and Celery results live this long.
    record_ttl_s: int = 7 * 24 * 3600
    # The global Redis indices (due retries, running turns, ...) are split into this many
    # shards, each conversation in one, so that a Redis Cluster spreads them.
    index_shards: int = 16
    turn_queue: str = "agentjobs.turns"
    retry_queue: str = "agentjobs.retry"
    worker_concurrency: int = 32
    agents: Mapping[str, str] = field(default_factory=dict)
    # A worker refuses to start when the factory of a registered agent cannot build it, instead
    # of starting and dead-lettering that agent's turns as agent_unavailable.
    strict_agents: bool = False
    # The model provider of agents built from settings (tasks/providers.py).
    provider: str = "scripted"
    model: str = ""
    provider_timeout_s: float = 60.0
    openai_api_key: str = field(default="", repr=False)
    openai_base_url: str | None = None
    anthropic_api_key: str = field(default="", repr=False)
    anthropic_base_url: str | None = None
    # Message content (the turn's message and answer, tool arguments and results, redacted) on
    # the OpenTelemetry spans of turns (telemetry/tracing.py): off, since content may be private.
    otel_capture_content: bool = False
    # Celery's own per-task INFO lines in a worker's log ("Task ... received", "... succeeded
    # in ..."): off, since a turn's events and status say as much, and the two lines cost a
    # short turn several percent of its throughput. Warnings and errors are logged either way.
    celery_task_logs: bool = False
    # kombu's unacked record (Redis broker) for every turn wake-up a worker takes: off, since a
    # turn stays in a time index until a claim takes it and the pump wakes it from there; each
    # record and its removal cost a delivery two round trips (tasks/queue/broker.py).
    unacked_wakeups: bool = False
    # A turn's streamed text reaches its event stream at most once per this many ms (plus once
    # when each model call ends): the writes per turn follow the time a reply takes, not the
    # number of pieces the provider sends it in (tasks/turn/tokens.py).
    token_flush_ms: int = 50
    # The token.delta events of a turn are removed this long after it ended; its other events
    # stay as long as its record.
    token_ttl_s: int = 3600
    # `agentjobs web`: when set, every request needs it (Authorization: Bearer); without it
    # the server binds to loopback only.
    web_token: str = field(default="", repr=False)
    # Budgets and fairness (docs/platform.md, "Budgets and fairness"; tasks/core/limits.py).
    budgets: Budgets = field(default_factory=Budgets)
    # The output cap a budget reserves for a provider without a `max_tokens` attribute.
    budget_output_tokens: int = 1024
    tenant_weights: PerTenant[int] = field(default_factory=PerTenant)
    tenant_max_running: PerTenant[int] = field(default_factory=PerTenant)
    tenant_token_limit: PerTenant[TokenCap] = field(default_factory=PerTenant)
    tenant_over_limit: str = "wait"
    # A tenant label on agentjobs_tokens_total: one series per tenant, so off by default.
    metrics_tenant_labels: bool = False

    # Submitted turns start in weighted round-robin across tenants (tasks/turn/fairness.py):
    # on when tenant weights or running caps are set (AGENTJOBS_TENANT_FAIRNESS says so
    # either way). Off: in submission order, as the broker delivers them; the gate costs a
    # short turn about 8% of its throughput (README, "Budgets and fairness, measured"). A
    # Redis Cluster runs without it.
    tenant_fairness: bool = False


def load_settings(
    environ: Mapping[str, str] | None = None, *, registry: Mapping[str, str] | None = None
) -> Settings:
    """Settings from `environ` (default: the process environment) and nothing else.

    `registry` is celeryconfig.py's AGENTS ({name: "module:factory"}); AGENTJOBS_AGENTS adds to
    it and overrides it. Raises SettingsError naming the first variable with a bad value.
    """
    env = _Environment(os.environ if environ is None else environ)
    redis_url = env.url("REDIS_URL", DEFAULT_REDIS_URL, schemes=("redis", "rediss", "unix"))
    celery_tls_url(redis_url, "REDIS_URL")  # refused by its own name when the broker inherits it
    key_prefix = env.matching("AGENTJOBS_KEY_PREFIX", Settings.key_prefix, _PREFIX, "a key prefix")
    agents = dict(registry or {})
    agents.update(parse_agents(env.text("AGENTJOBS_AGENTS", "")))
    settings = Settings(
        redis_url=redis_url,
        state_url=env.state_url("AGENTJOBS_STATE_URL", redis_url),
        broker_url=env.celery_url("CELERY_BROKER_URL", redis_url),
        result_backend=env.celery_url("CELERY_RESULT_BACKEND", redis_url),
        key_prefix=key_prefix,
        max_attempts=env.count("AGENTJOBS_MAX_ATTEMPTS", Settings.max_attempts),
        backoff_base_s=env.seconds("AGENTJOBS_BACKOFF_BASE_S", Settings.backoff_base_s),
        backoff_max_s=env.seconds("AGENTJOBS_BACKOFF_MAX_S", Settings.backoff_max_s),
        max_deliveries=env.count("AGENTJOBS_MAX_DELIVERIES", Settings.max_deliveries),
        lease_ttl_s=env.seconds("AGENTJOBS_LEASE_TTL_S", Settings.lease_ttl_s),
        pump_interval_s=env.seconds("AGENTJOBS_PUMP_INTERVAL_S", Settings.pump_interval_s),
        stall_after_s=env.seconds("AGENTJOBS_STALL_AFTER_S", Settings.stall_after_s),
        turn_deadline_s=env.seconds("AGENTJOBS_TURN_DEADLINE_S", Settings.turn_deadline_s),
        max_deadline_s=env.seconds("AGENTJOBS_MAX_DEADLINE_S", Settings.max_deadline_s),
        pause_ttl_s=env.seconds("AGENTJOBS_PAUSE_TTL_S", Settings.pause_ttl_s),
        result_grace_s=env.seconds("AGENTJOBS_RESULT_GRACE_S", Settings.result_grace_s),
        shutdown_grace_s=env.seconds("AGENTJOBS_SHUTDOWN_GRACE_S", Settings.shutdown_grace_s),
        record_ttl_s=env.whole_seconds("AGENTJOBS_RECORD_TTL_S", Settings.record_ttl_s),
        index_shards=env.count(
            "AGENTJOBS_INDEX_SHARDS", Settings.index_shards, maximum=MAX_INDEX_SHARDS
        ),
        turn_queue=env.matching(
            "AGENTJOBS_TURN_QUEUE", f"{key_prefix}.turns", _QUEUE, "a queue name"
        ),
        retry_queue=env.matching(
            "AGENTJOBS_RETRY_QUEUE", f"{key_prefix}.retry", _QUEUE, "a queue name"
        ),
        worker_concurrency=env.count("AGENTJOBS_WORKER_CONCURRENCY", Settings.worker_concurrency),
        agents=MappingProxyType(agents),
        strict_agents=env.flag("AGENTJOBS_STRICT_AGENTS", False),
        provider=env.choice("AGENTJOBS_PROVIDER", Settings.provider, PROVIDERS),
        model=env.text("AGENTJOBS_MODEL", ""),
        provider_timeout_s=env.seconds("AGENTJOBS_PROVIDER_TIMEOUT_S", Settings.provider_timeout_s),
        openai_api_key=env.api_key("OPENAI_API_KEY"),
        openai_base_url=env.http_url("OPENAI_BASE_URL"),
        anthropic_api_key=env.api_key("ANTHROPIC_API_KEY"),
        anthropic_base_url=env.http_url("ANTHROPIC_BASE_URL"),
        otel_capture_content=env.flag("AGENTJOBS_OTEL_CAPTURE_CONTENT", False),
        celery_task_logs=env.flag("AGENTJOBS_CELERY_TASK_LOGS", False),
        unacked_wakeups=env.flag("AGENTJOBS_UNACKED_WAKEUPS", False),
        token_flush_ms=env.count(
            "AGENTJOBS_TOKEN_FLUSH_MS", Settings.token_flush_ms, maximum=MAX_TOKEN_FLUSH_MS
        ),
        token_ttl_s=env.whole_seconds("AGENTJOBS_TOKEN_TTL_S", Settings.token_ttl_s),
        web_token=env.api_key("AGENTJOBS_WEB_TOKEN"),
        budgets=env.parsed("AGENTJOBS_BUDGETS", parse_budgets, Budgets()),
        budget_output_tokens=env.count(
            "AGENTJOBS_BUDGET_OUTPUT_TOKENS", Settings.budget_output_tokens
        ),
        tenant_weights=env.parsed("AGENTJOBS_TENANT_WEIGHTS", parse_weights, PerTenant()),
        tenant_max_running=env.parsed(
            "AGENTJOBS_TENANT_MAX_RUNNING", parse_max_running, PerTenant()
        ),
        tenant_token_limit=env.parsed(
            "AGENTJOBS_TENANT_TOKEN_LIMIT", parse_token_caps, PerTenant()
        ),
        tenant_over_limit=env.choice(
            "AGENTJOBS_TENANT_OVER_LIMIT", Settings.tenant_over_limit, OVER_LIMIT
        ),
        metrics_tenant_labels=env.flag("AGENTJOBS_METRICS_TENANT_LABELS", False),
        tenant_fairness=env.flag(
            "AGENTJOBS_TENANT_FAIRNESS",
            bool(env.raw("AGENTJOBS_TENANT_WEIGHTS") or env.raw("AGENTJOBS_TENANT_MAX_RUNNING")),
        ),
    )
    if settings.backoff_max_s < settings.backoff_base_s:
        raise SettingsError(
            "AGENTJOBS_BACKOFF_MAX_S must be at least AGENTJOBS_BACKOFF_BASE_S, "
            f"got {settings.backoff_max_s:g} < {settings.backoff_base_s:g}"
        )
    if settings.turn_deadline_s > settings.max_deadline_s:
        raise SettingsError(
            "AGENTJOBS_TURN_DEADLINE_S must be at most AGENTJOBS_MAX_DEADLINE_S, "
            f"got {settings.turn_deadline_s:g} > {settings.max_deadline_s:g}"
        )
    if settings.turn_queue == settings.retry_queue:
        raise SettingsError(
            "AGENTJOBS_TURN_QUEUE and AGENTJOBS_RETRY_QUEUE must differ, "
            f"both are {settings.turn_queue!r}"
        )
    if settings.provider in NAMED_MODEL_PROVIDERS and not settings.model:
        raise SettingsError(
            f"AGENTJOBS_MODEL must name the model when AGENTJOBS_PROVIDER={settings.provider}"
        )
    return settings


def celery_tls_url(url: str, variable: str) -> str:
    """A rediss:// broker or result backend URL with ssl_cert_reqs=required added when it names
    none: Celery's result backend refuses such a URL (the worker exits at start) and kombu's
    transport would verify no certificate. An explicit value is kept when Celery can read it;
    any other URL comes back as it is."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "rediss":
        return url
    given = [v for k, v in parse_qsl(parts.query, keep_blank_values=True) if k == "ssl_cert_reqs"]
    if not given:
        query = f"{parts.query}&ssl_cert_reqs=required" if parts.query else "ssl_cert_reqs=required"
        return urlunsplit(parts._replace(query=query))
    if given[-1] not in _CERT_REQS:
        raise SettingsError(
            f"{variable}: ssl_cert_reqs must be required, optional or none (value not shown)"
        )
    return url


def parse_agents(text: str, variable: str = "AGENTJOBS_AGENTS") -> dict[str, str]:
    """ "name=module:factory,name2=module:factory" -> {name: "module:factory"}."""
    agents: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, target = item.partition("=")
        module, colon, attribute = target.strip().partition(":")
        if not sep or not name.strip() or not colon or not module or not attribute:
            raise SettingsError(f"{variable} must list name=module:factory items, got {item!r}")
        agents[name.strip()] = target.strip()
    return agents


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """The values of secret-looking environment variables (API keys, tokens, passwords),
    longest first: tasks/core/redact.py replaces them wherever they would be stored or logged."""
    env = os.environ if environ is None else environ
    values = {
        value
        for name, value in env.items()
        if _SECRET_NAME.search(name) and len(value) >= _MIN_SECRET_LEN
    }
    return sorted(values, key=len, reverse=True)


class _Environment:
    """Typed reads of one environment mapping. A blank value counts as unset."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ

    def raw(self, variable: str) -> str | None:
        value = self._environ.get(variable)
        return value.strip() if value is not None and value.strip() else None

    def text(self, variable: str, default: str) -> str:
        return self.raw(variable) or default

    def matching(self, variable: str, default: str, pattern: re.Pattern[str], what: str) -> str:
        value = self.raw(variable)
        if value is None:
            return default
        if not pattern.fullmatch(value):
            raise SettingsError(f"{variable} must be {what} ({pattern.pattern}), got {value!r}")
        return value

    def choice(self, variable: str, default: str, choices: tuple[str, ...]) -> str:
        value = (self.raw(variable) or default).lower()
        if value not in choices:
            raise SettingsError(
                f"{variable} must be one of {', '.join(choices)}, got {self.raw(variable)!r}"
            )
        return value

    def flag(self, variable: str, default: bool) -> bool:
        value = self.raw(variable)
        if value is None:
            return default
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise SettingsError(f"{variable} must be 1 or 0 (or true/false, yes/no), got {value!r}")

    def seconds(self, variable: str, default: float) -> float:
        value = self.raw(variable)
        if value is None:
            return default
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not math.isfinite(number) or number <= 0:
            raise SettingsError(f"{variable} must be a number of seconds > 0, got {value!r}")
        if number > MAX_SECONDS:
            raise SettingsError(f"{variable} must be at most {MAX_SECONDS} s, got {value!r}")
        return number

    def whole_seconds(self, variable: str, default: int) -> int:
        value = self.raw(variable)
        if value is None:
            return default
        if not value.isdigit() or int(value) <= 0:
            raise SettingsError(f"{variable} must be a whole number of seconds > 0, got {value!r}")
        if int(value) > MAX_SECONDS:
            raise SettingsError(f"{variable} must be at most {MAX_SECONDS} s, got {value!r}")
        return int(value)

    def parsed(self, variable: str, parse: Callable[[str], _T], default: _T) -> _T:
        """A structured value (tasks/core/limits.py), its parse error named by the variable."""
        value = self.raw(variable)
        if value is None:
            return default
        try:
            return parse(value)
        except LimitError as exc:
            raise SettingsError(f"{variable}: {exc}") from None

    def count(self, variable: str, default: int, *, maximum: int | None = None) -> int:
        value = self.raw(variable)
        if value is None:
            return default
        number = int(value) if value.isdigit() else 0
        if number < 1 or (maximum is not None and number > maximum):
            limit = f" and <= {maximum}" if maximum is not None else ""
            raise SettingsError(f"{variable} must be a whole number >= 1{limit}, got {value!r}")
        return number

    def url(self, variable: str, default: str, *, schemes: tuple[str, ...] = ()) -> str:
        value = self.raw(variable)
        if value is None:
            return default
        # Never quoted: a broker or Redis URL may carry a password.
        scheme = urlsplit(value).scheme
        if not scheme or "://" not in value or (schemes and scheme not in schemes):
            kinds = " or ".join(f"{s}://" for s in schemes) if schemes else "scheme://"
            raise SettingsError(f"{variable} must be a {kinds} URL (value not shown)")
        return value

    def state_url(self, variable: str, default: str) -> str:
        value = self.raw(variable)
        if value is None:
            return default
        try:
            parse_state_url(value, variable)
        except StateURLError as bad:
            raise SettingsError(str(bad)) from None
        return value

    def celery_url(self, variable: str, default: str) -> str:
        """A broker or result backend URL; our redis+sentinel:// form is checked here (and
        spelled as Celery's in celeryconfig.py), a Redis Cluster refused, a rediss:// URL
        given ssl_cert_reqs=required unless it says otherwise."""
        value = self.url(variable, default)
        scheme = urlsplit(value).scheme.lower()
        if scheme == CLUSTER_SCHEME:
            raise SettingsError(
                f"{variable} cannot be a Redis Cluster: Celery's Redis transport and result "
                "backend use keys of many slots in one command; use one Redis, a Sentinel group "
                "(redis+sentinel://) or RabbitMQ (amqp://), and AGENTJOBS_STATE_URL for the cluster"
            )
        if scheme == SENTINEL_SCHEME:
            return self.state_url(variable, default)
        return celery_tls_url(value, variable)

    def http_url(self, variable: str) -> str | None:
        value = self.raw(variable)
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise SettingsError(f"{variable} must be an http:// or https:// URL (value not shown)")
        return value.rstrip("/")

    def api_key(self, variable: str) -> str:
        value = self.raw(variable)
        if value is None:
            return ""
        # A header value must be visible ASCII; never quoted.
        if not value.isascii() or not value.isprintable() or any(c.isspace() for c in value):
            raise SettingsError(
                f"{variable} contains characters that cannot go in an HTTP header (value not shown)"
            )
        return value
