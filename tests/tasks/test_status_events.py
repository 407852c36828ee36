"""What a turn is doing, seen three ways (docs/operations.md, "Turn states and status" and
"Events"): turn_status(), Celery's own states (RUNNING / WAITING with their .info), and the
turn's event stream, live and again after a reconnect. Real workers, a real Redis."""

from __future__ import annotations

import threading
import time
from datetime import UTC
from typing import Any

import pytest

from tasks import TurnDeadLettered, TurnState, app, iter_events, run_turn, turn_status
from tasks.testing import wait_until

pytestmark = pytest.mark.integration


def states_seen(turn_id: str, until: set[str], timeout_s: float = 30) -> list[tuple[str, Any]]:
    """Every distinct (state, info) Celery reports for the turn, polled until one of `until`."""
    seen: list[tuple[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = app.AsyncResult(turn_id)
        state, info = result.state, result.info
        if not seen or seen[-1][0] != state or seen[-1][1] != info:
            seen.append((state, info))
        if state in until:
            return seen
        time.sleep(0.02)
    raise AssertionError(f"no state in {until} after {timeout_s} s: {seen}")


def test_celery_shows_running_then_waiting_then_success(jobs: Any) -> None:
    # Given a turn whose first model call takes longer than a lease renewal (0.75 s with the
    # tests' 3 s lease), then fails with a 503, and whose retry does two tool rounds
    result = run_turn.delay(
        agent="demo", conversation_id="c-states", message="hi rounds:2 think:1.2 fail:503x1"
    )
    seen = states_seen(result.id, {"SUCCESS"})
    states = [state for state, _ in seen]
    # Then Celery saw it run, wait for its retry, run again and succeed, in that order
    assert states[-1] == "SUCCESS"
    assert "RUNNING" in states and "WAITING" in states
    assert states.index("RUNNING") < states.index("WAITING") < len(states) - 1
    running = next(info for state, info in seen if state == "RUNNING")
    assert running["state"] == "running" and running["attempt"] == 1
    waiting = next(info for state, info in seen if state == "WAITING")
    assert waiting["state"] == "waiting" and waiting["attempt"] == 2
    assert "HTTP 503" in waiting["lastError"] and waiting["dueAt"] > 1_700_000_000_000
    assert any(s == "RUNNING" and i["attempt"] == 2 for s, i in seen)
    # And result.get() waited through all of it for the final reply
    assert result.get(timeout=30)["attempts"] == 2


def test_turn_status_follows_a_turn_from_queued_to_dead_lettered(jobs: Any) -> None:
    assert turn_status("never-submitted") is None
    first = run_turn.delay(agent="demo", conversation_id="c-st", message="one think:1.5")
    second = run_turn.delay(agent="demo", conversation_id="c-st", message="two fail:401")
    wait_until(lambda: (s := turn_status(first.id)) is not None and s.state == "running", 10, "run")
    waiting_second = turn_status(second.id)
    assert waiting_second is not None
    assert waiting_second.state is TurnState.QUEUED
    assert waiting_second.queued_behind == first.id
    assert waiting_second.attempt == 1 and waiting_second.due_at is None
    assert waiting_second.created_at.tzinfo is UTC
    first.get(timeout=30)
    with pytest.raises(TurnDeadLettered) as failed:
        second.get(timeout=30)
    done = turn_status(second.id)
    assert done is not None and done.state is TurnState.DEAD_LETTERED
    assert done.dead_letter_id == failed.value.entry_id
    assert done.queued_behind is None and done.pending == ()
    assert done.updated_at >= done.created_at


def test_a_waiting_turn_shows_when_it_is_due(make_jobs: Any) -> None:
    jobs = make_jobs(AGENTJOBS_BACKOFF_BASE_S="4")
    jobs.worker()
    jobs.pump()
    result = run_turn.delay(agent="demo", conversation_id="c-due", message="x fail:503x1")
    wait_until(lambda: (s := turn_status(result.id)) and s.state == "waiting", 10, "a retry")
    status = turn_status(result.id)
    assert status is not None and status.due_at is not None and status.due_at.tzinfo is UTC
    assert status.last_error is not None and "HTTP 503" in status.last_error
    assert status.attempt == 2
    # The record said waiting: its event said so in the same step
    assert [e.type for e in iter_events(result.id, block_s=0)][-1] == "retry.scheduled"
    result.get(timeout=30)


def test_events_arrive_live_in_order_with_one_terminal_event_last(jobs: Any) -> None:
    result = run_turn.delay(
        agent="demo", conversation_id="c-ev", message="hi rounds:2 think:0.3 fail:503x1"
    )
    events = list(iter_events(result.id))  # live: it blocks until the turn ends
    types = [e.type for e in events]
    assert types[0] == "turn.queued"
    assert types[-1] == "turn.succeeded"
    assert sum(t.startswith("turn.s") and t != "turn.started" for t in types) == 1
    assert types.count("turn.started") == 2  # the first attempt and the retry
    assert "retry.scheduled" in types and "iteration.persisted" in types
    # Each tool call: started, finished, then the round's checkpoint persisted
    tool_events = [e for e in events if e.type.startswith("tool.")]
    assert [e.type for e in tool_events] == ["tool.started", "tool.finished"] * 2
    assert tool_events[0].data == {"tool": "lookup_order", "toolCallId": "call_1"}
    assert tool_events[1].data == {"tool": "lookup_order", "toolCallId": "call_1", "ok": True}
    # (a round's last outcome goes out with its progress, under the iteration that ran it)
    assert tool_events[0].iteration == tool_events[1].iteration
    assert tool_events[2].iteration == tool_events[3].iteration > tool_events[1].iteration
    first_finish = types.index("tool.finished")
    assert types[first_finish + 1] == "iteration.persisted"
    assert types.index("retry.scheduled") < len(types) - 1
    assert events[-1].data["content"] == result.get(timeout=5)["content"]
    assert events[types.index("turn.started")].data["worker"].startswith("w1@")
    ids = [e.id for e in events]
    assert ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))
    assert all(e.turn_id == result.id and e.at.tzinfo is UTC for e in events)
    assert events[-1].attempt == 2
    # A reader that reconnects after the third event gets exactly the rest
    assert [e.id for e in iter_events(result.id, after=events[2].id)] == [e.id for e in events[3:]]


def test_a_reader_that_started_before_the_turn_ran_sees_it_end(make_jobs: Any) -> None:
    jobs = make_jobs()
    jobs.pump()
    result = run_turn.delay(agent="demo", conversation_id="c-live", message="later")
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.extend(e.type for e in iter_events(result.id)))
    reader.start()
    time.sleep(0.5)
    assert got == ["turn.queued"]  # waiting for more: the turn has not started
    jobs.worker()
    reader.join(timeout=30)
    assert got == ["turn.queued", "turn.started", "turn.succeeded"]


def test_block_s_bounds_the_wait_and_unknown_turns_raise(make_jobs: Any) -> None:
    make_jobs()  # no worker: the turn stays queued
    result = run_turn.delay(agent="demo", conversation_id="c-block", message="stays")
    started = time.monotonic()
    assert [e.type for e in iter_events(result.id, block_s=0.5)] == ["turn.queued"]
    assert 0.4 < time.monotonic() - started < 3
    with pytest.raises(LookupError):
        list(iter_events("no-such-turn"))
