"""A worker holds a stamped turn wake-up in its memory only: kombu's Redis transport writes no
unacked record for it and its ack writes nothing (tasks/queue/broker.py). A message without the
stamp (sent around run_turn.delay) keeps kombu's record, and so does every message with
AGENTJOBS_UNACKED_WAKEUPS=1. What wakes a turn whose message was lost with its worker is the
pump (tests/tasks/test_recovery.py, test_crash_safety.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import redis
from kombu import Connection, Exchange, Queue

from tasks import app, run_turn
from tasks.queue import broker
from tasks.queue.context import job_context
from tasks.store.client import STAMP_HEADER
from tasks.store.records import TurnState
from tasks.testing import RedisServer, wait_until

# A turn that stays running for a while: one tool round whose call takes 3 s.
SLOW = "where is my order? rounds:1 slow:3"
UNACKED = "unacked"  # kombu's hash of unacked messages, by delivery tag


def _running(turn_id: str) -> bool:
    record = job_context().records.get(turn_id)
    return record is not None and record.state is TurnState.RUNNING


def _unacked_tasks(client: redis.Redis) -> list[str]:
    """The task ids of the messages kombu holds as unacked."""
    ids = []
    for raw in client.hvals(UNACKED):
        message = orjson.loads(raw)[0]
        ids.append(message["headers"]["id"])
    return ids


@pytest.mark.integration
def test_a_running_turns_message_has_no_unacked_record_and_an_unstamped_one_has(
    make_jobs: Any,
) -> None:
    jobs = make_jobs()
    jobs.worker()
    # Given a turn submitted with run_turn.delay (stamped) and one sent around it (not)
    stamped = run_turn.delay(agent="demo", conversation_id="held-stamped", message=SLOW)
    unstamped = app.send_task(
        "tasks.run_turn",
        kwargs={"agent": "demo", "conversation_id": "held-unstamped", "message": SLOW},
    )
    # When both are running on the worker
    wait_until(lambda: _running(stamped.id) and _running(unstamped.id), 30, "both to run")
    # Then kombu records only the unstamped one as unacked
    assert _unacked_tasks(jobs.redis) == [unstamped.id]
    # And both end, with nothing left unacked
    assert stamped.get(timeout=30)["content"] == f"Done: {SLOW}"
    assert unstamped.get(timeout=30)["content"] == f"Done: {SLOW}"
    wait_until(lambda: jobs.redis.hlen(UNACKED) == 0, 10, "the unstamped message's ack")
    assert jobs.redis.zcard("unacked_index") == 0


@pytest.mark.integration
def test_unacked_wakeups_keeps_kombus_record_for_every_message(make_jobs: Any) -> None:
    jobs = make_jobs(AGENTJOBS_UNACKED_WAKEUPS="1")
    jobs.worker()
    result = run_turn.delay(agent="demo", conversation_id="held-recorded", message=SLOW)
    wait_until(lambda: _running(result.id), 30, "the turn to run")
    assert _unacked_tasks(jobs.redis) == [result.id]
    assert result.get(timeout=30)["content"] == f"Done: {SLOW}"
    wait_until(lambda: jobs.redis.hlen(UNACKED) == 0, 10, "its ack")


# -- kombu's Redis channel, directly -------------------------------------------------------------

QUEUE = "wakeups-in-memory"


@pytest.fixture
def channel(redis_server: RedisServer) -> Iterator[Any]:
    redis.Redis.from_url(redis_server.url).flushdb()
    broker.hold_wakeups_in_memory(True)
    try:
        with Connection(redis_server.url) as connection:
            channel = connection.channel()
            Queue(QUEUE, Exchange(QUEUE, type="direct"), routing_key=QUEUE)(channel).declare()
            yield channel
            channel.close()
    finally:
        broker.hold_wakeups_in_memory(False)


def _publish(channel: Any, body: dict[str, int], stamped: bool) -> None:
    headers = {STAMP_HEADER: {"epoch": "e"}} if stamped else {}
    producer = channel.connection.client.Producer(channel)
    producer.publish(body, exchange=QUEUE, routing_key=QUEUE, headers=headers)


def test_held_deliveries_count_toward_prefetch_and_write_nothing(channel: Any) -> None:
    client = redis.Redis(connection_pool=channel.pool)
    channel.basic_qos(prefetch_count=2)
    for i in range(3):
        _publish(channel, {"i": i}, stamped=True)
    first = channel.basic_get(QUEUE, no_ack=False)
    second = channel.basic_get(QUEUE, no_ack=False)
    # Held in memory: no unacked record, and the prefetch limit counts them
    assert client.hlen(channel.unacked_key) == 0
    assert client.zcard(channel.unacked_index_key) == 0
    assert not channel.qos.can_consume()
    channel.basic_ack(first.delivery_tag)
    assert channel.qos.can_consume()
    # A requeueing reject puts the message back on its queue from memory, where kombu's own
    # reject puts it (LPUSH: behind the message waiting there)
    channel.basic_reject(second.delivery_tag, requeue=True)
    assert client.llen(QUEUE) == 2
    waiting = channel.basic_get(QUEUE, no_ack=False)
    again = channel.basic_get(QUEUE, no_ack=False)
    assert (waiting.payload, again.payload) == ({"i": 2}, {"i": 1})
    assert again.headers["redelivered"]
    channel.basic_ack(waiting.delivery_tag)
    channel.basic_reject(again.delivery_tag, requeue=False)
    assert client.llen(QUEUE) == 0
    assert client.hlen(channel.unacked_key) == 0
    assert channel.qos.can_consume()


def test_an_unstamped_delivery_keeps_kombus_record(channel: Any) -> None:
    client = redis.Redis(connection_pool=channel.pool)
    _publish(channel, {"i": 0}, stamped=False)
    message = channel.basic_get(QUEUE, no_ack=False)
    assert client.hlen(channel.unacked_key) == 1
    channel.basic_ack(message.delivery_tag)
    assert client.hlen(channel.unacked_key) == 0
