"""The dead-letter store: turns that cannot be recovered, kept for an operator to inspect,
replay or purge (`agentjobs dlq ...`). Filing, reading, replaying and purging all live here.

An entry is filed atomically with the end of its turn (tasks/lua/dead_letter.lua). Its summary
(reason, redacted error, attempts, times) sits in its shard's store; its checkpoint and the
submitted kwargs stay in the dead-lettered turn record, which is kept as long as the entry, so
the message is stored once and listing entries never loads a checkpoint.

Replaying marks the entry with the new turn id first (SET NX), enqueues that turn, and only
then removes the entry: a replay that dies half-way is finished by the next one, and two
replays of one entry start one turn.
"""

from __future__ import annotations

import heapq
import itertools
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from agent import AgentError
from tasks.errors import JobError
from tasks.records import Ended, TurnRecord, TurnRecords
from tasks.redact import redact
from tasks.state import StateClient
from tasks.store import ConversationStore


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


@dataclass(frozen=True)
class Replayed:
    entry_id: str
    turn_id: str
    # False when an earlier replay of this entry had already enqueued the turn.
    first: bool
    resumed_from_checkpoint: bool


class DeadLetterStore:
    def __init__(
        self,
        client: StateClient,
        records: TurnRecords,
        store: ConversationStore,
        record_ttl_s: int,
    ) -> None:
        self._redis = client
        self._store = store
        self._records = records
        self._keys = records.keys
        self._record_ttl_s = record_ttl_s

    def _turn_id_of(self, entry_id: str) -> str:
        return entry_id.removeprefix("dl-")

    def summary(self, entry_id: str) -> dict[str, Any] | None:
        """The entry without its checkpoint and kwargs (cheap)."""
        with self._redis.pipeline(transaction=False) as pipe:
            for shard in self._keys.all_shards():
                pipe.hget(shard.dead_letters, entry_id)
            found = [raw for raw in pipe.execute() if raw is not None]
        return _with_times(orjson.loads(found[0])) if found else None

    def get(self, entry_id: str) -> dict[str, Any] | None:
        """The whole entry: summary, checkpoint and the submitted kwargs."""
        summary = self.summary(entry_id)
        return self.with_bodies([summary])[0] if summary is not None else None

    def with_bodies(self, summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Summaries completed with `checkpoint` and `kwargs` from their turn records."""
        with self._redis.pipeline(transaction=False) as pipe:
            for summary in summaries:
                shard = self._keys.for_namespace(summary.get("namespace", ""))
                pipe.hgetall(shard.turn(summary["taskId"]))
            bodies: list[Any] = pipe.execute()
        for summary, raw in zip(summaries, bodies, strict=True):
            record = TurnRecord.from_redis(summary["taskId"], raw) if raw else None
            # A turn ended from outside (a deadline) keeps its progress as frames.
            progress = self._records.progress(record) if record is not None else None
            summary["checkpoint"] = progress.to_dict() if progress is not None else None
            summary["kwargs"] = record.payload if record is not None else None
        return summaries

    def iter_entries(
        self, *, reason: str | None = None, limit: int | None = None, bodies: bool = False
    ) -> Iterator[dict[str, Any]]:
        """Entries oldest first; with `bodies`, each with its checkpoint and kwargs, read a
        page at a time so memory stays flat however many entries there are."""
        matching = (e for e in self._summaries_oldest_first() if reason in (None, e["reason"]))
        page_size = 50
        while limit is None or limit > 0:
            page = list(
                itertools.islice(matching, page_size if limit is None else min(page_size, limit))
            )
            if not page:
                return
            if limit is not None:
                limit -= len(page)
            yield from (self.with_bodies(page) if bodies else page)

    def list_entries(
        self, *, reason: str | None = None, limit: int | None = None, bodies: bool = False
    ) -> list[dict[str, Any]]:
        return list(self.iter_entries(reason=reason, limit=limit, bodies=bodies))

    def _summaries_oldest_first(self) -> Iterable[dict[str, Any]]:
        streams = [
            self._shard_summaries(shard.dead_letters, shard.dead_letter_index)
            for shard in self._keys.all_shards()
        ]
        for _score, _entry_id, summary in heapq.merge(*streams):
            yield _with_times(summary)

    def _shard_summaries(
        self, store_key: str, index_key: str, page: int = 200
    ) -> Iterable[tuple[float, str, dict[str, Any]]]:
        start = 0
        while True:
            ids: Any = self._redis.zrange(index_key, start, start + page - 1, withscores=True)
            if not ids:
                return
            raws: Any = self._redis.hmget(store_key, [entry_id for entry_id, _ in ids])
            for (entry_id, score), raw in zip(ids, raws, strict=True):
                if raw is not None:
                    yield score, entry_id.decode(), orjson.loads(raw)
            start += page

    def replay(self, entry_id: str) -> Replayed:
        """Enqueue a dead-lettered turn again as a new turn with a fresh retry budget.

        It resumes the entry's checkpoint when the conversation has not moved since the turn
        started (nothing ran after it); otherwise it runs the message again on the
        conversation as it is now, so the stored history never forks.
        """
        marker = self._keys.replay_marker(entry_id)
        entry = self.get(entry_id)
        if entry is None:
            replayed_as = self._redis.get(marker)
            if isinstance(replayed_as, bytes):
                return Replayed(entry_id, replayed_as.decode(), False, False)
            raise ReplayError(f"no dead-letter entry {entry_id!r}; `agentjobs dlq list` shows them")
        new_turn_id = f"replay-{uuid.uuid4()}"
        first = bool(self._redis.set(marker, new_turn_id, nx=True, ex=self._record_ttl_s))
        if not first:
            existing = self._redis.get(marker)
            assert isinstance(existing, bytes)
            new_turn_id = existing.decode()
        resumed = _submit_replay(new_turn_id, entry, self._store)
        self._remove([entry], replayed_as=new_turn_id)
        return Replayed(entry_id, new_turn_id, first=first, resumed_from_checkpoint=resumed)

    def purge(self, *, reason: str | None = None, older_than_s: float | None = None) -> int:
        """Remove entries (all, or those of `reason`, or failed more than `older_than_s` ago)."""
        cutoff_ms = None
        if older_than_s is not None:
            cutoff_ms = self._records.server_time_ms() - int(older_than_s * 1000)
        doomed = [
            e
            for e in self._summaries_oldest_first()
            if reason in (None, e["reason"])
            and (cutoff_ms is None or int(e["lastFailedAtMs"]) <= cutoff_ms)
        ]
        self._remove(doomed)
        return len(doomed)

    def _remove(self, entries: list[dict[str, Any]], replayed_as: str = "") -> None:
        """Drop entries; their turn records then expire like any finished turn's."""
        with self._redis.pipeline(transaction=False) as pipe:
            for entry in entries:
                shard = self._keys.for_namespace(entry.get("namespace", ""))
                turn_key = shard.turn(self._turn_id_of(entry["id"]))
                pipe.hdel(shard.dead_letters, entry["id"])
                pipe.zrem(shard.dead_letter_index, entry["id"])
                if replayed_as:
                    pipe.hset(turn_key, "replayed_as", replayed_as)
                pipe.expire(turn_key, self._record_ttl_s)
                pipe.expire(shard.events(self._turn_id_of(entry["id"])), self._record_ttl_s)
            pipe.execute()


def _submit_replay(turn_id: str, entry: dict[str, Any], store: ConversationStore) -> bool:
    """Enqueue the replayed turn; True when it resumes the entry's checkpoint, which it does
    only while the stored conversation is the one the failed turn started from."""
    from tasks.turns import submit_turn  # the Celery tasks import this module

    checkpoint = entry.get("checkpoint")
    namespace = str(entry.get("namespace") or "")
    resume = False
    if checkpoint and namespace and entry.get("reason") != "invalid_checkpoint":
        try:
            stored = store.load(namespace)
        except (JobError, AgentError):
            stored = None
        resume = (stored.run_id if stored else "") == entry.get("baseRunId", "")
    submit_turn(
        turn_id,
        entry.get("kwargs"),
        checkpoint=orjson.dumps(checkpoint) if resume else b"",
        replay_of=str(entry.get("id", "")),
    )
    return resume
