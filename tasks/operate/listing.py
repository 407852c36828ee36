"""Turns a page at a time, newest first, through the shards' `submitted` indices
(tasks/core/keys.py): what the console's `/turns` lists, at a cost that follows the page, not
the store.

A page starts after a cursor (the last turn of the previous page, "<submitted ms>:<turn id>")
and reads each shard's index from there, merged newest first; only the turns it looks at have
their records read (the listing fields, one pipelined HMGET per batch). With filters, a page
looks at up to `budget` turns: a page that found fewer matches than asked still has a cursor
when more turns lie behind it. Filters on an unfinished state start from that state's shard
index instead, which holds only the turns in it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tasks.core.errors import UnreadableRecord
from tasks.core.keys import ShardKeys
from tasks.core.namespaces import owner_of_namespace
from tasks.queue.context import JobContext
from tasks.store.records import TurnRecord, TurnState

# Fields a listing reads of each record (never the payload, result or progress: they are large).
LISTED_FIELDS = (
    "state",
    "agent",
    "conversation_id",
    "namespace",
    "attempt",
    "deliveries",
    "iteration",
    "created_at_ms",
    "updated_at_ms",
    "finished_at_ms",
    "due_at_ms",
    "worker",
    "last_error",
    "dlq_id",
    "reason",
    "replay_of",
    "replayed_as",
    "cancel_reason",
    "waiting_for",
    "paused_at_ms",
    "pause_expires_at_ms",
)
# The shard index of each unfinished state.
INDEX_OF_STATE = {
    TurnState.QUEUED: "pending",
    TurnState.RUNNING: "running",
    TurnState.WAITING: "retries",
    TurnState.PAUSED: "pauses",
}
_BATCH = 100
Position = tuple[int, str]  # (submitted ms, turn id): the listing's order, newest first
Entry = tuple[int, str, int]  # a Position and the shard whose index holds it
T = TypeVar("T")


@dataclass(frozen=True)
class TurnFilter:
    """Which turns a listing shows; None matches any."""

    state: TurnState | None = None
    tenant: str | None = None
    agent: str | None = None
    namespace: str | None = None  # one conversation

    def matches(self, record: TurnRecord) -> bool:
        return (
            self.state in (None, record.state)
            and self.agent in (None, record.agent)
            and self.namespace in (None, record.namespace)
            and self.tenant in (None, owner_of_namespace(record.namespace)[0])
        )


@dataclass(frozen=True)
class TurnPage:
    turns: list[TurnRecord]
    # Where the next page starts (pass it as `after`), or None when no older turn is left.
    cursor: str | None
    examined: int = 0
    unreadable: list[str] = field(default_factory=list)


def parse_cursor(cursor: str) -> Position:
    """A cursor as page_turns writes it, or ValueError naming what is wrong with it."""
    millis, sep, turn_id = cursor.partition(":")
    if not sep or not millis.isdigit() or not turn_id:
        raise ValueError(f"cursor {cursor!r} is not <submitted ms>:<turn id>")
    return int(millis), turn_id


def write_cursor(submitted_ms: int, turn_id: str) -> str:
    return f"{submitted_ms}:{turn_id}"


def page_turns(
    ctx: JobContext,
    where: TurnFilter = TurnFilter(),
    *,
    after: str | None = None,
    limit: int = 50,
    budget: int = 5000,
) -> TurnPage:
    """Up to `limit` turns matching `where`, newest first, older than the cursor `after`."""
    start = parse_cursor(after) if after else None
    if where.state in INDEX_OF_STATE:
        entries = _in_state(ctx, where, start)
    else:
        entries = _newest_first(ctx, _shards_of(ctx, where), start)
    found: list[TurnRecord] = []
    unreadable: list[str] = []
    examined = 0
    last: Entry | None = None
    exhausted = True
    for batch in batched(entries, _BATCH):
        records = _read(ctx, batch, unreadable)
        for entry in batch:
            examined += 1
            last = entry
            record = records.get(entry[1])
            if record is not None and where.matches(record):
                found.append(record)
            if len(found) == limit or examined >= budget:
                break
        else:
            continue
        exhausted = False
        break
    cursor = None if exhausted or last is None else write_cursor(last[0], last[1])
    return TurnPage(_with_pending(ctx, found), cursor, examined, unreadable)


def _shards_of(ctx: JobContext, where: TurnFilter) -> list[ShardKeys]:
    if where.namespace is not None:
        return [ctx.keys.for_namespace(where.namespace)]
    return ctx.keys.all_shards()


def _before(entry: Entry, start: Position | None) -> bool:
    return start is None or entry[:2] < start


def _newest_first(
    ctx: JobContext, shards: list[ShardKeys], start: Position | None
) -> Iterator[Entry]:
    """Every indexed turn of `shards` older than `start`, newest first: each shard's index
    read from the cursor's time down a chunk at a time (the first chunks in one round trip)."""
    top: float | str = "+inf" if start is None else start[0]
    with ctx.redis.pipeline(transaction=False) as pipe:
        for shard in shards:
            pipe.zrevrangebyscore(
                shard.submitted, top, "-inf", start=0, num=_BATCH, withscores=True
            )
        firsts: list[Any] = pipe.execute()
    walks = [
        _shard_walk(ctx, shard, top, first, start)
        for shard, first in zip(shards, firsts, strict=True)
    ]
    seen: set[str] = set()
    for entry in heapq.merge(*walks, reverse=True):
        if entry[1] not in seen:  # an entry added while walking shifts the later chunks
            seen.add(entry[1])
            yield entry


def _shard_walk(
    ctx: JobContext, shard: ShardKeys, top: float | str, rows: list[Any], start: Position | None
) -> Iterator[Entry]:
    offset = 0
    while rows:
        for member, score in rows:
            entry = (int(score), member.decode(), shard.shard)
            if _before(entry, start):
                yield entry
        if len(rows) < _BATCH:
            return
        offset += len(rows)
        rows = ctx.redis.zrevrangebyscore(
            shard.submitted, top, "-inf", start=offset, num=_BATCH, withscores=True
        )


def _in_state(ctx: JobContext, where: TurnFilter, start: Position | None) -> Iterator[Entry]:
    """The turns of an unfinished state's index, newest submitted first."""
    assert where.state is not None
    index = INDEX_OF_STATE[where.state]
    shards = _shards_of(ctx, where)
    with ctx.redis.pipeline(transaction=False) as pipe:
        for shard in shards:
            pipe.zrange(getattr(shard, index), 0, -1)
        members: list[list[bytes]] = pipe.execute()
    entries: list[Entry] = []
    for shard, ids in zip(shards, members, strict=True):
        if not ids:
            continue
        scores: list[Any] = ctx.redis.zmscore(shard.submitted, ids)  # type: ignore[arg-type]
        for member, score in zip(ids, scores, strict=True):
            entry = (int(score or 0), member.decode(), shard.shard)
            if _before(entry, start):
                entries.append(entry)
    return iter(sorted(entries, reverse=True))


def batched(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """`items` in lists of `size` (the last one shorter)."""
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _read(ctx: JobContext, batch: list[Entry], unreadable: list[str]) -> dict[str, TurnRecord]:
    with ctx.redis.pipeline(transaction=False) as pipe:
        for _, turn_id, shard in batch:
            pipe.hmget(ctx.keys.shard(shard).turn(turn_id), LISTED_FIELDS)
        rows: list[Any] = pipe.execute()
    records: dict[str, TurnRecord] = {}
    for (_, turn_id, _), values in zip(batch, rows, strict=True):
        fields = {name: value for name, value in zip(LISTED_FIELDS, values, strict=True) if value}
        if "state" not in fields:  # expired; the pump drops its index entry
            continue
        try:
            records[turn_id] = TurnRecord.from_redis(turn_id, fields)
        except UnreadableRecord as exc:
            ctx.records.note_unreadable(exc)
            unreadable.append(turn_id)
    return records


def _with_pending(ctx: JobContext, records: list[TurnRecord]) -> list[TurnRecord]:
    """The paused ones read whole, for their pending actions (a listing's fields lack them)."""
    whole = []
    for record in records:
        if record.state is TurnState.PAUSED:
            record = ctx.records.get(record.turn_id, record.namespace) or record
        whole.append(record)
    return whole
