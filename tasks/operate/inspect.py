"""Read-only views of the job system for operators (`agentjobs turn list`, `conversation show`,
`stats`): plain data out, nothing written, every time the Redis server's.

Listing turns and counting finished ones walk the keyspace with SCAN (one pass, all shards,
a page at a time), so they cost in proportion to the store and see a finished turn only while
its record is kept (AGENTJOBS_RECORD_TTL_S). Unfinished turns are counted from the shard
indices, which is cheap.
"""

from __future__ import annotations

import heapq
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from agent import AgentError, AgentRunCheckpoint
from tasks.core.errors import JobError, UnreadableRecord
from tasks.core.keys import ShardKeys
from tasks.core.namespaces import namespace_for
from tasks.core.state_url import parse_state_url
from tasks.operate.listing import INDEX_OF_STATE, LISTED_FIELDS, batched
from tasks.queue.context import JobContext
from tasks.store.records import TurnRecord, TurnState

_PAGE = 500
# A due retry the pump has not taken this many intervals later means no pump is running.
OVERDUE_PUMP_INTERVALS = 5


def summary_of(record: TurnRecord) -> dict[str, Any]:
    """A record for listings: as_dict without its large parts."""
    data = record.as_dict()
    for key in ("payload", "result", "checkpoint"):
        data.pop(key)
    return data


def _turn_keys(ctx: JobContext) -> Iterator[str]:
    # `{prefix}:{<shard>}:turn:<id>`; the regex drops other keys the glob also matches.
    exact = re.compile(re.escape(ctx.keys.prefix) + r":\{\d+\}:turn:.+")
    for key in ctx.redis.scan_iter(match=f"{ctx.keys.prefix}:{{*}}:turn:*", count=_PAGE):
        text = key.decode() if isinstance(key, bytes) else str(key)
        if exact.fullmatch(text):
            yield text


def iter_turns(ctx: JobContext, unreadable: list[str] | None = None) -> Iterator[TurnRecord]:
    """Every turn record kept, in no particular order, without checkpoint, payload or result.
    A record that cannot be read is skipped (logged once), its id added to `unreadable`."""
    for page in batched(_turn_keys(ctx), _PAGE):
        with ctx.redis.pipeline(transaction=False) as pipe:
            for key in page:
                pipe.hmget(key, LISTED_FIELDS)
            rows: list[Any] = pipe.execute()
        for key, values in zip(page, rows, strict=True):
            fields = {
                name: value for name, value in zip(LISTED_FIELDS, values, strict=True) if value
            }
            if "state" not in fields:  # gone (expired) since the scan saw it
                continue
            try:
                yield TurnRecord.from_redis(key.split(":turn:", 1)[1], fields)
            except UnreadableRecord as exc:
                ctx.records.note_unreadable(exc)
                if unreadable is not None:
                    unreadable.append(exc.turn_id)


def list_turns(
    ctx: JobContext,
    *,
    state: str | None = None,
    conversation_id: str | None = None,
    agent: str | None = None,
    limit: int = 50,
) -> list[TurnRecord]:
    """The newest `limit` turns (by submission time) matching every filter given."""
    matching = (
        r
        for r in iter_turns(ctx)
        if state in (None, r.state)
        and conversation_id in (None, r.conversation_id)
        and agent in (None, r.agent)
    )
    return heapq.nlargest(limit, matching, key=lambda r: (r.created_at_ms, r.turn_id))


@dataclass(frozen=True)
class ConversationView:
    conversation_id: str
    namespace: str
    checkpoint: AgentRunCheckpoint | None
    unreadable: str  # why the stored conversation could not be read, or ""
    unfinished: list[TurnRecord] = field(default_factory=list)

    @property
    def known(self) -> bool:
        return self.checkpoint is not None or bool(self.unreadable) or bool(self.unfinished)


def conversation_view(
    ctx: JobContext, conversation_id: str, identity: Mapping[str, Any] | None = None
) -> ConversationView:
    """The stored conversation and the unfinished turns in its queue, in submission order."""
    namespace = namespace_for(conversation_id, identity)
    checkpoint, unreadable = None, ""
    try:
        checkpoint = ctx.store.load(namespace)
    except (JobError, AgentError) as exc:
        unreadable = str(exc)
    queue: list[Any] = ctx.redis.lrange(ctx.keys.for_namespace(namespace).queue(namespace), 0, -1)
    unfinished = []
    for raw in queue:
        record = ctx.records.get(raw.decode(), namespace)
        if record is not None:
            unfinished.append(record)
    return ConversationView(conversation_id, namespace, checkpoint, unreadable, unfinished)


def live_stats(ctx: JobContext) -> dict[str, Any]:
    """The figures that come from the shard indices and counters alone, which is cheap (one
    pipelined round trip, and one more per shard that has queued turns): unfinished turns by
    state, dead letters by reason, retries due, the oldest runnable turn's age, the pump's
    heartbeat, the workers' heartbeats and the shards' counters added up. `agentjobs metrics`
    reads these at every scrape; `stats` adds the finished turns, which walk every record."""
    now_ms = ctx.records.server_time_ms()
    overdue_ms = _overdue_ms(ctx)
    shards = ctx.keys.all_shards()
    replies = _read_indices(ctx, shards, now_ms, overdue_ms)
    worker_beats = replies.pop()
    pump_beat = replies.pop()
    totals = _ShardTotals()
    for n, shard in enumerate(shards):
        totals.add(shard, replies[n * _PER_SHARD : (n + 1) * _PER_SHARD])
    queued_ages, runnable_ages = _queued_ages(ctx, totals.queued, now_ms)
    oldest_due_ms = totals.oldest_due_ms
    if oldest_due_ms is not None:
        runnable_ages.append(now_ms - oldest_due_ms)
    return {
        "serverTimeMs": now_ms,
        "turns": _unfinished_by_state(totals.turns),
        "deadLetters": _dead_letters(totals.reasons),
        "retriesDueNow": totals.due_now,
        # Due more than OVERDUE_PUMP_INTERVALS ago and not yet taken by a pump.
        "retriesOverdue": totals.overdue,
        "oldestQueuedAgeS": _oldest_s(queued_ages),
        "oldestDueRetryAgeS": (now_ms - oldest_due_ms) / 1000 if oldest_due_ms else None,
        # The longest a turn that could run now has waited for a worker: a queued turn at the
        # head of its conversation since it became the head, or a retry since it was due.
        "oldestRunnableAgeS": _oldest_s(runnable_ages),
        "pump": _pump(pump_beat, now_ms, overdue_ms),
        # Heartbeats within a lease lifetime; the pump removes a silent worker's.
        "workers": _workers(worker_beats, now_ms, ctx.settings.lease_ttl_s),
        # What the scripts counted since the store began (tasks/core/keys.py, ShardKeys.counters).
        "counters": dict(sorted(totals.counters.items())),
    }


def _overdue_ms(ctx: JobContext) -> int:
    """How long past its due time a retry may wait before the pump counts as down."""
    return int(OVERDUE_PUMP_INTERVALS * ctx.settings.pump_interval_s * 1000)


# How many replies each shard has in _read_indices' pipeline, in the order _ShardTotals.add
# takes them.
_PER_SHARD = 10


def _read_indices(
    ctx: JobContext, shards: list[ShardKeys], now_ms: int, overdue_ms: int
) -> list[Any]:
    """One pipelined read of every shard's indices and counters, then the pump's heartbeat
    and the workers' heartbeats (the last two replies)."""
    with ctx.redis.pipeline(transaction=False) as pipe:
        for shard in shards:
            pipe.zcard(shard.pending)
            pipe.zcard(shard.running)
            pipe.zcard(shard.retries)
            pipe.zcount(shard.retries, "-inf", now_ms)
            pipe.zcount(shard.retries, "-inf", now_ms - overdue_ms)
            pipe.zrangebyscore(shard.retries, "-inf", now_ms, start=0, num=1, withscores=True)
            pipe.zrange(shard.pending, 0, -1)
            pipe.hvals(shard.dead_letters)
            pipe.hgetall(shard.counters)
            pipe.zcard(shard.pauses)
        pipe.get(ctx.keys.pump_heartbeat)
        pipe.hvals(ctx.keys.workers)
        replies: list[Any] = pipe.execute()
    return replies


@dataclass
class _ShardTotals:
    """The shards' index figures, added up shard by shard."""

    turns: Counter[str] = field(default_factory=Counter)
    due_now: int = 0
    overdue: int = 0
    oldest_due_ms: int | None = None
    reasons: Counter[str] = field(default_factory=Counter)
    counters: Counter[str] = field(default_factory=Counter)
    # Each shard that has queued turns, with their ids: their ages are read afterwards.
    queued: list[tuple[ShardKeys, list[bytes]]] = field(default_factory=list)

    def add(self, shard: ShardKeys, replies: list[Any]) -> None:
        queued, running, waiting, due, late, first_due, pending, dead, counted, held = replies
        self.turns.update(queued=queued, running=running, waiting=waiting, paused=held)
        self.due_now += due
        self.overdue += late
        if first_due:
            score = int(first_due[0][1])
            due_ms = self.oldest_due_ms
            self.oldest_due_ms = score if due_ms is None else min(due_ms, score)
        self.reasons.update(_reason_of(raw) for raw in dead)
        self.counters.update({name.decode(): _count(value) for name, value in counted.items()})
        if pending:
            self.queued.append((shard, pending))


def _queued_ages(
    ctx: JobContext, queued: list[tuple[ShardKeys, list[bytes]]], now_ms: int
) -> tuple[list[int], list[int]]:
    """How long each queued turn has waited since it was made, and since it became runnable
    (set while it is the head of its conversation), in ms: one round trip per shard. A
    pending score is the turn's last wake, not its submission, so the record says when."""
    since_made: list[int] = []
    since_runnable: list[int] = []
    for shard, members in queued:
        with ctx.redis.pipeline(transaction=False) as pipe:
            for member in members:
                pipe.hmget(shard.turn(member.decode()), "created_at_ms", "runnable_at_ms")
            times: list[Any] = pipe.execute()
        since_made += _ages_ms([created for created, _ in times], now_ms)
        since_runnable += _ages_ms([runnable for _, runnable in times], now_ms)
    return since_made, since_runnable


def _ages_ms(times_ms: list[bytes | None], now_ms: int) -> list[int]:
    """now_ms less each time given as digits; a field missing or not a number is left out."""
    return [now_ms - int(at) for at in times_ms if at and at.isdigit()]


def _oldest_s(ages_ms: list[int]) -> float | None:
    return max(ages_ms) / 1000 if ages_ms else None


def _unfinished_by_state(turns: Counter[str]) -> dict[str, int]:
    by_state = {str(s): 0 for s in TurnState if not s.terminal}
    by_state.update(turns)
    return by_state


def _dead_letters(reasons: Counter[str]) -> dict[str, Any]:
    return {"total": sum(reasons.values()), "byReason": dict(sorted(reasons.items()))}


def _pump(raw_beat: Any, now_ms: int, overdue_ms: int) -> dict[str, Any]:
    """The pump's last heartbeat, its age, and whether it is too old for a pump to be up."""
    heartbeat_ms = int(raw_beat) if raw_beat else None
    # max: a pump may beat between the server time read and the heartbeat read.
    age_s = max(0, now_ms - heartbeat_ms) / 1000 if heartbeat_ms is not None else None
    return {
        "lastHeartbeatMs": heartbeat_ms,
        "lastHeartbeatAgeS": age_s,
        "mayBeDown": age_s is None or age_s * 1000 > overdue_ms,
    }


def _workers(raw_beats: list[bytes], now_ms: int, lease_ttl_s: float) -> dict[str, int]:
    """Workers by heartbeat: alive (a beat within a lease lifetime) or silent."""
    beats = [at for raw in raw_beats if (at := _beat_at(raw)) is not None]
    alive = sum(1 for at in beats if at > now_ms - int(lease_ttl_s * 1000))
    return {"alive": alive, "silent": len(beats) - alive}


def _beat_at(raw: bytes) -> int | None:
    try:
        return int(orjson.loads(raw)["at"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None  # the pump removes an unreadable heartbeat


def _reason_of(raw: bytes) -> str:
    try:
        return str(orjson.loads(raw).get("reason", "?"))
    except (orjson.JSONDecodeError, AttributeError):
        return "(unreadable entry)"


def _count(raw: bytes) -> int:
    return int(raw) if raw.lstrip(b"-").isdigit() else 0


def unreadable_records(ctx: JobContext, found: list[str]) -> list[str]:
    """The turn ids whose records cannot be read: those a walk just `found`, and those a
    sweep noted (tasks/store/records.py) that still exist; the noted ones that are gone or were
    repaired are forgotten."""
    noted = {m.decode() for m in ctx.redis.smembers(ctx.keys.unreadable_records)}  # type: ignore[union-attr]
    still = set(found)
    for turn_id in noted - still:
        try:
            if ctx.records.get(turn_id) is not None:
                ctx.redis.srem(ctx.keys.unreadable_records, turn_id)  # repaired
            elif not ctx.records.owner_of(turn_id):
                ctx.redis.srem(ctx.keys.unreadable_records, turn_id)  # removed
        except UnreadableRecord:
            still.add(turn_id)
    return sorted(still)


def stats(ctx: JobContext) -> dict[str, Any]:
    """live_stats, with the finished turns by state counted from the records kept, as one
    JSON-ready dict (camelCase keys, ages in seconds)."""
    figures = live_stats(ctx)
    found: list[str] = []
    finished: Counter[str] = Counter(
        str(r.state) for r in iter_turns(ctx, found) if str(r.state) not in INDEX_OF_STATE
    )
    unreadable = unreadable_records(ctx, found)
    by_state = {str(s): 0 for s in TurnState}
    by_state.update(figures.pop("turns"))
    by_state.update(finished)
    kept = ctx.settings.record_ttl_s
    return {
        "serverTimeMs": figures.pop("serverTimeMs"),
        "turns": by_state,
        "finishedCountsFrom": (
            f"turn records, kept AGENTJOBS_RECORD_TTL_S ({kept} s) after a turn ends"
        ),
        **figures,
        # Records no sweep can read (skipped by the pump and every listing): see the log.
        "unreadableRecords": {"total": len(unreadable), "turnIds": unreadable[:20]},
        "state": state_store(
            ctx, state_lost_turns=figures["deadLetters"]["byReason"].get("state_lost", 0)
        ),
    }


def state_store(ctx: JobContext, *, state_lost_turns: int) -> dict[str, Any]:
    """Where the state lives, its epoch and the losses on record (tasks/store/client.py)."""
    ctx.epoch.current()  # a store without an epoch gets one: stats show what workers see
    info = ctx.epoch.info()
    return {
        "store": parse_state_url(ctx.settings.state_url).describe(),
        "epoch": info["epoch"],
        "losses": info["losses"],
        "lost": bool(info["losses"]) or state_lost_turns > 0,
        "stateLostTurns": state_lost_turns,
    }


def pump_may_be_down(ctx: JobContext, due_at_ms: int) -> bool:
    """Whether a retry due at `due_at_ms` is overdue with no pump heartbeat to explain it."""
    now_ms = ctx.records.server_time_ms()
    overdue_ms = _overdue_ms(ctx)
    if due_at_ms > now_ms - overdue_ms:
        return False
    beat = ctx.redis.get(ctx.keys.pump_heartbeat)
    return beat is None or int(beat) < now_ms - overdue_ms
