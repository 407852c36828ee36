"""The time layer (docs/checkpoint.md, "The time input"): who accepts a `time` input,
how it is read, the turn's
clock row, and the clock staying frozen when a failed turn is resumed."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from agent import (
    InvalidRunInputError,
    ProviderHTTPError,
    RunCheckpointError,
    TimeLayer,
)
from tests.agent.support import answer, plain_agent, system_prompts, wire_of

NOW = "2026-11-30T09:00:00Z"
LATER = "2026-12-01T18:30:00Z"
PARIS = "Europe/Paris"
# What docs/checkpoint.md calls a strict instant: date, uppercase T, time, then Z or an offset.
STRICT_INSTANT = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})")


def timed_agent(steps: list[Any], zone: str | None = PARIS) -> Any:
    return plain_agent(steps, time=TimeLayer(zone=zone))


def refused_time(agent: Any, time: Any) -> InvalidRunInputError:
    with pytest.raises(InvalidRunInputError) as caught:
        agent.run("What time is it?", time=time)
    return caught.value


def clock_rows(wire: dict[str, Any], kind: str = "clock") -> list[dict[str, Any]]:
    return [row for row in wire.get("findingsLedger", []) if row["kind"] == kind]


# ---------------------------------------------------------------------------------------------
# who accepts it


@pytest.mark.parametrize("how", ["input", "option"])
def test_an_agent_without_a_time_layer_refuses_time(how: str) -> None:
    agent, provider = plain_agent([answer("never")])
    with pytest.raises(InvalidRunInputError) as caught:
        if how == "input":
            agent.run({"message": "hi", "time": {"now": NOW, "zone": PARIS}})
        else:
            agent.run("hi", time={"now": NOW, "zone": PARIS})
    assert caught.value.field == "time"
    assert provider.requests == [] and agent.checkpoint() is None


def test_an_agent_without_a_time_layer_refuses_time_on_resume() -> None:
    agent, provider = plain_agent([answer("a"), answer("never")])
    agent.run("hi")
    with pytest.raises(InvalidRunInputError):
        agent.resume_on_error(wire_of(agent), time={"zone": PARIS})
    assert len(provider.requests) == 1


def test_an_agent_without_a_time_layer_records_no_clock() -> None:
    agent, _ = plain_agent([answer("ok")])
    agent.run("hi")
    assert "findingsLedger" not in wire_of(agent)


# ---------------------------------------------------------------------------------------------
# reading `now`


@pytest.mark.parametrize(
    "now",
    [
        "2026-11-30T09:00:00Z",
        "2026-11-30T09:00:00.123Z",
        "2026-11-30T10:00:00+01:00",
        "2026-11-30T04:00:00-05:00",
    ],
)
def test_strict_instants_are_accepted_and_recorded_as_written(now: str) -> None:
    agent, _ = timed_agent([answer("ok")])
    agent.run("What time is it?", time={"now": now})
    (row,) = clock_rows(wire_of(agent))
    assert row["now"] == now and row["nowSource"] == "app"


@pytest.mark.parametrize(
    "now",
    [
        "2026-11-30t09:00:00Z",  # lowercase t
        "2026-11-30T09:00:00",  # no offset
        "2026-11-30 09:00:00Z",  # space
        "2026-11-30",  # a date
        "2016-12-31T23:59:60Z",  # leap second
        "2026-02-30T09:00:00Z",  # no such day
        "2026-11-30T25:00:00Z",
        "Mon, 30 Nov 2026 09:00:00 GMT",
        "",
        1796000000000,
        ["2026-11-30T09:00:00Z"],
    ],
)
def test_anything_but_a_strict_instant_is_refused(now: Any) -> None:
    agent, provider = timed_agent([answer("never")])
    assert refused_time(agent, {"now": now}).field == "time.now"
    assert provider.requests == []


def test_an_aware_datetime_becomes_utc_iso_with_milliseconds() -> None:
    agent, _ = timed_agent([answer("ok")])
    local = datetime(2026, 11, 30, 10, 0, 0, 250_000, tzinfo=timezone(timedelta(hours=1)))
    agent.run("What time is it?", time={"now": local})
    (row,) = clock_rows(wire_of(agent))
    assert row["now"] == "2026-11-30T09:00:00.250Z"


def test_a_naive_datetime_is_refused() -> None:
    agent, _ = timed_agent([answer("never")])
    assert refused_time(agent, {"now": datetime(2026, 11, 30, 9, 0)}).field == "time.now"


# ---------------------------------------------------------------------------------------------
# reading `zone`


@pytest.mark.parametrize("zone", ["Europe/Paris", "America/Los_Angeles", "Asia/Kolkata", "UTC"])
def test_iana_zones_are_accepted(zone: str) -> None:
    agent, _ = timed_agent([answer("ok")])
    agent.run("What time is it?", time={"zone": zone})
    assert clock_rows(wire_of(agent))[0]["zone"] == zone


@pytest.mark.parametrize("zone", ["US/Pacific", "Asia/Calcutta"])
def test_a_zone_is_stored_exactly_as_written_never_canonicalized(zone: str) -> None:
    agent, _ = timed_agent([answer("ok")])
    agent.run("What time is it?", time={"zone": zone})
    assert clock_rows(wire_of(agent))[0]["zone"] == zone


@pytest.mark.parametrize(
    "zone", ["PST", "EST", "CET", "+02:00", "-0500", "UTC+2", "GMT+1", "Mars/Olympus", "", 2]
)
def test_abbreviations_offsets_and_unknown_zones_are_refused(zone: Any) -> None:
    agent, provider = timed_agent([answer("never")])
    assert refused_time(agent, {"zone": zone}).field == "time.zone"
    assert provider.requests == []


@pytest.mark.parametrize("zone", ["PST", "+02:00"])
def test_the_layer_refuses_a_non_iana_zone_when_built(zone: str) -> None:
    with pytest.raises(InvalidRunInputError):
        TimeLayer(zone=zone)


# ---------------------------------------------------------------------------------------------
# the shape of `time`


@pytest.mark.parametrize("time", ["2026-11-30T09:00:00Z", ["now"], 5])
def test_time_must_be_an_object(time: Any) -> None:
    agent, _ = timed_agent([answer("never")])
    assert refused_time(agent, time).field == "time"


def test_unknown_time_keys_are_refused() -> None:
    agent, _ = timed_agent([answer("never")])
    assert refused_time(agent, {"now": NOW, "tz": PARIS}).field == "time"


def test_a_window_is_half_open_and_recorded_as_a_control() -> None:
    agent, _ = timed_agent([answer("ok")])
    agent.run("What happened?", time={"now": LATER, "window": {"from": NOW, "to": LATER}})
    (row,) = clock_rows(wire_of(agent))
    assert row["window"] == {"from": NOW, "to": LATER, "source": "control"}


@pytest.mark.parametrize(
    "window",
    [
        {"from": LATER, "to": NOW},
        {"from": NOW, "to": NOW},
        {"from": "2026-11-30", "to": LATER},
        {"from": NOW, "to": "tomorrow"},
        {"from": NOW},
        "2026-11-30/2026-12-01",
    ],
)
def test_a_bad_window_is_refused(window: Any) -> None:
    agent, provider = timed_agent([answer("never")])
    assert refused_time(agent, {"window": window}).field.startswith("time.window")
    assert provider.requests == []


# ---------------------------------------------------------------------------------------------
# the turn's clock


def test_with_no_zone_from_the_run_or_the_layer_the_run_is_refused() -> None:
    agent, provider = timed_agent([answer("never")], zone=None)
    with pytest.raises(InvalidRunInputError) as caught:
        agent.run("What time is it?")
    assert caught.value.field == "time.zone"
    assert refused_time(agent, {"now": NOW}).field == "time.zone"
    assert provider.requests == [] and agent.checkpoint() is None


def test_the_layer_zone_serves_when_the_run_names_none() -> None:
    agent, _ = timed_agent([answer("ok")], zone="Asia/Tokyo")
    agent.run("What time is it?")
    (row,) = clock_rows(wire_of(agent))
    assert row["zone"] == "Asia/Tokyo"
    assert row["nowSource"] == "default"
    assert STRICT_INSTANT.fullmatch(row["now"])
    stamped = datetime.fromisoformat(row["now"].replace("Z", "+00:00"))
    assert abs((datetime.now(UTC) - stamped).total_seconds()) < 60


def test_the_run_zone_beats_the_layer_zone() -> None:
    agent, _ = timed_agent([answer("ok")], zone="Asia/Tokyo")
    agent.run("What time is it?", time={"zone": PARIS})
    assert clock_rows(wire_of(agent))[0]["zone"] == PARIS


def test_the_input_time_beats_the_option_time() -> None:
    agent, _ = timed_agent([answer("ok")])
    agent.run({"message": "hi", "time": {"zone": "Asia/Tokyo"}}, time={"zone": PARIS})
    assert clock_rows(wire_of(agent))[0]["zone"] == "Asia/Tokyo"


def test_the_clock_is_stamped_once_per_turn() -> None:
    agent, _ = timed_agent([answer("a"), answer("b")])
    agent.run("one", time={"now": NOW})
    agent.follow_up("two", time={"now": LATER})
    rows = clock_rows(wire_of(agent))
    assert [(row["turn"], row["now"]) for row in rows] == [(1, NOW), (2, LATER)]
    assert all(row["zone"] == PARIS for row in rows)


# ---------------------------------------------------------------------------------------------
# frozen across a resume


def crashed_turn(now: str = NOW) -> dict[str, Any]:
    agent, _ = timed_agent([ProviderHTTPError("overloaded", status=503)])
    with pytest.raises(RunCheckpointError) as caught:
        agent.run("What time is it?", time={"now": now})
    wire: dict[str, Any] = caught.value.checkpoint.to_dict()
    assert [row["now"] for row in clock_rows(wire)] == [now], "the crash keeps the turn's clock"
    return wire


def test_a_resume_passing_a_different_time_records_it_and_keeps_the_old_clock() -> None:
    agent, provider = timed_agent([answer("ok")])
    agent.resume_on_error(crashed_turn(), time={"now": LATER, "zone": PARIS})
    wire = wire_of(agent)
    assert [row["now"] for row in clock_rows(wire)] == [NOW], "not re-stamped"
    (row,) = clock_rows(wire, "clock-on-resume")
    assert row["passed"]["now"] == LATER
    assert row["kept"]["now"] == NOW and row["kept"]["zone"] == PARIS
    assert LATER not in system_prompts(provider)[0]


def test_a_resume_passing_no_time_keeps_the_clock_silently() -> None:
    agent, _ = timed_agent([answer("ok")])
    agent.resume_on_error(crashed_turn())
    wire = wire_of(agent)
    assert [row["now"] for row in clock_rows(wire)] == [NOW]
    assert clock_rows(wire, "clock-on-resume") == []


def test_a_resume_passing_the_same_time_records_nothing() -> None:
    agent, _ = timed_agent([answer("ok")])
    agent.resume_on_error(crashed_turn(), time={"now": NOW, "zone": PARIS})
    assert clock_rows(wire_of(agent), "clock-on-resume") == []
