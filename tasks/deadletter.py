"""The dead-letter store: turns that cannot be recovered, kept for an operator to inspect,
replay or purge (`agentjobs dlq ...`).

An entry is filed atomically with the end of its turn (TurnRecords.dead_letter). Replaying
marks the entry with the new turn id first (SET NX), enqueues that turn, and only then removes
the entry: a replay that dies half-way is finished by the next one, and two replays of one entry
start one turn.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
import redis

from tasks.keys import Keys
from tasks.records import now_ms
from tasks.redact import redact


def iso_ms(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="milliseconds")


def entry_id_for(turn_id: str) -> str:
    # One entry per turn: a turn can only be dead-lettered once.
    return f"dl-{turn_id}"


def build_entry(
    *,
    entry_id: str,
    reason: str,
    error: BaseException,
    attempts: int,
    agent: str,
    conversation_id: str,
    namespace: str,
    turn_id: str,
    first_failed_ms: int,
    checkpoint: Any,
    kwargs: Any,
    base_run_id: str,
) -> dict[str, Any]:
    now = now_ms()
    return {
        "id": entry_id,
        "reason": reason,
        "errorType": type(error).__name__,
        "error": redact(str(error)),
        "attempts": attempts,
        "agent": agent,
        "conversationId": conversation_id,
        "namespace": namespace,
        "taskId": turn_id,
        "firstFailedAt": iso_ms(first_failed_ms or now),
        "lastFailedAt": iso_ms(now),
        "lastFailedAtMs": now,
        "baseRunId": base_run_id,
        "checkpoint": checkpoint,
        "kwargs": kwargs,
    }


class ReplayError(Exception):
    code = "ERR_REPLAY"


@dataclass(frozen=True)
class Replayed:
    entry_id: str
    turn_id: str
    # False when an earlier replay of this entry had already enqueued the turn.
    first: bool
    resumed_from_checkpoint: bool


# submit(turn_id, entry) enqueues the replayed turn (idempotent for one turn_id) and returns
# whether it resumes the entry's checkpoint.
Submit = Callable[[str, dict[str, Any]], bool]


class DeadLetterStore:
    def __init__(self, client: redis.Redis, keys: Keys, record_ttl_s: int) -> None:
        self._redis = client
        self._keys = keys
        self._record_ttl_s = record_ttl_s

    def get(self, entry_id: str) -> dict[str, Any] | None:
        raw = self._redis.hget(self._keys.dead_letters, entry_id)
        if raw is None:
            return None
        entry: dict[str, Any] = orjson.loads(raw)
        return entry

    def list_entries(
        self, *, reason: str | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Entries oldest first."""
        entries = self._entries(self._redis.zrange(self._keys.dead_letter_index, 0, -1))
        if reason is not None:
            entries = [e for e in entries if e.get("reason") == reason]
        return entries[:limit] if limit is not None else entries

    def _entries(self, ids: Any) -> list[dict[str, Any]]:
        if not ids:
            return []
        raws: Any = self._redis.hmget(self._keys.dead_letters, list(ids))
        return [orjson.loads(raw) for raw in raws if raw is not None]

    def replay(self, entry_id: str, submit: Submit) -> Replayed:
        marker = self._keys.replay_marker(entry_id)
        entry = self.get(entry_id)
        if entry is None:
            replayed_as = self._redis.get(marker)
            if isinstance(replayed_as, bytes):
                return Replayed(
                    entry_id, replayed_as.decode(), first=False, resumed_from_checkpoint=False
                )
            raise ReplayError(f"no dead-letter entry {entry_id!r}; `agentjobs dlq list` shows them")
        new_turn_id = f"replay-{uuid.uuid4()}"
        first = bool(self._redis.set(marker, new_turn_id, nx=True, ex=self._record_ttl_s))
        if not first:
            existing = self._redis.get(marker)
            assert isinstance(existing, bytes)
            new_turn_id = existing.decode()
        resumed = submit(new_turn_id, entry)
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.hdel(self._keys.dead_letters, entry_id)
            pipe.zrem(self._keys.dead_letter_index, entry_id)
            pipe.execute()
        return Replayed(entry_id, new_turn_id, first=first, resumed_from_checkpoint=resumed)

    def purge(self, *, reason: str | None = None, older_than_s: float | None = None) -> int:
        """Remove entries (all, or those of `reason`, or failed more than `older_than_s` ago)."""
        upper = "+inf" if older_than_s is None else now_ms() - int(older_than_s * 1000)
        ids: Any = self._redis.zrangebyscore(self._keys.dead_letter_index, "-inf", upper)
        if reason is not None:
            ids = [
                entry["id"].encode()
                for entry in self._entries(ids)
                if entry.get("reason") == reason
            ]
        if not ids:
            return 0
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.hdel(self._keys.dead_letters, *ids)
            pipe.zrem(self._keys.dead_letter_index, *ids)
            pipe.execute()
        return len(ids)
