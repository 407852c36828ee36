"""The agentjobs command against a real job system: dead letters listed, shown, replayed (once)
and purged; a turn's state readable; task events, once enabled, reaching an event consumer as
Flower's do."""

from __future__ import annotations

import threading
import time
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from tasks import TurnDeadLettered, app, load_conversation, run_turn
from tasks.cli import main, parse_duration_s
from tasks.context import job_context
from tasks.testing import wait_until


def cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def dead_lettered(**payload: Any) -> TurnDeadLettered:
    with pytest.raises(TurnDeadLettered) as caught:
        run_turn.delay(**payload).get(timeout=30)
    return caught.value


def test_list_and_show_print_entries_as_json_and_tables(jobs: Any) -> None:
    auth = dead_lettered(agent="demo", conversation_id="c-auth", message="x fail:401")
    unknown = dead_lettered(agent="nobody", conversation_id="c-x", message="y")
    entries = orjson.loads(cli("dlq", "list", "--json"))
    assert [e["id"] for e in entries] == [auth.entry_id, unknown.entry_id]
    required = {
        "id",
        "reason",
        "errorType",
        "error",
        "attempts",
        "agent",
        "conversationId",
        "taskId",
        "firstFailedAt",
        "lastFailedAt",
        "checkpoint",
    }
    assert all(required <= set(e) for e in entries)
    only = orjson.loads(cli("dlq", "list", "--json", "--reason", "unknown_agent"))
    assert [e["id"] for e in only] == [unknown.entry_id]
    shown = orjson.loads(cli("dlq", "show", auth.entry_id, "--json"))
    assert shown["reason"] == "non_resumable" and shown["errorType"] == "ProviderHTTPError"
    assert shown["checkpoint"]["history"] == [{"role": "user", "content": "x fail:401"}]
    table = cli("dlq", "list")
    assert auth.entry_id in table and "non_resumable" in table and "unknown_agent" in table
    assert "c-auth" in cli("dlq", "show", auth.entry_id)
    missing = CliRunner().invoke(main, ["dlq", "show", "dl-nope"])
    assert missing.exit_code != 0 and "no dead-letter entry" in missing.output


def test_replay_resumes_with_a_fresh_budget_and_a_second_replay_runs_nothing(
    make_jobs: Any,
) -> None:
    jobs = make_jobs(AGENTJOBS_MAX_ATTEMPTS="2")
    jobs.worker()
    jobs.pump()
    # Calls 1 and 2 fail (both attempts spent); after the replay, call 3 fails, call 4 answers.
    failed = dead_lettered(agent="demo", conversation_id="c-r", message="retry me fail:503x3")
    assert failed.reason == "max_attempts"
    output = cli("dlq", "replay", failed.entry_id)
    assert "resuming its checkpoint" in output
    turn_id = output.split(" as turn ")[1].split(" ")[0]
    again = cli("dlq", "replay", failed.entry_id)
    assert f"already replayed as turn {turn_id}" in again
    assert job_context().dead_letters.get(failed.entry_id) is None

    reply = app.AsyncResult(turn_id).get(timeout=30)
    assert reply["attempts"] == 2 and reply["content"] == "Done: retry me fail:503x3"
    stored = load_conversation("c-r")
    assert stored is not None
    assert [m["content"] for m in stored.history if m["role"] == "user"] == ["retry me fail:503x3"]
    calls = jobs.redis.keys(f"{job_context().keys.prefix}:demo:calls:*")
    assert int(jobs.redis.get(calls[0])) == 4, "the turn ran more than once after two replays"


def test_replay_after_the_conversation_moved_on_runs_the_message_again(jobs: Any) -> None:
    failed = dead_lettered(agent="demo", conversation_id="c-m", message="first fail:401")
    run_turn.delay(agent="demo", conversation_id="c-m", message="second").get(timeout=30)
    output = cli("dlq", "replay", failed.entry_id)
    assert "from its message" in output
    turn_id = output.split(" as turn ")[1].split(" ")[0]
    with pytest.raises(TurnDeadLettered):  # still a 401: it fails again, on the new history
        app.AsyncResult(turn_id).get(timeout=30)
    record = job_context().records.get(turn_id)
    assert record is not None and record.replay_of == failed.entry_id
    stored = load_conversation("c-m")
    assert stored is not None
    assert [m["content"] for m in stored.history] == ["second", "Done: second"]


def test_purge_by_reason_and_age(jobs: Any) -> None:
    dead_lettered(agent="nobody", conversation_id="a", message="x")
    dead_lettered(agent="demo", conversation_id="b", message="x fail:401")
    assert "purged 0 entries" in cli("dlq", "purge", "--older-than", "1h", "--yes")
    assert "purged 1 entries" in cli("dlq", "purge", "--reason", "unknown_agent", "--yes")
    assert [e["reason"] for e in orjson.loads(cli("dlq", "list", "--json"))] == ["non_resumable"]
    time.sleep(1.1)
    assert "purged 1 entries" in cli("dlq", "purge", "--older-than", "1s", "--yes")
    assert orjson.loads(cli("dlq", "list", "--json")) == []


def test_parse_duration() -> None:
    assert parse_duration_s("90") == 90
    assert parse_duration_s("15m") == 900
    assert parse_duration_s("2h") == 7200
    assert parse_duration_s("7d") == 604800
    with pytest.raises(Exception, match="not a duration"):
        parse_duration_s("soon")


def test_turn_show_follows_a_turn_through_its_states(make_jobs: Any) -> None:
    jobs = make_jobs(AGENTJOBS_BACKOFF_BASE_S="3")
    jobs.worker()
    jobs.pump()
    result = run_turn.delay(agent="demo", conversation_id="s", message="z fail:503x1 rounds:2")
    records = job_context().records
    wait_until(
        lambda: (r := records.get(result.id)) is not None and r.state == "waiting", 10, "waiting"
    )
    waiting = cli("turn", "show", result.id)
    assert "waiting for retry (attempt 2) until" in waiting
    as_json = orjson.loads(cli("turn", "show", result.id, "--json"))
    assert as_json["state"] == "waiting" and as_json["attempt"] == 2
    assert "token" not in as_json
    result.get(timeout=30)
    assert "succeeded" in cli("turn", "show", result.id)


def test_task_events_reach_an_event_consumer_once_enabled_like_flower(jobs: Any) -> None:
    seen: list[dict[str, Any]] = []
    ready = threading.Event()
    receivers: list[Any] = []

    def consume() -> None:
        with app.connection() as connection:
            receiver = app.events.Receiver(connection, handlers={"*": seen.append})
            receivers.append(receiver)
            ready.set()
            receiver.capture(limit=None, timeout=10, wakeup=True)

    def succeeded(task_id: str) -> bool:
        return any(e.get("type") == "task-succeeded" and e.get("uuid") == task_id for e in seen)

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    ready.wait(5)
    time.sleep(0.5)
    # Task events are off by default (they cost throughput) ...
    quiet = run_turn.delay(agent="demo", conversation_id="ev", message="quiet")
    quiet.get(timeout=30)
    # ... and on once a monitor asks, as Flower does when it connects (or
    # `celery -A tasks control enable_events`)
    replies = app.control.enable_events(reply=True, timeout=2)
    assert [reply for r in replies for reply in r.values()] == [{"ok": "task events enabled"}]
    result = run_turn.delay(agent="demo", conversation_id="ev", message="events")
    result.get(timeout=30)
    wait_until(lambda: succeeded(result.id), 10, "a task-succeeded event")
    assert not succeeded(quiet.id)
    receivers[0].should_stop = True
    thread.join(timeout=15)
