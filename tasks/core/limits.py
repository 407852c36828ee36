"""The budget and fairness settings (docs/platform.md, "Budgets and fairness"), parsed from their
environment variables into values tasks/budgets/ and tasks/turn/fairness.py use:

    AGENTJOBS_BUDGETS             openai:gpt-4o-mini=requests:500/60s,tokens:200000/60s;...
    AGENTJOBS_TENANT_WEIGHTS      acme=3,beta=1            (default 1 each)
    AGENTJOBS_TENANT_MAX_RUNNING  acme=8,*=4               (default unlimited)
    AGENTJOBS_TENANT_TOKEN_LIMIT  acme=2000000/1d,*=500000/1d

A value that does not parse raises SettingsError naming the variable and the piece that is wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Generic, TypeVar

V = TypeVar("V")

# Every other part of a setting takes this alphabet: names appear in Redis keys, metric labels and
# event data.
_NAME = re.compile(r"[A-Za-z0-9_.\-/@]+")
_MODEL = re.compile(r"[A-Za-z0-9_.\-/@:]+|\*")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
# The longest window or --since span: a week (usage buckets live eight days).
MAX_WINDOW_MS = 7 * 86_400_000
ANY = "*"


class LimitError(ValueError):
    """A budget or fairness setting that does not parse; the message names what is wrong."""


class LimitKind(StrEnum):
    REQUESTS = "requests"
    TOKENS = "tokens"


@dataclass(frozen=True, slots=True)
class Limit:
    """At most `amount` requests or tokens in any span of `window_ms`."""

    kind: LimitKind
    amount: int
    window_ms: int

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.amount}/{duration_text(self.window_ms)}"


@dataclass(frozen=True, slots=True)
class Budget:
    """A provider model's shared limits: `name` is "provider:model" (model "*" for all)."""

    provider: str
    model: str
    limits: tuple[Limit, ...]

    @property
    def name(self) -> str:
        return f"{self.provider}:{self.model}"


@dataclass(frozen=True, slots=True)
class Budgets:
    """Every configured budget; `for_call` picks the one a model call spends from."""

    budgets: tuple[Budget, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.budgets)

    def for_call(self, provider: str, model: str) -> Budget | None:
        """The budget of `provider:model`: the exact model's, else the provider's `*`."""
        wildcard = None
        for budget in self.budgets:
            if budget.provider != provider:
                continue
            if budget.model == model:
                return budget
            if budget.model == ANY:
                wildcard = budget
        return wildcard


@dataclass(frozen=True, slots=True)
class PerTenant(Generic[V]):
    """A value per tenant with a default for the rest (`*`), or None: unset."""

    values: dict[str, V] = field(default_factory=dict)
    default: V | None = None

    def __bool__(self) -> bool:
        return bool(self.values) or self.default is not None

    def get(self, tenant: str) -> V | None:
        return self.values.get(tenant, self.default)


@dataclass(frozen=True, slots=True)
class TokenCap:
    amount: int
    window_ms: int


def duration_ms(text: str, what: str = "a duration") -> int:
    """'500ms', '60s', '15m', '1h', '1d' -> ms; a bare number is seconds."""
    value = text.strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", value):
        value += "s"
    match = _DURATION.fullmatch(value)
    if match is None:
        raise LimitError(f"{what} must be a number with ms, s, m, h or d, got {text!r}")
    ms = int(float(match[1]) * _UNIT_MS[match[2]])
    if ms <= 0 or ms > MAX_WINDOW_MS:
        raise LimitError(f"{what} must be between 1 ms and 7 days, got {text!r}")
    return ms


def duration_text(ms: int) -> str:
    for unit in ("d", "h", "m", "s"):
        if ms % _UNIT_MS[unit] == 0:
            return f"{ms // _UNIT_MS[unit]}{unit}"
    return f"{ms}ms"


def _amount(text: str, what: str) -> int:
    if not re.fullmatch(r"\d{1,15}", text.strip()) or int(text) <= 0:
        raise LimitError(f"{what} must be a whole number > 0, got {text!r}")
    return int(text)


def _pairs(text: str, separator: str = ",") -> list[tuple[str, str]]:
    pairs = []
    for piece in text.split(separator):
        if not piece.strip():
            continue
        name, equals, value = piece.partition("=")
        if not equals or not name.strip() or not value.strip():
            raise LimitError(f"{piece.strip()!r} is not NAME=VALUE")
        pairs.append((name.strip(), value.strip()))
    return pairs


def _tenant(name: str) -> str:
    if name != ANY and not _NAME.fullmatch(name):
        raise LimitError(f"tenant {name!r} has characters outside {_NAME.pattern}")
    return name


def parse_budgets(text: str) -> Budgets:
    budgets: list[Budget] = []
    seen: set[str] = set()
    for target, spec in _pairs(text, ";"):
        provider, colon, model = target.partition(":")
        if not colon or not _NAME.fullmatch(provider) or not _MODEL.fullmatch(model):
            raise LimitError(f"budget {target!r} must be PROVIDER:MODEL or PROVIDER:*")
        if target in seen:
            raise LimitError(f"budget {target!r} is named twice")
        seen.add(target)
        limits = []
        for piece in spec.split(","):
            kind, colon, rest = piece.strip().partition(":")
            amount, slash, window = rest.partition("/")
            if kind not in LimitKind.__members__.values() or not colon or not slash:
                raise LimitError(
                    f"budget {target!r}: {piece.strip()!r} is not requests:N/WINDOW or "
                    "tokens:N/WINDOW"
                )
            limits.append(
                Limit(
                    LimitKind(kind),
                    _amount(amount, f"budget {target!r} {kind}"),
                    duration_ms(window, f"budget {target!r} window"),
                )
            )
        budgets.append(Budget(provider, model, tuple(limits)))
    return Budgets(tuple(budgets))


def _per_tenant_counts(text: str, what: str) -> PerTenant[int]:
    values: dict[str, int] = {}
    default = None
    for name, value in _pairs(text):
        count = _amount(value, f"the {what} of {name!r}")
        if _tenant(name) == ANY:
            default = count
        else:
            values[name] = count
    return PerTenant(values, default)


def parse_weights(text: str) -> PerTenant[int]:
    return _per_tenant_counts(text, "weight")


def parse_max_running(text: str) -> PerTenant[int]:
    return _per_tenant_counts(text, "running cap")


def parse_token_caps(text: str) -> PerTenant[TokenCap]:
    values: dict[str, TokenCap] = {}
    default = None
    for name, value in _pairs(text):
        amount, slash, window = value.partition("/")
        if not slash:
            raise LimitError(f"the token cap of {name!r} must be N/WINDOW, got {value!r}")
        cap = TokenCap(
            _amount(amount, f"the token cap of {name!r}"),
            duration_ms(window, f"the token cap window of {name!r}"),
        )
        if _tenant(name) == ANY:
            default = cap
        else:
            values[name] = cap
    return PerTenant(values, default)
