"""Redis refusing writes (maxmemory reached under noeviction) under busy workers: the worker
main process lives through it and consumes on once writes are accepted, every turn running
during the refusal ends exactly once, and a submission during it fails at once, recording
nothing."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tasks import TurnState, iter_events, load_conversation, run_turn, turn_status
from tasks.queue.context import job_context
from tasks.testing import RedisServer, wait_until

# Two lease lifetimes of the test settings (AGENTJOBS_LEASE_TTL_S=3): the leases of the turns
# running when writes were refused run out during the refusal.
REFUSAL_S = 6.0
MESSAGE = "hi rounds:3 slow:1"


@contextlib.contextmanager
def writes_refused(server: RedisServer) -> Iterator[redis.Redis]:
    """Redis over its maxmemory (1 byte, so any write that may grow memory is refused) until
    the block ends; reads keep working. On a connection of its own: CONFIG SET is allowed."""
    admin = redis.Redis.from_url(server.url)
    previous = admin.config_get("maxmemory*")
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", "1")
    try:
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            admin.set("probe", "refused")
        yield admin
    finally:
        admin.config_set("maxmemory", previous["maxmemory"])
        admin.config_set("maxmemory-policy", previous["maxmemory-policy"])
        admin.close()


def _terminal_events(turn_id: str) -> list[str]:
    return [e.type for e in iter_events(turn_id, block_s=0) if e.type.startswith("turn.")]


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_workers_live_through_refused_writes_and_turns_end_once(
    make_jobs: Any, redis_server: RedisServer, pool: str
) -> None:
    jobs = make_jobs()
    worker = jobs.worker(pool=pool, concurrency=4)
    jobs.pump()
    # Four turns run (one per thread) and two wait in the broker: during the refusal the
    # worker takes those two without being able to record their delivery.
    results = [
        run_turn.delay(agent="demo", conversation_id=f"c{i}", message=MESSAGE) for i in range(6)
    ]
    records = job_context().records

    def running() -> int:
        return sum(
            (r := records.get(x.id)) is not None and r.state is TurnState.RUNNING for x in results
        )

    wait_until(lambda: running() == 4, 20, "four turns to start")

    with writes_refused(redis_server):
        refused_at = time.monotonic()
        started = time.monotonic()
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            run_turn.apply_async(
                kwargs={"agent": "demo", "conversation_id": "late", "message": "refused"},
                task_id="refused-turn",
            )
        assert time.monotonic() - started < 2, "a refused submission must fail, not wait"
        time.sleep(REFUSAL_S)
        assert worker.alive(), f"the worker exited:\n{worker.log()[-3000:]}"
    freed_at = time.monotonic()

    for result in results:
        assert result.get(timeout=60)["content"] == f"Done: {MESSAGE}"
    recovered_s = time.monotonic() - freed_at
    for index, result in enumerate(results):
        status = turn_status(result.id)
        assert status is not None and status.state is TurnState.SUCCEEDED
        assert _terminal_events(result.id)[-1:] == ["turn.succeeded"]
        assert _terminal_events(result.id).count("turn.succeeded") == 1
        stored = load_conversation(f"c{index}")
        assert stored is not None
        assert [m["role"] for m in stored.history] == ["user"] + ["assistant", "tool"] * 3 + [
            "assistant"
        ]
    # The refused submission recorded nothing: the same id is free for the same request.
    assert turn_status("refused-turn") is None
    assert load_conversation("late") is None

    after = run_turn.delay(agent="demo", conversation_id="after", message="after the refusal")
    assert after.get(timeout=30)["content"] == "Done: after the refusal"
    assert worker.alive(), f"the worker exited:\n{worker.log()[-3000:]}"
    log = worker.log()
    assert "Unrecoverable error" not in log
    assert log.count("broker: Redis refuses writes") <= 1
    assert log.count("worker heartbeat failed") <= 1
    print(
        f"writes refused for {freed_at - refused_at:.1f} s; "
        f"turns ended {recovered_s:.1f} s after they were accepted again"
    )
