"""A kombu Redis channel builds one redis.Redis client for its publishes, unacked records and
acks, not one per call (tasks/queue/workarounds.py), and builds another only when its pool is
replaced or the channel is closed and opened again."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu import Connection, Exchange, Queue

import tasks.queue.app  # noqa: F401  (installs the patches, as every process of ours does)
from tasks.testing import RedisServer

QUEUE = "client-reuse"


class Built:
    """Counts the redis.Redis clients built (kombu's Client is redis.Redis or a subclass)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        init = redis.Redis.__init__

        def counting(client: Any, *args: Any, **kwargs: Any) -> None:
            self.count += 1
            init(client, *args, **kwargs)

        monkeypatch.setattr(redis.Redis, "__init__", counting)


@pytest.fixture
def connection(redis_server: RedisServer) -> Iterator[Any]:
    redis.Redis.from_url(redis_server.url).flushdb()
    with Connection(redis_server.url) as conn:
        yield conn


def _declare(channel: Any) -> Queue:
    queue = Queue(QUEUE, Exchange(QUEUE, type="direct"), routing_key=QUEUE)
    queue(channel).declare()
    return queue


def test_publishes_deliveries_and_acks_share_one_client(
    connection: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    channel = connection.channel()
    _declare(channel)
    producer = connection.Producer(channel)
    built = Built(monkeypatch)
    n = 50
    for i in range(n):
        producer.publish({"i": i}, exchange=QUEUE, routing_key=QUEUE)
    received = []
    for _ in range(n):
        message = channel.basic_get(QUEUE, no_ack=False)  # records it as unacked (QoS.append)
        assert message is not None
        received.append(message)
    for message in received[: n // 2]:
        channel.basic_ack(message.delivery_tag)
    for message in received[n // 2 :]:
        channel.basic_reject(message.delivery_tag, requeue=False)

    # kombu alone builds one per publish, per unacked record and per ack or reject: 3n.
    assert built.count <= 1
    assert sorted(m.payload["i"] for m in received) == list(range(n))
    client = redis.Redis(connection_pool=channel.pool)
    assert client.zcard(channel.unacked_index_key) == 0
    assert client.hlen(channel.unacked_key) == 0
    channel.close()


def test_threads_publish_on_one_channel(connection: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # A threads-pool worker publishes from its task threads on the one producer channel.
    channel = connection.channel()
    _declare(channel)
    producer = connection.Producer(channel)
    built = Built(monkeypatch)
    threads, each = 8, 100
    start = threading.Barrier(threads)
    failures: list[BaseException] = []

    def publish(t: int) -> None:
        start.wait()
        try:
            for i in range(each):
                producer.publish({"t": t, "i": i}, exchange=QUEUE, routing_key=QUEUE)
        except BaseException as exc:
            failures.append(exc)

    workers = [threading.Thread(target=publish, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()

    assert failures == []
    # At most one per thread, when they race on the first publish; kombu alone: 800.
    assert built.count <= threads
    assert redis.Redis(connection_pool=channel.pool).llen(QUEUE) == threads * each
    channel.close()


def test_a_new_pool_or_channel_gets_a_new_client(connection: Any) -> None:
    channel = connection.channel()
    with channel.conn_or_acquire() as first, channel.conn_or_acquire() as again:
        assert first is again
        assert first.connection_pool is channel.pool
    passed = redis.Redis(connection_pool=channel.pool)
    with channel.conn_or_acquire(passed) as given:
        assert given is passed

    # What kombu does after a fork: drop the pools; the next call builds a pool and a client.
    channel._disconnect_pools()
    with channel.conn_or_acquire() as after:
        assert after is not first
        assert after.connection_pool is channel._pool
        assert after.ping()
    channel.close()

    # After a connection error kombu closes the channel and opens another.
    other = connection.channel()
    with other.conn_or_acquire() as theirs:
        assert theirs is not after
        assert theirs.connection_pool is other.pool
        assert theirs.ping()
    other.close()


def test_a_detached_channel_refuses_instead_of_reusing(connection: Any) -> None:
    # Celery detaches a channel from its connection when the connection is lost; its pools
    # were dropped with it. The kept client must not stand in for the pool it no longer has.
    channel = connection.channel()
    with channel.conn_or_acquire() as client:
        assert client.ping()
    channel._disconnect_pools()
    transport = channel.connection
    conninfo, transport.client = transport.client, None
    try:
        with pytest.raises(redis.exceptions.ConnectionError), channel.conn_or_acquire():
            pass
    finally:
        transport.client = conninfo
    channel.close()
