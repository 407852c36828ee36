"""The pump: the one process that turns time into messages (Procfile `pump`).

Each tick it wakes (publishes resume_turn for):
- retries whose backoff is over (they wait in Redis, not in a worker's memory, so a killed
  worker loses none);
- running turns whose lease ran out (their worker died: the turn resumes from its last
  persisted iteration);
- queued turns at the head of their conversation that nobody started for stall_after_s (their
  message went down with a worker, or was never published).
Several pumps may run: each due entry is taken atomically and pushed back in time before it is
published, so it is woken once per interval at most. A wake-up that finds nothing to do is
dropped by the worker.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass

import orjson
import redis
from celery import states

from tasks.app import app
from tasks.context import JobContext, job_context
from tasks.errors import TurnDeadLettered
from tasks.records import now_ms
from tasks.redact import RedactingFilter
from tasks.turns import wake

logger = logging.getLogger("agentjobs.pump")
BATCH = 500


@dataclass(frozen=True)
class Tick:
    retries: int = 0
    expired: int = 0
    stalled: int = 0
    results: int = 0


def confirm_results(ctx: JobContext, now: int) -> int:
    """Write the Celery result of ended turns that lack one; returns how many were written.

    A worker stores a turn's result moments after the turn ends. Past result_grace_s the pump
    checks that it is there, and writes it from the turn record if the worker could not (Redis
    was restarting, or the worker was killed between the two writes), so result.get() returns.
    """
    records, keys = ctx.records, ctx.keys
    backend = app.backend
    grace_ms = int(ctx.settings.result_grace_s * 1000)
    written = 0
    for turn_id in records.take_due(
        keys.finished, before_ms=now - grace_ms, limit=BATCH, bump_ms=grace_ms
    ):
        if not backend.client.exists(backend.get_key_for_task(turn_id)):
            record = records.get(turn_id)
            if record is not None and record.state == "succeeded":
                backend.store_result(turn_id, orjson.loads(record.get("result")), states.SUCCESS)
                written += 1
            elif record is not None and record.state == "dead_lettered":
                entry = ctx.dead_letters.get(record.get("dlq_id")) or {}
                error = TurnDeadLettered(
                    record.get("dlq_id"), record.get("reason"), str(entry.get("error", ""))
                )
                backend.mark_as_failure(turn_id, error)
                written += 1
        ctx.redis.zrem(keys.finished, turn_id)
    return written


def pump_once(ctx: JobContext) -> Tick:
    records, keys, settings = ctx.records, ctx.keys, ctx.settings
    now = now_ms()
    lease_ms = int(settings.lease_ttl_s * 1000)
    stall_ms = int(settings.stall_after_s * 1000)
    due = records.take_due(keys.retries, before_ms=now, limit=BATCH, bump_ms=stall_ms)
    for turn_id in due:
        wake(turn_id)
    expired = 0
    for turn_id in records.take_due(keys.running, before_ms=now, limit=BATCH, bump_ms=lease_ms):
        record = records.get(turn_id)
        if record is None or record.state != "running":
            ctx.redis.zrem(keys.running, turn_id)
            continue
        if records.lease_holder(record.namespace) == turn_id:
            continue  # its heartbeat is late but the lease still stands
        logger.warning("turn %s lost its worker; waking it to resume", turn_id)
        wake(turn_id, record.namespace)
        expired += 1
    stalled = 0
    for turn_id in records.take_due(
        keys.pending, before_ms=now - stall_ms, limit=BATCH, bump_ms=stall_ms
    ):
        record = records.get(turn_id)
        if record is None or record.state != "queued":
            ctx.redis.zrem(keys.pending, turn_id)
            continue
        at_head = records.conversation_head(record.namespace) == turn_id
        if (not record.namespace or at_head) and records.lease_holder(record.namespace) is None:
            wake(turn_id, record.namespace)
            stalled += 1
    results = confirm_results(ctx, now)
    return Tick(retries=len(due), expired=expired, stalled=stalled, results=results)


def run_pump(ctx: JobContext | None = None, *, stop: threading.Event | None = None) -> None:
    ctx = ctx or job_context()
    stop = stop or threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        if threading.current_thread() is threading.main_thread():
            signal.signal(signum, lambda *_: stop.set())
    logger.info("pump started (every %.2f s)", ctx.settings.pump_interval_s)
    while not stop.is_set():
        started = time.monotonic()
        try:
            tick = pump_once(ctx)
            if tick.retries or tick.expired or tick.stalled or tick.results:
                logger.info(
                    "woke %d due retries, %d turns of dead workers, %d stalled turns; "
                    "wrote %d missing results",
                    tick.retries,
                    tick.expired,
                    tick.stalled,
                    tick.results,
                )
        except redis.RedisError:
            logger.warning("pump: Redis unavailable, trying again", exc_info=True)
            stop.wait(1.0)
        stop.wait(max(0.0, ctx.settings.pump_interval_s - (time.monotonic() - started)))
    logger.info("pump stopped")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactingFilter())
    run_pump()


if __name__ == "__main__":
    main()
