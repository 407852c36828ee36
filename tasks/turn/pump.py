"""The pump: the one process that turns time into messages (Procfile `pump`).

Each tick, shard by shard, it wakes (publishes resume_turn for):
- retries whose backoff is over (they wait in Redis, not in a worker's memory, so a killed
  worker loses none);
- running turns whose lease ran out (their worker died: the turn resumes from its last
  persisted iteration);
- queued turns at the head of their conversation that nobody started for stall_after_s (their
  message was never published, or went down with a broker);
and, once per tick, the prefetched turns of workers whose heartbeat stopped (tasks/turn/worker.py).
It dead-letters turns past their deadline and paused turns past their pause TTL.
It also writes the Celery result of ended turns whose worker could not, and removes the
streamed text (token.delta events) of turns that ended AGENTJOBS_TOKEN_TTL_S ago.
Several pumps may run: each due entry is taken atomically and pushed back in time before it is
published, so it is woken once per interval at most. Every time is the Redis server's.

**The probe.** Each of those lives in a time index of its shard (tasks/core/keys.py: seven per
shard, AGENTJOBS_INDEX_SHARDS shards). A tick first asks them all at once
(tasks/store/lua/due_probe.lua, TurnRecords.due_indices): one script per Redis node reads the
lowest score of each index the node holds against the server's clock, less the index's lag
(time_indices: the stall interval for queued turns, the result grace for ended ones), and
answers the indices where something is due; the tick takes (take_due) from those alone, in the
order it always did. An idle tick costs one script on one Redis (plain or Sentinel), one per
node on a Cluster, whatever the shard count, where it cost one take_due per index (112 with 16
shards). Each index is still asked once a tick with the same lag, so what falls due after a
probe is found by the next tick's, as take_due found it before; take_due still reads the
server's clock itself and takes atomically, so the probe only spares calls. A cluster node
whose probe fails has all its indices swept as before.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import threading
import time
from collections.abc import Container, Mapping
from dataclasses import astuple, dataclass
from types import MappingProxyType
from typing import Any

import orjson
import redis
from kombu.exceptions import ChannelError

from tasks.core.errors import DeadlineExceeded, PauseExpired, Reason
from tasks.core.keys import Keys, ShardKeys
from tasks.core.redact import log_redacted
from tasks.queue.app import app
from tasks.queue.context import JobContext, job_context
from tasks.queue.results import has_final_result, write_final_result
from tasks.store.pending import pending_actions
from tasks.store.records import Due, TurnState
from tasks.turn import ending
from tasks.turn.fairness import pump_gate

logger = logging.getLogger("agentjobs.pump")
BATCH = 500


@dataclass(frozen=True)
class Tick:
    retries: int = 0
    expired: int = 0
    stalled: int = 0
    orphaned: int = 0
    results: int = 0
    overdue: int = 0
    expired_pauses: int = 0
    released: int = 0  # held turns the fairness gate admitted (tasks/turn/fairness.py)

    def __add__(self, other: Tick) -> Tick:
        return Tick(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    def __bool__(self) -> bool:
        return any(astuple(self))


def time_indices(ctx: JobContext) -> Mapping[str, int]:
    """Every shard's time indices, each with the lag (ms) by which a member's score must be
    behind the server's clock for it to be due: the stall interval for queued turns, the
    result grace for ended ones, none for the others. The probe asks with the lags the sweeps
    below take with."""
    stall_ms = int(ctx.settings.stall_after_s * 1000)
    grace_ms = int(ctx.settings.result_grace_s * 1000)
    return _time_indices(ctx.keys, stall_ms, grace_ms)


@functools.cache
def _time_indices(keys: Keys, stall_ms: int, grace_ms: int) -> Mapping[str, int]:
    """Built once: the same keys every tick."""
    indices: dict[str, int] = {}
    for shard in keys.all_shards():
        indices.update(
            {
                shard.deadlines: 0,
                shard.pauses: 0,
                shard.retries: 0,
                shard.running: 0,
                shard.pending: stall_ms,
                shard.finished: grace_ms,
                shard.tokens: 0,
            }
        )
    return MappingProxyType(indices)


def confirm_results(ctx: JobContext, shard: ShardKeys) -> int:
    """Write the Celery result of ended turns that lack one; returns how many were written.

    A worker stores a turn's result moments after the turn ends. Past result_grace_s the pump
    checks that it is there, and writes it from the turn record if the worker could not (Redis
    was restarting, or the worker was killed between the two writes), so result.get() returns.
    Any Celery result backend: it only asks the backend for the task's state.
    """
    grace_ms = int(ctx.settings.result_grace_s * 1000)

    def confirm(due: Due) -> int:
        written = 0
        if not has_final_result(due.turn_id):
            written = int(write_final_result(ctx, due.turn_id, due.namespace))
        ctx.redis.zrem(shard.finished, due.turn_id)
        return written

    ended = ctx.records.take_due(
        shard, shard.finished, limit=BATCH, bump_ms=grace_ms, lag_ms=grace_ms
    )
    return ctx.records.sweep(ended, confirm)


class BrokerBacklog:
    """Whether the turn and retry queues hold messages no worker has taken yet.

    A queued turn that nobody started for stall_after_s is woken again on the guess that its
    message was lost. While the broker still holds messages the guess is wrong (the workers
    are behind, not short of a message), and waking every stalled turn would pile duplicates
    onto the very backlog that delayed them, so the pump leaves them be until it drains.
    """

    def __init__(self, queues: tuple[str, ...]) -> None:
        self._queues = queues
        self._connection: Any = None
        self._waiting: bool | None = None

    def new_tick(self) -> None:
        self._waiting = None

    def messages_waiting(self) -> bool:
        """Asked at most once per tick."""
        if self._waiting is None:
            self._waiting = self._ask()
        return self._waiting

    def _ask(self) -> bool:
        try:
            if self._connection is None:
                self._connection = app.connection_for_read()
            channel = self._connection.default_channel
            return any(self._depth(channel, queue) for queue in self._queues)
        except Exception as exc:  # unknown: wake (a duplicate is cheaper than a lost turn)
            logger.debug("broker depth unknown (%s)", exc)
            self.close()
            return False

    @staticmethod
    def _depth(channel: Any, queue: str) -> int:
        try:
            return int(channel.queue_declare(queue=queue, passive=True).message_count)
        except ChannelError:  # not declared yet: nothing in it
            return 0

    def close(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(Exception):
                self._connection.release()
        self._connection = None


def pump_shard(
    ctx: JobContext, shard: ShardKeys, backlog: BrokerBacklog, due: Container[str]
) -> Tick:
    """Wake the shard's due retries, turns of dead workers and stalled turns, from the indices
    in `due` (the probe's answer)."""
    records, settings = ctx.records, ctx.settings
    lease_ms = int(settings.lease_ttl_s * 1000)
    stall_ms = int(settings.stall_after_s * 1000)

    def wake_due(turn: Due) -> int:
        ending.wake(ctx, turn.turn_id, turn.namespace or None, turn.agent, turn.conversation_id)
        return 1

    def wake_expired(turn: Due) -> int:
        record = records.get(turn.turn_id, turn.namespace)
        if record is None or record.state is not TurnState.RUNNING:
            ctx.redis.zrem(shard.running, turn.turn_id)
            return 0
        if records.lease_holder(record.namespace) == turn.turn_id:
            return 0  # its renewal is late but the lease still stands
        logger.warning("turn %s lost its worker; waking it to resume", turn.turn_id)
        ending.wake(
            ctx,
            turn.turn_id,
            record.namespace,
            record.agent,
            record.conversation_id,
            attempt=record.attempt,  # read above: wake need not read it again
        )
        return 1

    def wake_stalled(turn: Due) -> int:
        record = records.get(turn.turn_id, turn.namespace)
        if record is None or record.state is not TurnState.QUEUED:
            ctx.redis.zrem(shard.pending, turn.turn_id)
            return 0
        at_head = records.conversation_head(record.namespace) == turn.turn_id
        if (not record.namespace or at_head) and records.lease_holder(record.namespace) is None:
            ending.wake(
                ctx,
                turn.turn_id,
                record.namespace or None,
                record.agent,
                record.conversation_id,
                attempt=record.attempt,
            )
            return 1
        return 0

    retries = expired = stalled = 0
    if shard.retries in due:
        retries = records.sweep(
            records.take_due(shard, shard.retries, limit=BATCH, bump_ms=stall_ms), wake_due
        )
    if shard.running in due:
        expired = records.sweep(
            records.take_due(shard, shard.running, limit=BATCH, bump_ms=lease_ms), wake_expired
        )
    if shard.pending in due:
        candidates = records.take_due(
            shard, shard.pending, limit=BATCH, bump_ms=stall_ms, lag_ms=stall_ms
        )
        # While the broker holds messages, stalled turns are left be (BrokerBacklog); the taken
        # ones were pushed back a stall interval and are looked at again then.
        if candidates and not backlog.messages_waiting():
            stalled = records.sweep(candidates, wake_stalled)
    return Tick(retries=retries, expired=expired, stalled=stalled)


def wake_orphans(ctx: JobContext) -> int:
    """Wake the prefetched turns of workers whose heartbeat stopped a lease lifetime ago."""
    now_ms = ctx.records.server_time_ms()
    silent_ms = int(ctx.settings.lease_ttl_s * 1000)
    woken = 0
    workers: dict[bytes, bytes] = ctx.redis.hgetall(ctx.keys.workers)  # type: ignore[assignment]
    for name, raw in workers.items():
        try:
            beat = orjson.loads(raw)
            at_ms, turns = (
                int(beat["at"]),
                [(str(t), str(n or "")) for t, n in beat.get("received") or []],
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            logger.warning("worker %r left an unreadable heartbeat; removing it", name)
            ctx.redis.hdel(ctx.keys.workers, name)
            continue
        if at_ms > now_ms - silent_ms:
            continue
        if turns:
            logger.warning("worker %s stopped; waking %d turns it held", name.decode(), len(turns))
        for turn_id, namespace in turns:
            ending.wake(ctx, turn_id, namespace or None)
            woken += 1
        ctx.redis.hdel(ctx.keys.workers, name)
    return woken


def end_overdue_turns(ctx: JobContext, shard: ShardKeys, *, limit: int) -> int:
    """Dead-letter the shard's unfinished turns past their deadline, even one whose worker is
    stuck in a tool forever: the conversation moves on. Returns how many."""

    def end_overdue(due: Due) -> int:
        record = ctx.records.get(due.turn_id, due.namespace)
        if record is None or record.state.terminal:
            ctx.redis.zrem(shard.deadlines, due.turn_id)
            return 0
        error = DeadlineExceeded(record.turn_id, str(record.state))
        ended = ending.dead_letter(ctx, record, "", Reason.DEADLINE_EXCEEDED, error)
        if ended is None:
            return 0
        logger.warning(
            "turn %s passed its deadline while %s: %s", record.turn_id, record.state, ended.entry_id
        )
        return 1

    overdue = ctx.records.take_due(shard, shard.deadlines, limit=limit, bump_ms=5000)
    return ctx.records.sweep(overdue, end_overdue)


def end_expired_pauses(ctx: JobContext, shard: ShardKeys, *, limit: int) -> int:
    """Dead-letter the shard's paused turns nobody decided on in time (pause_expired); the
    conversation moves on. Returns how many."""

    def end_expired(due: Due) -> int:
        record = ctx.records.get(due.turn_id, due.namespace)
        if record is None or record.state is not TurnState.PAUSED:
            ctx.redis.zrem(shard.pauses, due.turn_id)
            return 0
        error = PauseExpired(record.turn_id, len(pending_actions(record)))
        ended = ending.dead_letter(ctx, record, "", Reason.PAUSE_EXPIRED, error)
        if ended is None:
            return 0
        logger.warning("turn %s: its pause expired undecided: %s", record.turn_id, ended.entry_id)
        return 1

    expired = ctx.records.take_due(shard, shard.pauses, limit=limit, bump_ms=5000)
    return ctx.records.sweep(expired, end_expired)


def drop_streamed_tokens(ctx: JobContext, shard: ShardKeys, *, limit: int) -> None:
    """Remove the token.delta events of the shard's turns that ended AGENTJOBS_TOKEN_TTL_S ago
    (tasks/store/lua/drop_tokens.lua); their other events stay. A turn not that long ended
    goes back in the index for when it will be."""
    ttl_ms = ctx.settings.token_ttl_s * 1000

    def drop(due: Due) -> int:
        return int(ctx.records.drop_tokens(shard, due.turn_id, ttl_ms=ttl_ms))

    taken = ctx.records.take_due(shard, shard.tokens, limit=limit, bump_ms=5000)
    dropped = ctx.records.sweep(taken, drop)
    if dropped:
        logger.debug("removed the streamed text of %d ended turns", dropped)


def trim_submitted(ctx: JobContext, shard: ShardKeys, now_ms: int, *, limit: int) -> int:
    """Drop the shard's `submitted` entries whose record has expired: those submitted longer
    ago than a record is kept, looked at `limit` at a time (the rest at the next trim); an
    old turn whose record is still there (unfinished, or kept for its dead letter) stays."""
    older = now_ms - ctx.settings.record_ttl_s * 1000
    dropped = kept = 0
    while kept + dropped < TRIM_LOOKS:
        ids: list[bytes] = ctx.redis.zrangebyscore(  # type: ignore[assignment]
            shard.submitted, "-inf", older, start=kept, num=limit
        )
        with ctx.redis.pipeline(transaction=False) as pipe:
            for turn_id in ids:
                pipe.exists(shard.turn(turn_id.decode()))
            there: list[int] = pipe.execute()
        gone = [turn_id for turn_id, exists in zip(ids, there, strict=True) if not exists]
        if gone:
            ctx.redis.zrem(shard.submitted, *gone)
        dropped += len(gone)
        kept += len(ids) - len(gone)
        if len(ids) < limit:
            break
    return dropped


# How often the pump mends the fairness gate's counts (tasks/turn/fairness.py, pump_gate), and
# drops the listing entries of expired records (trim_submitted), at most TRIM_LOOKS a shard.
GATE_SWEEP_EVERY_S = 10.0
TRIM_EVERY_S = 60.0
TRIM_LOOKS = 2000
_last_gate_sweep = 0.0
_last_trim = 0.0


def pump_once(ctx: JobContext, backlog: BrokerBacklog | None = None, *, probe: bool = True) -> Tick:
    """One tick. Without `probe`, take from every index without asking first (the pump before
    the probe: bench/pump_idle.py's baseline)."""
    backlog = backlog or BrokerBacklog((ctx.settings.turn_queue, ctx.settings.retry_queue))
    backlog.new_tick()
    tick = Tick(orphaned=wake_orphans(ctx))
    global _last_gate_sweep
    sweep = time.monotonic() - _last_gate_sweep > GATE_SWEEP_EVERY_S
    if sweep:
        _last_gate_sweep = time.monotonic()
    tick += Tick(released=pump_gate(ctx, sweep=sweep))
    global _last_trim
    if time.monotonic() - _last_trim > TRIM_EVERY_S:
        _last_trim = time.monotonic()
        now_ms = ctx.records.server_time_ms()
        for shard in ctx.keys.all_shards():
            trim_submitted(ctx, shard, now_ms, limit=BATCH)
    indices = time_indices(ctx)
    due: Container[str] = ctx.records.due_indices(indices) if probe else indices
    if not due:
        return tick
    for shard in ctx.keys.all_shards():
        if shard.deadlines in due:
            tick += Tick(overdue=end_overdue_turns(ctx, shard, limit=BATCH))
        if shard.pauses in due:
            tick += Tick(expired_pauses=end_expired_pauses(ctx, shard, limit=BATCH))
        tick += pump_shard(ctx, shard, backlog, due)
        if shard.finished in due:
            tick += Tick(results=confirm_results(ctx, shard))
        if shard.tokens in due:
            drop_streamed_tokens(ctx, shard, limit=BATCH)
    return tick


def run_pump(
    ctx: JobContext | None = None, *, stop: threading.Event | None = None, probe: bool = True
) -> None:
    ctx = ctx or job_context()
    stop = stop or threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        if threading.current_thread() is threading.main_thread():
            signal.signal(signum, lambda *_: stop.set())
    logger.info("pump started (every %.2f s)", ctx.settings.pump_interval_s)
    backlog = BrokerBacklog((ctx.settings.turn_queue, ctx.settings.retry_queue))
    down_since: float | None = None
    failures: set[str] = set()  # each distinct failure is logged once
    while not stop.is_set():
        started = time.monotonic()
        try:
            tick = pump_once(ctx, backlog, probe=probe)
            ctx.epoch.check("pump")  # tasks/store/client.py: a store that lost its data
            ctx.redis.set(
                ctx.keys.pump_heartbeat, ctx.records.server_time_ms(), ex=ctx.settings.record_ttl_s
            )
        except redis.RedisError as exc:
            if down_since is None:  # one line per outage, not one per tick
                logger.warning("pump: Redis unavailable (%s); retrying until it answers", exc)
                down_since = started
            stop.wait(min(5.0, max(1.0, time.monotonic() - down_since)))
            continue
        except Exception as exc:
            # A defect, not an outage: the pump is every tenant's clock, so it logs and goes
            # on rather than stop retries, takeovers and deadlines for everyone.
            if str(exc) not in failures:
                failures.add(str(exc))
                logger.exception("pump: a tick failed; going on with the next one")
            stop.wait(ctx.settings.pump_interval_s)
            continue
        if down_since is not None:
            logger.info("pump: Redis answers again after %.0f s", started - down_since)
            down_since = None
        if tick:
            logger.info(
                "woke %d due retries, %d turns of dead workers, %d stalled turns, %d turns "
                "prefetched by stopped workers, %d past their deadline, %d held by the "
                "fairness gate; wrote %d missing results",
                tick.retries,
                tick.expired,
                tick.stalled,
                tick.orphaned,
                tick.overdue,
                tick.released,
                tick.results,
            )
        stop.wait(max(0.0, ctx.settings.pump_interval_s - (time.monotonic() - started)))
    backlog.close()
    logger.info("pump stopped")


def main(*, probe: bool = True) -> None:
    log_redacted()
    run_pump(probe=probe)


if __name__ == "__main__":
    main()
