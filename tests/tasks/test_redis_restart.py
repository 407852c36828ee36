"""A Redis restart under busy workers: the workers reconnect instead of exiting, and the turn
that was running when Redis went away still ends exactly once."""

from __future__ import annotations

from typing import Any

import pytest

from tasks import load_conversation, run_turn
from tasks.queue.context import job_context
from tasks.testing import RedisServer, wait_until
from tests.tasks.conftest import drop_client_connections


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_workers_survive_a_redis_restart_mid_turn(
    make_jobs: Any, redis_server: RedisServer, pool: str
) -> None:
    jobs = make_jobs()
    worker = jobs.worker(pool=pool, concurrency=4)
    jobs.pump()
    result = run_turn.delay(agent="demo", conversation_id="c1", message="hi rounds:2 slow:1.5")
    records = job_context().records
    wait_until(
        lambda: (r := records.get(result.id)) is not None and r.iteration == 2,
        20,
        "the turn to reach its second round",
    )

    redis_server.restart()
    drop_client_connections()

    assert result.get(timeout=60)["content"] == "Done: hi rounds:2 slow:1.5"
    stored = load_conversation("c1")
    assert stored is not None
    assert [m["role"] for m in stored.history] == ["user"] + ["assistant", "tool"] * 2 + [
        "assistant"
    ]
    after = run_turn.delay(agent="demo", conversation_id="c2", message="after the restart")
    assert after.get(timeout=30)["content"] == "Done: after the restart"
    assert worker.alive(), f"the worker exited:\n{worker.log()[-3000:]}"
    assert "Unrecoverable error" not in worker.log()
