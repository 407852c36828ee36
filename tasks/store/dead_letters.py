"""The dead-letter store: turns that cannot be recovered, kept for an operator to inspect,
replay or purge (`agentjobs dlq ...`). Filing, reading, replaying and purging all live here.

An entry is filed atomically with the end of its turn (tasks/store/lua/dead_letter.lua). Its summary
(reason, redacted error, attempts, times) sits in its shard's store; its checkpoint and the
submitted kwargs stay in the dead-lettered turn record, which is kept as long as the entry, so
the message is stored once and listing entries never loads a checkpoint.

An entry that cannot be read (its summary, its turn record or its checkpoint damaged by hand,
by another version or by the store) comes out of every read as {"id", "unreadable": why}, in
its place: listings name it, show and replay refuse it, purge finds it by age, and the other
entries are read as before.

A replay (tasks/turn/ending.py, `replay_dead_letter`) marks the entry with the new turn id
first (`mark_replay`, SET NX), enqueues that turn, and only then removes the entry.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from math import isfinite
from typing import Any

import orjson

from agent import AgentError
from tasks.core.errors import JobError, UnreadableRecord
from tasks.core.keys import ShardKeys
from tasks.core.redact import redact
from tasks.core.schema import Field
from tasks.store.client import StateClient
from tasks.store.records import Ended, TurnRecord, TurnRecords


def iso_ms(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="milliseconds")


def entry_id_for(turn_id: str) -> str:
    # One entry per turn: a turn can only be dead-lettered once.
    return f"dl-{turn_id}"


def file_dead_letter(
    records: TurnRecords,
    record: TurnRecord,
    token: str,
    *,
    reason: str,
    error: BaseException,
    attempts: int,
    checkpoint: bytes,
    base_run_id: str,
) -> tuple[str, str, Ended]:
    """End `record`'s turn as dead-lettered with its entry. Returns (entry id, the redacted
    error text, what ending did)."""
    entry_id = entry_id_for(record.turn_id)
    error_text = redact(str(error))
    summary = {
        "id": entry_id,
        "reason": reason,
        "errorType": type(error).__name__,
        "error": error_text,
        "attempts": attempts,
        "agent": record.agent,
        "conversationId": record.conversation_id,
        "namespace": record.namespace,
        "taskId": record.turn_id,
        "baseRunId": base_run_id,
    }
    ended = records.dead_letter(
        record.turn_id,
        record.namespace,
        token,
        entry_id=entry_id,
        entry=orjson.dumps(summary),
        reason=reason,
        checkpoint=checkpoint,
    )
    return entry_id, error_text, ended


def _with_times(summary: dict[str, Any]) -> dict[str, Any]:
    summary["firstFailedAt"] = iso_ms(int(summary.get("firstFailedAtMs") or 0))
    summary["lastFailedAt"] = iso_ms(int(summary.get("lastFailedAtMs") or 0))
    return summary


class ReplayError(Exception):
    code = "ERR_REPLAY"


class UnreadableEntry(ReplayError):
    """A dead-letter entry whose summary, turn record or checkpoint cannot be read (written by
    hand, by another version, or damaged): listings name it, show and replay refuse it."""

    code = "ERR_UNREADABLE_ENTRY"

    def __init__(self, entry_id: str, problem: str) -> None:
        self.entry_id = entry_id
        self.problem = problem
        super().__init__(
            f"dead-letter entry {entry_id!r} is unreadable ({problem}); it cannot be shown or "
            "replayed: `agentjobs dlq purge --older-than DURATION` (or --all) removes it"
        )


# The key an unreadable entry's listing holds instead of its summary: {"id", "unreadable"}.
UNREADABLE = "unreadable"
# The summary fields listing, replay and purge read, by the type each must have.
_REQUIRED_TEXT = ("reason", "taskId", "namespace")
_OPTIONAL_TEXT = ("id", "errorType", "error", "agent", "conversationId", "baseRunId")
_NUMBERS = ("attempts", "firstFailedAtMs", "lastFailedAtMs")
# The turn record fields a listing checks: the small ones, never the checkpoint or message.
_CHECKED_FIELDS = (
    Field.STATE,
    Field.NAMESPACE,
    Field.ATTEMPT,
    Field.DELIVERIES,
    Field.ITERATION,
    Field.CREATED_AT_MS,
    Field.UPDATED_AT_MS,
    Field.FINISHED_AT_MS,
    Field.FIRST_FAILED_AT_MS,
)


def read_summary(entry_id: str, raw: bytes) -> dict[str, Any]:
    """The summary stored for `entry_id`, with its failure times as ISO text; UnreadableEntry
    when it is not one (listing and purging read these fields, so each is checked)."""
    try:
        summary = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise UnreadableEntry(entry_id, "its summary is not JSON") from None
    if not isinstance(summary, dict):
        kind = type(summary).__name__
        raise UnreadableEntry(entry_id, f"its summary is a JSON {kind}, not an object")
    for name in _REQUIRED_TEXT:
        if not isinstance(summary.get(name), str):
            raise UnreadableEntry(entry_id, f"its summary has no {name!r} text")
    for name in _OPTIONAL_TEXT:
        if not isinstance(summary.get(name, ""), str):
            raise UnreadableEntry(entry_id, f"its summary's {name!r} is not text")
    for name in _NUMBERS:
        value = summary.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int | float) or not isfinite(value):
            raise UnreadableEntry(entry_id, f"its summary's {name!r} is not a number")
    if entry_id_for(summary["taskId"]) != entry_id or summary.get("id", entry_id) != entry_id:
        raise UnreadableEntry(entry_id, "its summary is another entry's")
    summary["id"] = entry_id
    return _with_times(summary)


def read_record(entry_id: str, turn_id: str, raw: Any) -> TurnRecord:
    """The dead-lettered turn's record, or UnreadableEntry when it is gone or unreadable."""
    if not raw:
        raise UnreadableEntry(entry_id, "its turn record is gone")
    try:
        return TurnRecord.from_redis(turn_id, raw)
    except UnreadableRecord as exc:
        raise UnreadableEntry(entry_id, f"its turn record is unreadable: {exc.problem}") from None
    except (KeyError, ValueError, TypeError) as exc:  # a records module without UnreadableRecord
        raise UnreadableEntry(entry_id, f"its turn record is unreadable: {exc}"[:200]) from None


@dataclass(frozen=True)
class StoredEntry:
    """An entry where the store keeps it: its summary, or why it cannot be read."""

    entry_id: str
    shard: ShardKeys  # the shard of its conversation: its record is there too
    failed_at_ms: int  # its index score (the last failure), readable whatever the summary
    summary: dict[str, Any] | None  # None when unreadable
    problem: str = ""  # why it is unreadable; "" when it is readable

    @property
    def turn_id(self) -> str:
        return self.entry_id.removeprefix("dl-")

    def as_dict(self) -> dict[str, Any]:
        """The summary, or {"id", "unreadable": why} for an entry that cannot be read."""
        if self.problem or self.summary is None:
            return {"id": self.entry_id, UNREADABLE: self.problem}
        return dict(self.summary)

    def of_reason(self, reason: str | None) -> bool:
        return reason is None or (self.summary is not None and self.summary["reason"] == reason)


def found_entry(
    entry_id: str, shard: ShardKeys, raw: bytes, failed_at_ms: int = 0, record: Any = None
) -> StoredEntry:
    """The entry `raw` holds; with `record` (its turn record's fields), checked against it."""
    summary: dict[str, Any] | None = None
    try:
        summary = read_summary(entry_id, raw)
        if record is not None:
            read_record(entry_id, summary["taskId"], record)
    except UnreadableEntry as exc:
        return StoredEntry(entry_id, shard, failed_at_ms, summary, exc.problem)
    failed_at_ms = failed_at_ms or int(summary.get("lastFailedAtMs") or 0)
    return StoredEntry(entry_id, shard, failed_at_ms, summary)


class DeadLetterStore:
    """Entries come out as dicts: the summary (and with bodies, `checkpoint` and `kwargs`), or
    for an entry that cannot be read, {"id": ..., "unreadable": why}, listed in its place so
    one damaged entry hides nothing and stops nothing."""

    def __init__(
        self,
        client: StateClient,
        records: TurnRecords,
        record_ttl_s: int,
    ) -> None:
        self._redis = client
        self._records = records
        self._keys = records.keys
        self._record_ttl_s = record_ttl_s

    def find(self, entry_id: str) -> StoredEntry | None:
        shards = self._keys.all_shards()
        with self._redis.pipeline(transaction=False) as pipe:
            for shard in shards:
                pipe.hget(shard.dead_letters, entry_id)
            raws: list[Any] = pipe.execute()
        for shard, raw in zip(shards, raws, strict=True):
            if raw is not None:
                return found_entry(entry_id, shard, raw)
        return None

    def summary(self, entry_id: str) -> dict[str, Any] | None:
        """The entry without its checkpoint and kwargs (cheap)."""
        found = self.find(entry_id)
        return found.as_dict() if found is not None else None

    def get(self, entry_id: str) -> dict[str, Any] | None:
        """The whole entry: summary, checkpoint and the submitted kwargs."""
        found = self.find(entry_id)
        return self.with_bodies([found])[0] if found is not None else None

    def with_bodies(self, entries: list[StoredEntry]) -> list[dict[str, Any]]:
        """The entries completed with `checkpoint` and `kwargs` from their turn records."""
        with self._redis.pipeline(transaction=False) as pipe:
            for entry in entries:
                pipe.hgetall(entry.shard.turn(entry.turn_id))
            bodies: list[Any] = pipe.execute()
        return [self._with_body(entry, raw) for entry, raw in zip(entries, bodies, strict=True)]

    def _with_body(self, entry: StoredEntry, raw: Any) -> dict[str, Any]:
        if entry.problem or entry.summary is None:
            return entry.as_dict()
        try:
            record = read_record(entry.entry_id, entry.turn_id, raw)
            # A turn ended from outside (a deadline) keeps its progress as frames.
            progress = self._records.progress(record)
        except UnreadableEntry as exc:
            return {"id": entry.entry_id, UNREADABLE: exc.problem}
        except (AgentError, JobError, ValueError, KeyError, TypeError) as exc:
            problem = f"its checkpoint cannot be read: {exc}"[:300]
            return {"id": entry.entry_id, UNREADABLE: problem}
        body = entry.as_dict()
        body["checkpoint"] = progress.to_dict() if progress is not None else None
        body["kwargs"] = record.payload
        return body

    def iter_entries(
        self, *, reason: str | None = None, limit: int | None = None, bodies: bool = False
    ) -> Iterator[dict[str, Any]]:
        """Entries oldest first; with `bodies`, each with its checkpoint and kwargs, read a
        page at a time so memory stays flat however many entries there are. An unreadable
        entry is listed under any `reason`: what it was cannot be told, so it is never hidden."""
        matching = (e for e in self.stored_entries() if e.of_reason(reason) or e.summary is None)
        page_size = 50
        while limit is None or limit > 0:
            page = list(
                itertools.islice(matching, page_size if limit is None else min(page_size, limit))
            )
            if not page:
                return
            if limit is not None:
                limit -= len(page)
            yield from (self.with_bodies(page) if bodies else (e.as_dict() for e in page))

    def list_entries(
        self, *, reason: str | None = None, limit: int | None = None, bodies: bool = False
    ) -> list[dict[str, Any]]:
        return list(self.iter_entries(reason=reason, limit=limit, bodies=bodies))

    def stored_entries(self) -> Iterator[StoredEntry]:
        """Every entry oldest first, its summary and its record's small fields checked."""
        streams = [self._shard_entries(shard) for shard in self._keys.all_shards()]
        yield from heapq.merge(*streams, key=lambda e: (e.failed_at_ms, e.entry_id))

    def _shard_entries(self, shard: ShardKeys, page: int = 200) -> Iterator[StoredEntry]:
        start = 0
        while True:
            ids: Any = self._redis.zrange(
                shard.dead_letter_index, start, start + page - 1, withscores=True
            )
            if not ids:
                return
            names = [entry_id.decode() for entry_id, _ in ids]
            with self._redis.pipeline(transaction=False) as pipe:
                pipe.hmget(shard.dead_letters, names)
                for name in names:
                    pipe.hmget(shard.turn(name.removeprefix("dl-")), _CHECKED_FIELDS)
                raws, *records = pipe.execute()
            for name, (_, score), raw, values in zip(names, ids, raws, records, strict=True):
                if raw is None:  # replayed or purged since the index was read
                    continue
                fields = {k: v for k, v in zip(_CHECKED_FIELDS, values, strict=True) if v}
                yield found_entry(name, shard, raw, int(score), fields)
            start += page

    def replayed_as(self, entry_id: str) -> str:
        """The turn a replay of `entry_id` started ('' when none did, or it has expired)."""
        turn_id = self._redis.get(self._keys.replay_marker(entry_id))
        return turn_id.decode() if isinstance(turn_id, bytes) else ""

    def mark_replay(self, entry_id: str, new_turn_id: str) -> tuple[str, bool]:
        """Mark the entry as replayed by `new_turn_id` unless a replay marked it first;
        returns (the replay's turn id, whether this call marked it)."""
        marker = self._keys.replay_marker(entry_id)
        if self._redis.set(marker, new_turn_id, nx=True, ex=self._record_ttl_s):
            return new_turn_id, True
        existing = self._redis.get(marker)
        assert isinstance(existing, bytes)
        return existing.decode(), False

    def purgeable(
        self, *, reason: str | None = None, older_than_s: float | None = None
    ) -> list[StoredEntry]:
        """The entries a purge of `reason` and/or `older_than_s` (neither: all) deletes. An
        unreadable entry matches no reason, but its age is its index's, so age finds it."""
        cutoff_ms = None
        if older_than_s is not None:
            cutoff_ms = self._records.server_time_ms() - int(older_than_s * 1000)
        return [
            e
            for e in self.stored_entries()
            if e.of_reason(reason) and (cutoff_ms is None or e.failed_at_ms <= cutoff_ms)
        ]

    def purge(self, *, reason: str | None = None, older_than_s: float | None = None) -> int:
        """Remove entries (all, or those of `reason`, or failed more than `older_than_s` ago)."""
        return self.remove(self.purgeable(reason=reason, older_than_s=older_than_s))

    def remove(self, entries: list[StoredEntry], replayed_as: str = "") -> int:
        """Drop entries; their turn records then expire like any finished turn's."""
        with self._redis.pipeline(transaction=False) as pipe:
            for entry in entries:
                shard, turn_id = entry.shard, entry.turn_id
                pipe.hdel(shard.dead_letters, entry.entry_id)
                pipe.zrem(shard.dead_letter_index, entry.entry_id)
                if replayed_as:
                    pipe.hset(shard.turn(turn_id), Field.REPLAYED_AS, replayed_as)
                pipe.expire(shard.turn(turn_id), self._record_ttl_s)
                pipe.expire(shard.events(turn_id), self._record_ttl_s)
            pipe.execute()
        return len(entries)
