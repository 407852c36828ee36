"""A turn's events: what happened to it, in order, readable live and again after a reconnect
(docs/operations.md, "Events").

Each turn has a Redis stream. The Lua scripts that change a turn's record append the event that
reports the change in the same step (tasks/store/lua/common.lua, `emit`), so a reader never sees a
record change without its event or the other way round. A stream entry's id is the event id: a
client that lost its connection passes the last id it saw as `after` and misses nothing. The
stream is kept as long as the turn record.

The streamed answer text is in the same stream, as token.delta events written by the worker
(tasks/turn/tokens.py), so a reader that asks for them (`tokens=True`) gets them in their place
among the others, a reader that joins mid-turn gets every delta written so far, and one that
reconnects resumes from a delta's id as from any other. Readers that do not ask never see them.
They are removed AGENTJOBS_TOKEN_TTL_S after the turn ended (the pump); the rest stays.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from tasks.core.schema import TERMINAL_EVENTS, Event
from tasks.queue.context import JobContext, job_context
from tasks.store.records import TurnRecord

# How long one blocking read waits before it looks at the turn record again.
_POLL_S = 1.0
_TOKEN_DELTA = Event.TOKEN_DELTA.value.encode()
# A stream entry id, as TurnEvent.id (the sequence part may be left out).
_EVENT_ID = re.compile(r"\d+(?:-\d+)?")


@dataclass(frozen=True)
class TurnEvent:
    id: str  # usable as `after`
    type: str
    turn_id: str
    attempt: int
    iteration: int
    at: datetime  # aware UTC, the Redis server's clock
    data: dict[str, Any]

    @classmethod
    def from_stream(cls, turn_id: str, entry_id: bytes, fields: dict[bytes, bytes]) -> TurnEvent:
        return cls(
            id=entry_id.decode(),
            type=fields[b"type"].decode(),
            turn_id=turn_id,
            attempt=int(fields.get(b"attempt") or 1),
            iteration=int(fields.get(b"iteration") or 0),
            at=datetime.fromtimestamp(int(fields[b"at"]) / 1000, UTC),
            data=orjson.loads(fields.get(b"data") or b"{}"),
        )


def iter_events(
    turn_id: str,
    *,
    after: str | None = None,
    block_s: float | None = None,
    tokens: bool = False,
    identity: Mapping[str, Any] | None = None,
) -> Iterator[TurnEvent]:
    """The turn's events in order, from the first (or after the event `after`), then waiting
    for new ones while the turn is unfinished; it ends after the terminal event. `block_s`
    bounds the wait for each next event (None: until the turn ends). With `tokens`, the
    token.delta events {text} too, in their place. Raises at once, before the first event:
    LookupError for an unknown turn id (and, with `identity`, a turn of another one),
    ValueError for an `after` that is not an event id."""
    if after is not None and not _EVENT_ID.fullmatch(after):
        raise ValueError(f"after={after!r} is not an event id (<ms>-<seq>, as TurnEvent.id)")
    ctx = job_context()
    record = ctx.records.find(turn_id, identity)
    if record is None:
        raise LookupError(f"no turn {turn_id!r} (finished turns are kept for the record TTL)")
    return _follow(ctx, record, after or "0-0", block_s=block_s, tokens=tokens)


def _follow(
    ctx: JobContext, record: TurnRecord, last: str, *, block_s: float | None, tokens: bool
) -> Iterator[TurnEvent]:
    turn_id = record.turn_id
    key = ctx.keys.for_namespace(record.namespace).events(turn_id)
    waited_since = time.monotonic()
    while True:
        batch = _read(ctx, key, last, block_ms=0)
        if not batch:
            if _ended(ctx, turn_id, record.namespace):
                batch = _read(ctx, key, last, block_ms=0)  # the terminal event, if just written
                if not batch:
                    return
            else:
                remaining_s = _POLL_S
                if block_s is not None:
                    remaining_s = min(_POLL_S, block_s - (time.monotonic() - waited_since))
                    if remaining_s <= 0:
                        return
                batch = _read(ctx, key, last, block_ms=max(1, int(remaining_s * 1000)))
        for entry_id, fields in batch:
            if not tokens and fields[b"type"] == _TOKEN_DELTA:
                last = entry_id.decode()
                continue
            event = TurnEvent.from_stream(turn_id, entry_id, fields)
            last = event.id
            waited_since = time.monotonic()
            yield event
            if event.type in TERMINAL_EVENTS:
                return


def _read(ctx: JobContext, key: str, after: str, *, block_ms: int) -> list[Any]:
    if block_ms:
        reply: Any = ctx.redis.xread({key: after}, count=100, block=block_ms)
        return list(reply[0][1]) if reply else []
    entries: Any = ctx.redis.xrange(key, min=f"({after}", count=100)
    return list(entries)


def _ended(ctx: JobContext, turn_id: str, namespace: str) -> bool:
    record = ctx.records.get(turn_id, namespace)
    return record is None or record.state.terminal
