"""Queued turns whose message was lost are woken again after AGENTJOBS_STALL_AFTER_S; turns
that merely wait behind a backlog in the broker are not, so a slow drain is never made
slower by duplicate wake-ups."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest

from tasks import app, run_turn
from tasks.queue.context import job_context
from tasks.testing import wait_until

pytestmark = pytest.mark.integration
STALL_S = 3  # tests/tasks/conftest.py


def test_a_turn_whose_message_was_never_published_is_woken_after_the_stall(jobs: Any) -> None:
    # Given a turn registered as run_turn.delay does, whose client died before publishing
    kwargs = {"agent": "demo", "conversation_id": "c-lost", "message": "hello"}
    job_context().records.register(
        "lost-1",
        payload=orjson.dumps(kwargs),
        agent="demo",
        conversation_id="c-lost",
        namespace="_/_/c-lost",
    )
    registered_at = time.monotonic()
    # When the pump finds it at the head of its conversation, unstarted, past the stall
    reply = app.AsyncResult("lost-1").get(timeout=STALL_S + 15)
    # Then it ran, once, no earlier than the stall timeout
    assert reply["content"].startswith("Done: hello")
    assert time.monotonic() - registered_at >= STALL_S - 0.5
    record = job_context().records.get("lost-1")
    assert record is not None and record.deliveries == 1


def test_turns_waiting_behind_a_backlog_get_no_duplicate_wake_ups(make_jobs: Any) -> None:
    # Given 30 submitted turns and a pump, but no worker yet: the broker holds them all
    jobs = make_jobs()
    jobs.pump()
    results = [
        run_turn.delay(agent="demo", conversation_id=f"c-b{n}", message="hi") for n in range(30)
    ]
    retry_queue = job_context().settings.retry_queue
    # When they stay queued for two stall timeouts
    time.sleep(2 * STALL_S + 1)
    # Then the pump published no wake-up for them: their messages are in the broker
    assert jobs.redis.llen(retry_queue) == 0
    # And once a worker comes, each runs once
    jobs.worker()
    for result in results:
        result.get(timeout=60)
    records = job_context().records
    assert all(records.get(r.id).deliveries == 1 for r in results)  # type: ignore[union-attr]
    wait_until(lambda: jobs.redis.llen(retry_queue) == 0, 10, "an empty retry queue")
