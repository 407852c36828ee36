"""The argument and option types the commands share: durations (and plain seconds), the reason
and state choices, non-empty text, JSON tool arguments, and the --tenant/--principal pair of
by-id commands."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, TypeVar

import click
import orjson

from tasks.core.errors import Reason
from tasks.store.records import TurnState

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
REASON = click.Choice([str(r) for r in Reason])
STATE = click.Choice([str(s) for s in TurnState])


def parse_duration_s(text: str) -> float:
    """'90', '90s', '15m', '2h', '7d', '1w' -> seconds."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise click.BadParameter(f"{text!r} is not a duration like 90s, 15m, 2h or 7d")
    return float(match[1]) * _UNIT_S[match[2]]


class Duration(click.ParamType):  # type: ignore[type-arg]
    name = "DURATION"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        if isinstance(value, float):
            return value
        seconds = parse_duration_s(str(value))
        if seconds <= 0:
            self.fail(f"{value!r} is not longer than nothing; --all deletes every entry")
        return seconds


class Seconds(click.ParamType):  # type: ignore[type-arg]
    """A length of time as seconds: '90', '90s', '15m', '2h', '7d'. Zero passes unless
    `positive`: where the job system checks the value itself (run_turn's deadline_s), the
    command leaves the refusal to it."""

    name = "SECONDS"

    def __init__(self, *, positive: bool = False) -> None:
        self.positive = positive

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        if isinstance(value, float):
            return value
        seconds = parse_duration_s(str(value))
        if self.positive and seconds <= 0:
            self.fail(f"{value!r} is not longer than nothing")
        return seconds


def not_empty(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A filter option's callback: given, it must say something."""
    if value is not None and not value.strip():
        raise click.BadParameter("must not be empty; leave the option out to match any")
    return value


def json_args(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """The --args callback: a JSON object of a tool call's arguments, or None if not given."""
    if value is None:
        return None
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise click.BadParameter("must be a JSON object of the tool's arguments")
    return parsed


def identity_of(tenant: str | None, principal: str | None) -> dict[str, str]:
    """The identity the options give: only the parts that were given."""
    return {k: v for k, v in (("tenant", tenant), ("principal", principal)) if v}


_Command = TypeVar("_Command", bound=Callable[..., Any])


def by_identity(command: _Command) -> _Command:
    """--tenant/--principal on a by-id command, passed as `identity`: with either, a turn of
    another tenant or principal is treated as unknown (docs/platform.md, "By-id calls and
    identity"); with neither, the turn id alone decides."""

    @functools.wraps(command)
    def run(*args: Any, tenant: str | None, principal: str | None, **kwargs: Any) -> Any:
        return command(*args, identity=identity_of(tenant, principal) or None, **kwargs)

    run = click.option(
        "--principal", default=None, callback=not_empty, help="Only a turn of this principal."
    )(run)
    run = click.option(
        "--tenant", default=None, callback=not_empty, help="Only a turn of this tenant."
    )(run)
    return run  # type: ignore[return-value]
