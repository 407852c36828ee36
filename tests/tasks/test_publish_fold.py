"""A submission registers its turn and pushes its message in one step when the broker is the
state store's Redis (tasks/queue/broker.py, PublishFold); kombu pushes the message itself, after
the registration, where it would not push it as one LPUSH."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from tasks import app, run_turn, turn_status
from tasks.core.schema import Registered
from tasks.queue import broker
from tasks.queue.context import job_context


def test_a_submission_records_its_turn_and_queues_its_message_in_one_script(
    make_jobs: Any,
) -> None:
    jobs = make_jobs()
    assert job_context().folds_publish
    # Every command the server runs, with who sent it ('lua' for a script's).
    commands: list[tuple[str, str]] = []
    watching = threading.Event()
    done = threading.Event()

    def watch() -> None:
        with jobs.redis.monitor() as monitor:
            watching.set()
            for command in monitor.listen():
                if done.is_set():
                    return
                words = command["command"].split()
                commands.append((words[0].upper() if words else "", command["client_type"]))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    watching.wait(5)
    # Given a turn submitted with no worker running
    result = run_turn.delay(agent="demo", conversation_id="c-fold", message="hi")
    jobs.redis.ping()
    done.set()
    jobs.redis.ping()  # (wakes the monitor up to see `done`)
    watcher.join(5)
    # Then its message was pushed by the script that recorded it, not by a command of its own
    pushes = [who for name, who in commands if name == "LPUSH"]
    assert pushes == ["lua"], commands
    assert jobs.redis.llen(app.conf.task_default_queue) == 1
    assert turn_status(result.id).state == "queued"
    # And a worker runs it from that message
    jobs.worker()
    assert result.get(timeout=30)["content"]


class Channel:
    """What _put reads of a kombu Redis channel, when it does not fold."""

    global_keyprefix = "app:"
    _expires: ClassVar[dict[str, int]] = {}


def test_a_push_kombu_would_not_make_as_one_lpush_follows_the_registration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    steps: list[str] = []

    def register(publish: tuple[str, bytes] | None) -> Registered:
        steps.append(f"register {publish}")
        return Registered.CREATED

    monkeypatch.setattr(broker, "_redis_put", lambda *a, **kw: steps.append("kombu push"))
    fold = broker.PublishFold(SimpleNamespace(), register)
    token = broker.FOLD.set(fold)
    try:
        # Given a channel with a global key prefix (kombu prefixes each key in its client)
        broker._put(Channel(), "celery", {"body": ""})
        # and kombu calling again after a connection error
        broker._put(Channel(), "celery", {"body": ""})
    finally:
        broker.FOLD.reset(token)
    # Then the turn was registered once, without a message, and kombu pushed each time
    assert steps == ["register None", "kombu push", "kombu push"]
    assert fold.outcome is Registered.CREATED


def test_a_held_or_refused_registration_is_not_pushed(monkeypatch: pytest.MonkeyPatch) -> None:
    pushed: list[Any] = []
    monkeypatch.setattr(broker, "_redis_put", lambda *a, **kw: pushed.append(a))
    for outcome in (Registered.HELD, Registered.CONFLICT):
        fold = broker.PublishFold(SimpleNamespace(), lambda publish, o=outcome: o)
        token = broker.FOLD.set(fold)
        try:
            broker._put(Channel(), "celery", {"body": ""})
        finally:
            broker.FOLD.reset(token)
        assert fold.outcome is outcome
    assert pushed == []
