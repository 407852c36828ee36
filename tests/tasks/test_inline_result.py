"""A succeeded turn's Celery result comes from the script that ends the turn when the result
backend is the state Redis: once, in the backend's own format, and Celery does not read and
write it again after the task returns."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import orjson
import pytest
import redis
from celery import states
from celery.backends.redis import RedisBackend, SentinelBackend
from celery.result import AsyncResult

from tasks import app, run_turn, turn_status
from tasks.core.namespaces import namespace_for
from tasks.queue import results
from tasks.queue.context import job_context


def test_the_result_is_published_once_in_celerys_format(make_jobs: Any) -> None:
    jobs = make_jobs()
    jobs.worker()
    turn_id = str(uuid.uuid4())
    key = app.backend.get_key_for_task(turn_id).decode()
    published: list[bytes] = []
    subscriber = jobs.redis.pubsub()
    subscriber.subscribe(key)
    done = threading.Event()
    # Every command on the result's key, with who sent it ('lua' for a script's).
    commands: list[tuple[str, str]] = []

    def listen() -> None:
        while not done.is_set():
            message = subscriber.get_message(timeout=0.1)
            if message and message["type"] == "message":
                published.append(message["data"])

    def watch() -> None:
        with jobs.redis.monitor() as monitor:
            for command in monitor.listen():
                if done.is_set():
                    return
                if key in command["command"]:
                    commands.append((command["command"].split()[0], command["client_type"]))

    listener = threading.Thread(target=listen)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    listener.start()
    try:
        # Given a turn that succeeds, watched through its status (result.get() would read the
        # result's key itself)
        run_turn.apply_async(
            kwargs={"agent": "demo", "conversation_id": "c-inline", "message": "hi"},
            task_id=turn_id,
        )
        deadline = time.monotonic() + 30
        while turn_status(turn_id).state != "succeeded":
            assert time.monotonic() < deadline, turn_status(turn_id)
            time.sleep(0.05)
        # When its worker has had time to write anything more
        time.sleep(1.0)
        jobs.redis.ping()  # one more command for the watcher to wake on
    finally:
        done.set()
        listener.join()
        subscriber.close()
    watcher.join(timeout=5)
    # Then its result was written once, inside the script that ended the turn, and nobody
    # read it back first (this process only subscribed to it)
    # (the script's first EVALSHA in a worker may come back NOSCRIPT, then run again)
    seen = [(verb.upper(), who) for verb, who in commands if "SUBSCRIBE" not in verb.upper()]
    assert [pair for pair in seen if pair != ("EVALSHA", "tcp")] == [
        ("SET", "lua"),
        ("PUBLISH", "lua"),
    ], commands
    assert len(published) == 1, published
    reply = AsyncResult(turn_id, app=app).get(timeout=5)
    stored = jobs.redis.get(key)
    assert stored == published[0]
    meta = orjson.loads(stored)
    assert meta["status"] == states.SUCCESS and meta["result"] == reply
    assert meta["task_id"] == turn_id and meta["traceback"] is None
    assert meta["children"] == [] and meta["date_done"]
    # in the fields Celery's own backend writes, with the results' expiry
    assert set(meta) == set(celery_meta(turn_id, reply))
    ttl = jobs.redis.ttl(key)
    assert 0 < ttl <= job_context().settings.record_ttl_s
    # and the pump has nothing to confirm of it
    shard = job_context().keys.for_namespace(namespace_for("c-inline", None))
    assert jobs.redis.zscore(shard.finished, turn_id) is None


def celery_meta(turn_id: str, reply: Any) -> dict[str, Any]:
    meta = app.backend._get_result_meta(
        result=reply, state=states.SUCCESS, traceback=None, request=None
    )
    return {**meta, "task_id": turn_id}


URL = "redis://127.0.0.1:6390/2"


def backend(url: str, cls: type[RedisBackend] = RedisBackend) -> RedisBackend:
    return cls(app=app, url=url)


@pytest.mark.parametrize(
    ("backend_url", "same"),
    [
        (URL, True),
        ("redis://127.0.0.1:6390/3", False),  # another database
        ("redis://127.0.0.1:6391/2", False),  # another server
        ("redis://localhost:6390/2", False),  # the same, maybe: not written inline
        ("redis://other:secret@127.0.0.1:6390/2", False),  # another user
        ("rediss://127.0.0.1:6390/2?ssl_cert_reqs=required", False),  # another connection
    ],
)
def test_only_the_state_redis_itself_gets_the_result_inline(backend_url: str, same: bool) -> None:
    client = redis.Redis.from_url(URL)
    assert results._same_redis(backend(backend_url), client) is same


def test_no_result_is_written_inline_through_sentinel_or_into_a_cluster() -> None:
    client = redis.Redis.from_url(URL)
    sentinel = backend("sentinel://127.0.0.1:26390/2", SentinelBackend)
    assert results._same_redis(sentinel, client) is False
    cluster = redis.RedisCluster.__new__(redis.RedisCluster)  # never connects
    assert results._same_redis(backend(URL), cluster) is False


def test_the_meta_built_here_is_celerys_own_but_for_its_time() -> None:
    reply = {"conversationId": "c", "turnNumber": 2, "content": "é \u2028 ok", "attempts": 1}
    ours = orjson.loads(results._success_meta(app.backend, "t-9", reply))
    theirs = orjson.loads(app.backend.encode(celery_meta("t-9", reply)))
    assert list(ours) == list(theirs)
    assert {**ours, "date_done": None} == {**theirs, "date_done": None}
    assert ours["date_done"][:16] == theirs["date_done"][:16]  # the same minute, zone and format
