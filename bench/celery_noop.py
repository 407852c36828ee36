"""The baseline of bench/throughput.py: a bare Celery app with Celery's defaults plus the two
settings any durable job needs (acks_late, prefetch 1), on the Redis at REDIS_URL."""

from __future__ import annotations

import os
import time

from celery import Celery

app = Celery("bench", broker=os.environ["REDIS_URL"], backend=os.environ["REDIS_URL"])
app.conf.update(task_acks_late=True, worker_prefetch_multiplier=1)


@app.task(name="bench.noop")  # type: ignore[untyped-decorator]
def noop() -> dict[str, int]:
    return {"ok": 1}


@app.task(name="bench.sleep")  # type: ignore[untyped-decorator]
def sleep(seconds: float) -> dict[str, int]:
    time.sleep(seconds)
    return {"ok": 1}


@app.task(name="bench.agent_in_memory")  # type: ignore[untyped-decorator]
def agent_in_memory(agent: str, message: str) -> dict[str, object]:
    """The bench's agent run in memory, as a bare Celery task: what a turn costs without the
    job system (no record, no journal, no progress, no conversation store)."""
    from bench import agents

    result = getattr(agents, f"build_{agent}_agent")().run(message)
    return {"content": result.content, "turnNumber": result.turn_number}
