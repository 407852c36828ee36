"""What Flower shows of a turn (docs/operations.md, "What Flower shows"), read the way Flower
reads it: a real event receiver on the broker, in a thread, feeding every event into Celery's
celery.events.state.State, against real workers (with task events on), the pump and Redis.

A paused turn shows RETRY and, once cancelled, REVOKED; turns queued behind it show RETRY, then
SUCCESS, or REVOKED sent by the worker when revoked; a turn past its deadline, or whose pause
expired, shows FAILURE, sent by the pump; a turn that took three attempts shows RETRY between
them, retries 2 and SUCCESS, and the worker's log has no "ignored" line; a stray delivery of an
ended turn shows it ended to a monitor that started after the end. An ending whose event cannot
be sent still ends the turn.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import states
from celery.app import trace
from celery.events.state import State
from celery.exceptions import Ignore

from tasks import (
    TurnCancelled,
    TurnDeadLettered,
    TurnState,
    app,
    cancel_turn,
    run_turn,
    turn_status,
)
from tasks.queue import results
from tasks.queue.context import job_context
from tasks.queue.results import TASK_SUCCEEDED
from tasks.testing import wait_until
from tasks.turn import ending

pytestmark = pytest.mark.integration

# The worker sends task events from its start, as after Flower's enable_events.
EVENTS_ON = ["--task-events"]


class Monitor:
    """Flower's view: an EventReceiver on app.connection() in a thread, each event applied to
    a celery.events.state.State (Flower's EventsState is one), and kept as it came."""

    def __init__(self) -> None:
        self.state = State()
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._receiver: Any = None
        self._thread = threading.Thread(target=self._run, name="monitor", daemon=True)

    def _run(self) -> None:
        with app.connection() as connection:
            self._receiver = app.events.Receiver(connection, handlers={"*": self._on_event})
            # wakeup: workers answer with a heartbeat once the receiver listens
            self._receiver.capture(limit=None, timeout=None, wakeup=True)

    def _on_event(self, event: dict[str, Any]) -> None:
        with self._lock:
            self.state.event(event)
            self.events.append(event)

    def start(self) -> Monitor:
        self._thread.start()
        wait_until(
            lambda: any(e["type"] == "worker-heartbeat" for e in self.snapshot()),
            15,
            "the monitor to hear a worker",
        )
        return self

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(timeout=10)

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.events)

    def state_of(self, turn_id: str) -> str | None:
        with self._lock:
            task = self.state.tasks.get(turn_id)
            return str(task.state) if task is not None else None

    def task(self, turn_id: str) -> dict[str, Any]:
        with self._lock:
            return dict(vars(self.state.tasks[turn_id]))

    def events_of(self, turn_id: str) -> list[dict[str, Any]]:
        return [e for e in self.snapshot() if e.get("uuid") == turn_id]

    def types_of(self, turn_id: str) -> list[str]:
        return [e["type"] for e in self.events_of(turn_id)]

    def wait_for(self, turn_id: str, state: str, timeout_s: float = 20) -> None:
        wait_until(
            lambda: self.state_of(turn_id) == state,
            timeout_s,
            f"Flower's state {state} for turn {turn_id} (it is {self.state_of(turn_id)}; "
            f"events {self.types_of(turn_id)})",
        )

    def wait_for_event(self, turn_id: str, kind: str, count: int = 1) -> None:
        wait_until(
            lambda: self.types_of(turn_id).count(kind) >= count,
            20,
            f"{count} {kind} event(s) of turn {turn_id} (events {self.types_of(turn_id)})",
        )


@pytest.fixture
def monitor() -> Iterator[Any]:
    started: list[Monitor] = []

    def start() -> Monitor:
        started.append(Monitor().start())
        return started[-1]

    yield start
    for one in started:
        one.stop()


def state_of(turn_id: str) -> TurnState | None:
    status = turn_status(turn_id)
    return status.state if status else None


def test_a_paused_turn_shows_retry_until_cancelled_then_revoked(
    make_jobs: Any, monitor: Any
) -> None:
    jobs = make_jobs()
    jobs.worker(extra_args=EVENTS_ON)
    jobs.pump()
    flower = monitor()
    # Given a turn paused for a person, and a turn of the same conversation behind it
    paused = run_turn.delay(agent="demo", conversation_id="fl-p", message="refund:D-4")
    wait_until(lambda: state_of(paused.id) is TurnState.PAUSED, 20, "the pause")
    behind = run_turn.delay(agent="demo", conversation_id="fl-p", message="after")
    last = run_turn.delay(agent="demo", conversation_id="fl-p", message="revoked")
    # Then Flower shows them released, not STARTED, and says why
    flower.wait_for(paused.id, states.RETRY)
    assert flower.task(paused.id)["exception"] == "paused: 1 decision(s) of a person pending"
    for queued in (behind, last):
        flower.wait_for(queued.id, states.RETRY)
        assert "queued behind" in flower.task(queued.id)["exception"]
    # When the last is revoked as Flower's button does, it shows REVOKED, sent by the worker
    app.control.revoke(last.id)
    with pytest.raises(TurnCancelled):
        last.get(timeout=10)
    flower.wait_for(last.id, states.REVOKED)
    [by_worker] = [e for e in flower.events_of(last.id) if e["type"] == "task-revoked"]
    assert by_worker["hostname"].startswith("w1@")
    # When the paused turn is cancelled from this process
    assert cancel_turn(paused.id, reason="customer left") is True
    with pytest.raises(TurnCancelled):
        paused.get(timeout=10)
    # Then Flower shows it REVOKED, sent by the canceller, and the one behind runs to SUCCESS
    flower.wait_for(paused.id, states.REVOKED)
    revoked = [e for e in flower.events_of(paused.id) if e["type"] == "task-revoked"]
    sent = [e for e in revoked if e["hostname"].startswith("agentjobs-cancel@")]
    assert len(sent) == 1, revoked
    # (The wake-up of the paused head sent when `last` ended may reach the worker only after
    # the cancel, on a loaded machine: that delivery finds the turn ended and says so again.)
    assert all(e["hostname"].startswith(("agentjobs-cancel@", "w1@")) for e in revoked), revoked
    assert sent[0]["terminated"] is False and sent[0]["expired"] is False
    assert "customer left" in sent[0]["exception"] and sent[0]["timestamp"] > 0
    assert behind.get(timeout=20)["turnNumber"] == 1
    flower.wait_for(behind.id, states.SUCCESS)
    # and nothing later takes the cancelled turn out of REVOKED
    time.sleep(1)
    assert flower.state_of(paused.id) == states.REVOKED


def test_turns_ended_by_the_pump_show_failure(make_jobs: Any, monitor: Any) -> None:
    jobs = make_jobs(AGENTJOBS_PAUSE_TTL_S="2")
    worker = jobs.worker(extra_args=EVENTS_ON)
    jobs.pump()
    flower = monitor()
    # Given a turn whose tool sleeps far past its 3 s deadline, and a pause nobody decides
    stuck = run_turn.delay(
        agent="demo", conversation_id="fl-dl", message="hang rounds:1 slow:60", deadline_s=3
    )
    undecided = run_turn.delay(agent="demo", conversation_id="fl-pe", message="refund:D-4")
    # Then both are dead-lettered by the pump, and Flower shows FAILURE with the reason
    with pytest.raises(TurnDeadLettered) as overdue:
        stuck.get(timeout=20)
    assert overdue.value.reason == "deadline_exceeded"
    with pytest.raises(TurnDeadLettered) as expired:
        undecided.get(timeout=20)
    assert expired.value.reason == "pause_expired"
    for turn_id, reason in ((stuck.id, "deadline_exceeded"), (undecided.id, "pause_expired")):
        flower.wait_for(turn_id, states.FAILURE)
        assert "task-started" in flower.types_of(turn_id)
        [failed] = [e for e in flower.events_of(turn_id) if e["type"] == "task-failed"]
        assert failed["hostname"].startswith("agentjobs-pump@")
        assert failed["exception"].startswith("TurnDeadLettered(") and reason in failed["exception"]
    worker.kill(signal.SIGKILL)  # its thread is still in the tool


def test_retries_show_as_retry_with_their_count_then_success(make_jobs: Any, monitor: Any) -> None:
    jobs = make_jobs()
    worker = jobs.worker(extra_args=EVENTS_ON)
    jobs.pump()
    flower = monitor()
    # Given a turn whose first two model calls fail with 503
    result = run_turn.delay(agent="demo", conversation_id="fl-r", message="hi fail:503x2")
    assert result.get(timeout=30)["attempts"] == 3
    # Then Flower showed RETRY after each failed attempt, and ends at SUCCESS with 2 retries
    flower.wait_for(result.id, states.SUCCESS)
    types = flower.types_of(result.id)
    assert types.count("task-retried") == 2, types
    assert types[-1] == "task-succeeded", types
    assert flower.task(result.id)["retries"] == 2
    # (a worker started with task events renders the reply in it, as Celery does)
    [succeeded] = [e for e in flower.events_of(result.id) if e["type"] == "task-succeeded"]
    assert "'attempts': 3" in succeeded["result"], succeeded
    retried = [e for e in flower.events_of(result.id) if e["type"] == "task-retried"]
    assert retried[0]["exception"].startswith("waiting: attempt 2 due in ")
    assert "attempt 1 failed: " in retried[0]["exception"]
    received = [e["retries"] for e in flower.events_of(result.id) if e["type"] == "task-received"]
    assert received[0] == 0 and received[-1] == 2, received
    # And the worker's log says what happened without calling the deliveries ignored
    worker.stop()
    log = worker.log()
    assert "attempt 2 in" in log and "attempt 3 in" in log
    assert "ignored" not in log, log[-3000:]


def test_a_stray_delivery_of_an_ended_turn_shows_it_ended(make_jobs: Any, monitor: Any) -> None:
    jobs = make_jobs()
    jobs.worker(extra_args=EVENTS_ON)
    # Given a turn that has ended, and a monitor that started after it ended
    result = run_turn.delay(agent="demo", conversation_id="fl-s", message="hi")
    result.get(timeout=30)
    flower = monitor()
    # When a duplicate wake-up of it reaches a worker
    ending.wake(job_context(), result.id)
    # Then the monitor, which knows the turn from that delivery only, sees it ended
    stray = ["task-received", "task-started", TASK_SUCCEEDED]
    wait_until(
        lambda: flower.types_of(result.id)[-3:] == stray,
        20,
        f"the stray delivery's events (they are {flower.types_of(result.id)})",
    )
    assert flower.state_of(result.id) == states.SUCCESS


def test_an_ending_whose_event_cannot_be_sent_still_ends_the_turn(
    make_jobs: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    make_jobs()  # no worker: the turns stay queued

    def refused(*_: Any, **__: Any) -> Any:
        raise ConnectionError("the broker is away")

    first = run_turn.delay(agent="demo", conversation_id="fl-x1", message="x")
    second = run_turn.delay(agent="demo", conversation_id="fl-x2", message="y")
    # When the broker refuses every publish from here on
    monkeypatch.setattr(app, "producer_or_acquire", refused)
    monkeypatch.setattr(results._Trouble, "failing", False)
    with caplog.at_level(logging.DEBUG, logger="agentjobs.results"):
        assert cancel_turn(first.id) is True
        assert cancel_turn(second.id) is True
    for one in (first, second):
        with pytest.raises(TurnCancelled):
            one.get(timeout=5)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    assert "could not send its task-revoked event" in warnings[0].getMessage()


def test_celery_logs_a_task_that_raised_ignore_at_debug() -> None:
    policy = trace.get_log_policy(None, None, Ignore())
    assert policy.severity == logging.DEBUG and policy.description == "ignored"
