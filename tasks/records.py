"""Turn records: the source of truth for every turn, changed only by the Lua scripts below so
each state change is atomic with the queue, lease and index updates that go with it.

States: queued -> running -> (waiting -> running)* -> succeeded | dead_lettered.

A turn runs only while it is the head of its conversation's queue and holds the conversation
lease (turn_id|token, renewed by a heartbeat). Every write a running turn makes is checked
against that token, so a worker that stalled past its lease cannot write over the worker that
took the turn over.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import redis

from tasks.keys import Keys

TERMINAL_STATES = frozenset({"succeeded", "dead_lettered"})


def now_ms() -> int:
    return int(time.time() * 1000)


_REGISTER = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'state', 'queued', 'payload', ARGV[3], 'agent', ARGV[4],
  'conversation_id', ARGV[5], 'namespace', ARGV[6], 'attempt', 1, 'deliveries', 0,
  'created_at_ms', ARGV[2], 'updated_at_ms', ARGV[2])
if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'checkpoint', ARGV[7]) end
if ARGV[8] ~= '' then redis.call('HSET', KEYS[1], 'replay_of', ARGV[8]) end
if ARGV[6] ~= '' then redis.call('RPUSH', KEYS[2], ARGV[1]) end
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
return 1
"""

_UNREGISTER = """
if redis.call('HGET', KEYS[1], 'state') ~= 'queued' then return 0 end
redis.call('DEL', KEYS[1])
redis.call('LREM', KEYS[2], 1, ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
return 1
"""

# KEYS: turn, convq, lease, retries, running, pending, conversation
# ARGV: turn_id, token, now_ms, lease_ms, worker
# -> {'claimed', deliveries, record fields..., stored envelope or false} or {status}
_CLAIM = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return {'missing'} end
if state == 'succeeded' or state == 'dead_lettered' then return {'done'} end
local now = tonumber(ARGV[3])
if state == 'waiting' and tonumber(redis.call('HGET', KEYS[1], 'due_at_ms')) > now then
  return {'not_due'}
end
if redis.call('LINDEX', KEYS[2], 0) ~= ARGV[1] then return {'not_head'} end
if redis.call('EXISTS', KEYS[3]) == 1 then return {'busy'} end
redis.call('SET', KEYS[3], ARGV[1] .. '|' .. ARGV[2], 'PX', ARGV[4])
local deliveries = redis.call('HINCRBY', KEYS[1], 'deliveries', 1)
if deliveries > 1 then redis.call('HINCRBY', KEYS[1], 'redeliveries', 1) end
redis.call('HSET', KEYS[1], 'state', 'running', 'token', ARGV[2], 'worker', ARGV[5],
  'started_at_ms', ARGV[3], 'updated_at_ms', ARGV[3])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1])
redis.call('ZADD', KEYS[5], now + tonumber(ARGV[4]), ARGV[1])
-- The stored conversation comes back with the claim when the turn starts from it; nobody
-- else writes it while this turn holds the head of the queue and the lease.
local stored = false
if redis.call('HEXISTS', KEYS[1], 'checkpoint') == 0 then stored = redis.call('GET', KEYS[7]) end
return {'claimed', deliveries, redis.call('HGETALL', KEYS[1]), stored}
"""

# KEYS: turn, lease, running   ARGV: turn_id, token, now_ms, lease_ms, [checkpoint, iteration]
_PROGRESS = """
if redis.call('GET', KEYS[2]) ~= ARGV[1] .. '|' .. ARGV[2] then return 0 end
redis.call('PEXPIRE', KEYS[2], ARGV[4])
redis.call('ZADD', KEYS[3], tonumber(ARGV[3]) + tonumber(ARGV[4]), ARGV[1])
if ARGV[5] then
  redis.call('HSET', KEYS[1], 'checkpoint', ARGV[5], 'iteration', ARGV[6], 'updated_at_ms', ARGV[3])
end
return 1
"""

# KEYS: turn, lease, running, convq, conversation, pending, finished
# ARGV: turn_id, token, now_ms, envelope, result, ttl_s
_SUCCEED = """
if redis.call('GET', KEYS[2]) ~= ARGV[1] .. '|' .. ARGV[2] then return {'lost'} end
redis.call('SET', KEYS[5], ARGV[4])
redis.call('HSET', KEYS[1], 'state', 'succeeded', 'result', ARGV[5], 'finished_at_ms', ARGV[3],
  'updated_at_ms', ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[6])
redis.call('ZADD', KEYS[7], ARGV[3], ARGV[1])
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('LREM', KEYS[4], 1, ARGV[1])
local head = redis.call('LINDEX', KEYS[4], 0)
if head then redis.call('ZADD', KEYS[6], 'XX', ARGV[3], head) end
return {'ok', head}
"""

# KEYS: turn, lease, running, retries
# ARGV: turn_id, token, now_ms, due_ms, next_attempt, checkpoint, error
_RETRY = """
if redis.call('GET', KEYS[2]) ~= ARGV[1] .. '|' .. ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'state', 'waiting', 'due_at_ms', ARGV[4], 'attempt', ARGV[5],
  'deliveries', 0, 'checkpoint', ARGV[6], 'last_error', ARGV[7], 'updated_at_ms', ARGV[3])
redis.call('HSETNX', KEYS[1], 'first_failed_at_ms', ARGV[3])
redis.call('ZADD', KEYS[4], ARGV[4], ARGV[1])
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[3], ARGV[1])
return 1
"""

# KEYS: turn, lease, running, convq, retries, pending, dlq, dlq_index, finished
# ARGV: turn_id, token ('' when the turn was never claimed), now_ms, entry_id, entry, reason,
#       ttl_s
_DEAD_LETTER = """
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'succeeded' or state == 'dead_lettered' then return {'done'} end
if ARGV[2] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[1] .. '|' .. ARGV[2] then
  return {'lost'}
end
redis.call('HSET', KEYS[7], ARGV[4], ARGV[5])
redis.call('ZADD', KEYS[8], ARGV[3], ARGV[4])
redis.call('HSET', KEYS[1], 'state', 'dead_lettered', 'dlq_id', ARGV[4], 'reason', ARGV[6],
  'finished_at_ms', ARGV[3], 'updated_at_ms', ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[7])
redis.call('ZADD', KEYS[9], ARGV[3], ARGV[1])
if ARGV[2] ~= '' then redis.call('DEL', KEYS[2]) end
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1])
redis.call('LREM', KEYS[4], 1, ARGV[1])
local head = redis.call('LINDEX', KEYS[4], 0)
if head then redis.call('ZADD', KEYS[6], 'XX', ARGV[3], head) end
return {'ok', head}
"""

# KEYS: index zset   ARGV: now_ms, limit, bump_ms -> members due, each re-scored to now+bump
_TAKE_DUE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, member in ipairs(due) do
  redis.call('ZADD', KEYS[1], tonumber(ARGV[1]) + tonumber(ARGV[3]), member)
end
return due
"""


@dataclass(frozen=True)
class TurnRecord:
    turn_id: str
    fields: Mapping[str, str]

    def get(self, name: str, default: str = "") -> str:
        return self.fields.get(name, default)

    def number(self, name: str, default: int = 0) -> int:
        raw = self.fields.get(name)
        return int(raw) if raw else default

    @property
    def state(self) -> str:
        return self.get("state")

    @property
    def namespace(self) -> str:
        return self.get("namespace")

    @property
    def payload(self) -> Any:
        raw = self.get("payload")
        return orjson.loads(raw) if raw else None

    def as_dict(self) -> dict[str, Any]:
        """The record for people and JSON output: numbers as numbers, JSON fields parsed."""
        out: dict[str, Any] = {"turnId": self.turn_id}
        for name, raw in sorted(self.fields.items()):
            if name in ("payload", "result", "checkpoint"):
                out[name] = orjson.loads(raw) if raw else None
            elif name.endswith("_ms") or name in ("attempt", "deliveries", "iteration"):
                out[name] = int(raw) if raw else None
            elif name != "token":
                out[name] = raw
        return out


@dataclass(frozen=True)
class Claim:
    status: str
    deliveries: int = 0
    record: TurnRecord | None = None
    # The stored conversation envelope, when the turn starts from it (no checkpoint of its own).
    stored: bytes | None = None

    @property
    def attempt(self) -> int:
        return self.record.number("attempt", 1) if self.record else 0


class TurnRecords:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self._redis = client
        self._keys = keys
        self._register = client.register_script(_REGISTER)
        self._unregister = client.register_script(_UNREGISTER)
        self._claim = client.register_script(_CLAIM)
        self._progress = client.register_script(_PROGRESS)
        self._succeed = client.register_script(_SUCCEED)
        self._retry = client.register_script(_RETRY)
        self._dead_letter = client.register_script(_DEAD_LETTER)
        self._take_due = client.register_script(_TAKE_DUE)

    @property
    def keys(self) -> Keys:
        return self._keys

    def get(self, turn_id: str) -> TurnRecord | None:
        raw: Any = self._redis.hgetall(self._keys.turn(turn_id))
        if not raw:
            return None
        return TurnRecord(turn_id, {_text(k): _text(v) for k, v in raw.items()})

    def register(
        self,
        turn_id: str,
        *,
        payload: bytes,
        agent: str,
        conversation_id: str,
        namespace: str,
        checkpoint: bytes = b"",
        replay_of: str = "",
    ) -> bool:
        """Record a submitted turn and queue it behind its conversation's earlier turns.
        Idempotent: a turn id already recorded is left as it is."""
        created = self._register(
            keys=[
                self._keys.turn(turn_id),
                self._keys.conversation_queue(namespace),
                self._keys.pending,
            ],
            args=[
                turn_id,
                now_ms(),
                payload,
                agent,
                conversation_id,
                namespace,
                checkpoint,
                replay_of,
            ],
        )
        return bool(created)

    def unregister(self, turn_id: str, namespace: str) -> None:
        """Undo register for a turn whose message could not be published."""
        self._unregister(
            keys=[
                self._keys.turn(turn_id),
                self._keys.conversation_queue(namespace),
                self._keys.pending,
            ],
            args=[turn_id],
        )

    def claim(
        self, turn_id: str, namespace: str, token: str, lease_ttl_s: float, worker: str
    ) -> Claim:
        """Take the turn if it may run now: the head of its conversation, no live lease, not
        waiting out a backoff, not ended. One round trip, which also returns its record."""
        keys = self._keys
        reply = self._claim(
            keys=[
                keys.turn(turn_id),
                keys.conversation_queue(namespace),
                keys.lease(namespace),
                keys.retries,
                keys.running,
                keys.pending,
                keys.conversation(namespace),
            ],
            args=[turn_id, token, now_ms(), int(lease_ttl_s * 1000), worker],
        )
        status = _text(reply[0])
        if status != "claimed":
            return Claim(status)
        flat = reply[2]
        fields = {_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat), 2)}
        stored = reply[3] if len(reply) > 3 and isinstance(reply[3], bytes) else None
        return Claim(status, int(reply[1]), TurnRecord(turn_id, fields), stored)

    def renew(
        self,
        turn_id: str,
        namespace: str,
        token: str,
        lease_ttl_s: float,
        checkpoint: bytes | None = None,
        iteration: int = 0,
    ) -> bool:
        """Extend the lease; with a checkpoint, also persist the turn's progress. False when
        the lease is no longer this turn's."""
        args: list[Any] = [turn_id, token, now_ms(), int(lease_ttl_s * 1000)]
        if checkpoint is not None:
            args += [checkpoint, iteration]
        keys = self._keys
        return bool(
            self._progress(
                keys=[keys.turn(turn_id), keys.lease(namespace), keys.running], args=args
            )
        )

    def succeed(
        self,
        turn_id: str,
        namespace: str,
        token: str,
        *,
        envelope: bytes,
        result: bytes,
        ttl_s: int,
    ) -> tuple[bool, str | None]:
        """Store the conversation and end the turn, atomically. Returns (ended, next head)."""
        keys = self._keys
        reply = self._succeed(
            keys=[
                keys.turn(turn_id),
                keys.lease(namespace),
                keys.running,
                keys.conversation_queue(namespace),
                keys.conversation(namespace),
                keys.pending,
                keys.finished,
            ],
            args=[turn_id, token, now_ms(), envelope, result, ttl_s],
        )
        return _ended(reply)

    def schedule_retry(
        self,
        turn_id: str,
        namespace: str,
        token: str,
        *,
        due_ms: int,
        next_attempt: int,
        checkpoint: bytes,
        error: str,
    ) -> bool:
        keys = self._keys
        return bool(
            self._retry(
                keys=[keys.turn(turn_id), keys.lease(namespace), keys.running, keys.retries],
                args=[turn_id, token, now_ms(), due_ms, next_attempt, checkpoint, error],
            )
        )

    def dead_letter(
        self,
        turn_id: str,
        namespace: str,
        token: str,
        *,
        entry_id: str,
        entry: bytes,
        reason: str,
        ttl_s: int,
    ) -> tuple[bool, str | None]:
        """File the entry and end the turn, atomically. Returns (ended, next head)."""
        keys = self._keys
        reply = self._dead_letter(
            keys=[
                keys.turn(turn_id),
                keys.lease(namespace),
                keys.running,
                keys.conversation_queue(namespace),
                keys.retries,
                keys.pending,
                keys.dead_letters,
                keys.dead_letter_index,
                keys.finished,
            ],
            args=[turn_id, token, now_ms(), entry_id, entry, reason, ttl_s],
        )
        return _ended(reply)

    def take_due(self, index_key: str, *, before_ms: int, limit: int, bump_ms: int) -> list[str]:
        """Members of a time index due by `before_ms`, each pushed `bump_ms` later so another
        pump (or the next tick) does not take it again while its wake-up is on the way."""
        due = self._take_due(keys=[index_key], args=[before_ms, limit, bump_ms])
        return [member.decode() for member in due]

    def conversation_head(self, namespace: str) -> str | None:
        head = self._redis.lindex(self._keys.conversation_queue(namespace), 0)
        return _text(head) if head is not None else None

    def lease_holder(self, namespace: str) -> str | None:
        raw = self._redis.get(self._keys.lease(namespace))
        return raw.decode().split("|", 1)[0] if isinstance(raw, bytes) else None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _ended(reply: list[Any]) -> tuple[bool, str | None]:
    status = reply[0].decode()
    head = reply[1] if len(reply) > 1 else None
    return status == "ok", head.decode() if isinstance(head, bytes) else None
