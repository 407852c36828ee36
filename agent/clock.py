"""The time layer: reading a turn's `time` input and fixing the turn's clock
(docs/checkpoint.md, "The time input").

Only an agent built with `time=TimeLayer(...)` accepts a `time` input. The zone is the run's,
else the layer's; with neither, the run is refused: the server's zone is never used.
"""

from __future__ import annotations

import re
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from agent.errors import InvalidRunInputError

_INSTANT = re.compile(
    r"\d{4}-\d{2}-\d{2}T(?P<h>\d{2}):(?P<m>\d{2})(?::(?P<s>\d{2})(?:\.\d{1,9})?)?"
    r"(?:Z|[+-]\d{2}:\d{2})"
)
# Abbreviations (PST, CET) and offsets are not zones, even where tzdata carries a legacy entry.
_NOT_A_ZONE = re.compile(r"[A-Z]{2,5}|[A-Z]{3}\d.*|[+-].*|\d.*|(UTC|GMT)[+-].*")
_ALLOWED_KEYS = frozenset({"now", "zone", "window"})


@dataclass(frozen=True)
class TimeLayer:
    """Build an agent with `time=TimeLayer(zone="Europe/Paris")` to accept a `time` input."""

    zone: str | None = None

    def __post_init__(self) -> None:
        if self.zone is not None:
            _check_zone(self.zone, "time.zone")


@dataclass(frozen=True)
class RunTime:
    now: str | None = None
    zone: str | None = None
    window: tuple[str, str] | None = None


def _instant(value: object, field: str) -> str:
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidRunInputError(field, "a datetime must carry a time zone offset")
        utc = value.astimezone(UTC)
        return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"
    if not isinstance(value, str):
        raise InvalidRunInputError(field, "must be an ISO-8601 instant string or a datetime")
    match = _INSTANT.fullmatch(value)
    if match is None:
        raise InvalidRunInputError(
            field, "must be a strict ISO-8601 instant with an offset or Z (2026-11-30T09:00:00Z)"
        )
    if match["s"] == "60":
        raise InvalidRunInputError(field, "leap seconds are not accepted")
    try:
        datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidRunInputError(field, "is not a real date and time") from None
    return value


def _check_zone(value: object, field: str) -> str:
    malformed = not isinstance(value, str) or not value or _NOT_A_ZONE.fullmatch(value)
    if malformed and value not in ("UTC", "GMT"):
        raise InvalidRunInputError(
            field, "must be an IANA zone name such as Europe/Paris (not an abbreviation)"
        )
    assert isinstance(value, str)
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise InvalidRunInputError(field, "is not a known IANA zone name") from None
    return value


def read_run_time(value: object) -> RunTime:
    if isinstance(value, RunTime):
        value = {"now": value.now, "zone": value.zone, "window": value.window}
    if not isinstance(value, Mapping):
        raise InvalidRunInputError("time", "must be an object {now?, zone?, window?}")
    unknown = sorted(str(k) for k in value if k not in _ALLOWED_KEYS)
    if unknown:
        raise InvalidRunInputError("time", f"unknown keys {unknown}; allowed: now, zone, window")
    now = None if value.get("now") is None else _instant(value["now"], "time.now")
    zone = None if value.get("zone") is None else _check_zone(value["zone"], "time.zone")
    window = None
    if value.get("window") is not None:
        raw = value["window"]
        if isinstance(raw, Mapping):
            start, end = raw.get("from"), raw.get("to")
        elif isinstance(raw, list | tuple) and len(raw) == 2:
            start, end = raw
        else:
            raise InvalidRunInputError("time.window", "must be an object {from, to}")
        start_s = _instant(start, "time.window.from")
        end_s = _instant(end, "time.window.to")
        if _parse(start_s) >= _parse(end_s):
            raise InvalidRunInputError("time.window", "from must be earlier than to")
        window = (start_s, end_s)
    return RunTime(now=now, zone=zone, window=window)


def _parse(instant: str) -> datetime:
    return datetime.fromisoformat(instant.replace("Z", "+00:00"))


def utc_now_iso() -> str:
    return _instant(datetime.now(UTC), "now")


def clock_row(layer: TimeLayer, run_time: RunTime | None, turn: int) -> dict[str, Any]:
    """The turn's `clock` ledger row; refuses a turn with no zone from the run or the layer."""
    zone = (run_time.zone if run_time else None) or layer.zone
    if zone is None:
        raise InvalidRunInputError(
            "time.zone",
            "no time zone for this turn: pass time={'zone': ...} or build TimeLayer(zone=...)",
        )
    app_now = run_time.now if run_time else None
    row: dict[str, Any] = {
        "kind": "clock",
        "turn": turn,
        "now": app_now or utc_now_iso(),
        "zone": zone,
        "nowSource": "app" if app_now else "default",
    }
    if run_time and run_time.window:
        row["window"] = {"from": run_time.window[0], "to": run_time.window[1], "source": "control"}
    return row
