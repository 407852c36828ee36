"""Turn records: the source of truth for every turn, changed only by the Lua scripts in
tasks/store/lua/, so each state change is atomic with the queue, lease and index updates that go
with it. Each script is loaded as three parts (`_source`): a prelude generated from
tasks/core/schema.py (the names of the states, events, record fields and replies, and the
script's KEYS and ARGV by name: schema.lua_prelude), then the functions of
tasks/store/lua/common.lua it calls (the server clock, the lease encoding, ending a turn), then
the script's own body. Every script touches the keys of one shard only (but due_probe, which
only reads, one member of each time index of the shards on one Redis node), and every call
here passes its KEYS and ARGV by name (schema.ScriptSchema).

The states of a turn and what moves it, each by one script (the only transitions there are):

    from            script       to             when
    (nothing)       register     queued         a turn is submitted; it waits behind the
                                                earlier turns of its conversation
    queued          claim        running        it is the head of its conversation's queue
                                                and no lease is live
    waiting         claim        running        its retry is due (the pump wakes it)
    running         claim        running        its lease expired (the worker died or
                                                stalled): another takes it over from its
                                                last checkpoint
    running         handover     queued         its worker shuts down (a deploy): the lease is
                                                released at once, and the next claim goes on
                                                with the same delivery from its checkpoint
    running         retry        waiting        a resumable failure, attempts left
    running         pause        paused         the run waits for a person's decisions
    paused          decide       queued         the last request of the pause is decided; it
                                                keeps its place at the head of the queue
    running         succeed      succeeded      the run answered
    running         dead_letter  dead_lettered  not resumable, attempts spent, poison, bad
                                                input, agent error
    any unfinished  dead_letter  dead_lettered  forced without the lease (token ''): its
                                                deadline passed, its pause expired, a bad
                                                payload (never claimed: no conversation to
                                                queue in)
    any unfinished  cancel       cancelled      cancel_turn, cancel_conversation, a revoke

A turn runs only while it is the head of its conversation's queue and holds the conversation
lease; every write a running turn makes is checked against its lease token, so a worker that
stalled past its lease cannot write over the worker that took the turn over. Ending a turn
(succeeded, dead_lettered or cancelled: the terminal states) takes it off the queue and marks
the next head as woken.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import orjson
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import RedisClusterException, RedisError

from agent import AgentRunCheckpoint
from tasks.core import schema
from tasks.core.errors import BadPayload, InvalidTurnRequest, UnreadableRecord
from tasks.core.keys import Keys, ShardKeys
from tasks.core.namespaces import in_namespace_of
from tasks.core.payload import deadline_ms
from tasks.core.schema import REGISTERED, Field, FieldPrefix, Outcome, ScriptSchema
from tasks.core.schema import ClaimStatus as ClaimStatus
from tasks.core.schema import Registered as Registered
from tasks.core.schema import TurnState as TurnState
from tasks.store.client import LuaScript, StateClient
from tasks.store.progress import Frame, progress_checkpoint

logger = logging.getLogger("agentjobs.records")

# How long a first submission's turn-id marker stands: past it, the record it registered is
# the evidence of who owns the id (claim_turn_id).
TURN_ID_MARKER_TTL_S = 60


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _int(fields: dict[str, str], name: str, default: int = 0) -> int:
    raw = fields.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        # An older version stored some times as float text ('1.7e+12'): read them as ms.
        number = float(raw)
        if not math.isfinite(number):
            raise
        return int(number)


def _json(fields: dict[str, str], name: str) -> Any:
    raw = fields.get(name)
    return orjson.loads(raw) if raw else None


@dataclass(frozen=True)
class TurnRecord:
    """One turn as Redis holds it (the hash at ShardKeys.turn)."""

    turn_id: str
    state: TurnState
    agent: str
    conversation_id: str
    namespace: str
    payload: Any  # the run_turn keyword arguments as submitted
    attempt: int  # 1 for the first; a retry starts the next
    deliveries: int  # starts of the current attempt (crash redeliveries count)
    redeliveries: int  # starts beyond the first, over all attempts
    iteration: int  # the turn's iteration in flight or last persisted, across attempts
    created_at_ms: int
    updated_at_ms: int
    started_at_ms: int = 0
    finished_at_ms: int = 0
    due_at_ms: int = 0
    first_failed_at_ms: int = 0
    worker: str = ""
    token: str = ""
    # The last persisted progress (tasks/store/progress.py): a whole checkpoint (JSON) and/or
    # frames on top of it or of the stored conversation, until the turn succeeds. Read it
    # with TurnRecords.progress.
    checkpoint: bytes = b""
    frames: tuple[bytes, ...] = ()
    base: bytes = b""  # the stored conversation the frames build on, kept once the turn ended
    base_frames: tuple[Frame, ...] = ()  # ... and the conversation frames on that envelope
    journal: dict[str, bytes] = field(default_factory=dict)  # tasks/store/journal.py
    last_error: str = ""  # redacted
    result: Any = None  # the reply dict of a succeeded turn
    dlq_id: str = ""
    reason: str = ""
    replay_of: str = ""
    replayed_as: str = ""  # the turn id a dead-letter replay of this turn got
    deadline_at_ms: int = 0
    cancel_reason: str = ""
    handovers: int = 0  # times a worker that was shutting down handed it to another
    paused_at_ms: int = 0  # while paused
    pause_expires_at_ms: int = 0
    # A person's decisions by request id (the body tasks/operate/people.py wrote) and who made them.
    decisions: dict[str, bytes] = field(default_factory=dict)
    deciders: dict[str, str] = field(default_factory=dict)
    # W3C trace context (JSON carrier) its attempts' spans join (tasks/telemetry/tracing.py), or "".
    trace: str = ""
    # When a queued turn became the head of its conversation (runnable); 0 while behind one.
    runnable_at_ms: int = 0
    # While waiting for a budget or a tenant cap (not a retry): "budget" or "tenant_tokens".
    waiting_for: str = ""

    @classmethod
    def from_redis(cls, turn_id: str, raw: Any) -> TurnRecord:
        """The record a Redis hash holds, or UnreadableRecord naming what is wrong with it."""
        try:
            return cls._from_redis(turn_id, raw)
        except UnreadableRecord:
            raise
        except (KeyError, ValueError, TypeError, AttributeError, orjson.JSONDecodeError) as exc:
            problem = f"field {exc.args[0]!r} missing" if isinstance(exc, KeyError) else str(exc)
            raise UnreadableRecord(turn_id, problem[:200]) from None

    @classmethod
    def _from_redis(cls, turn_id: str, raw: Any) -> TurnRecord:
        # One pass: the small fields decoded, the large ones (_LARGE_FIELDS) kept as bytes.
        fields: dict[str, str] = {}
        large: dict[str, bytes] = {}
        for key, value in raw.items():
            name = key.decode() if isinstance(key, bytes) else key
            if name in _LARGE_FIELDS or name.startswith(_LARGE_PREFIXES):
                large[name] = value if isinstance(value, bytes) else value.encode()
            else:
                fields[name] = value.decode() if isinstance(value, bytes) else value
        count = _int(fields, Field.FRAMES)
        frames = tuple(large.get(f"{FieldPrefix.FRAME}{n}", b"") for n in range(1, count + 1))
        return cls(
            turn_id=turn_id,
            state=TurnState(fields[Field.STATE]),
            agent=fields.get(Field.AGENT, ""),
            conversation_id=fields.get(Field.CONVERSATION_ID, ""),
            namespace=fields.get(Field.NAMESPACE, ""),
            payload=_json(fields, Field.PAYLOAD),
            attempt=_int(fields, Field.ATTEMPT, 1),
            deliveries=_int(fields, Field.DELIVERIES),
            redeliveries=_int(fields, Field.REDELIVERIES),
            iteration=_int(fields, Field.ITERATION),
            created_at_ms=_int(fields, Field.CREATED_AT_MS),
            updated_at_ms=_int(fields, Field.UPDATED_AT_MS),
            started_at_ms=_int(fields, Field.STARTED_AT_MS),
            finished_at_ms=_int(fields, Field.FINISHED_AT_MS),
            due_at_ms=_int(fields, Field.DUE_AT_MS),
            waiting_for=fields.get(Field.WAITING_FOR, ""),
            first_failed_at_ms=_int(fields, Field.FIRST_FAILED_AT_MS),
            worker=fields.get(Field.WORKER, ""),
            token=fields.get(Field.TOKEN, ""),
            checkpoint=large.get(Field.CHECKPOINT, b""),
            frames=frames,
            base=large.get(Field.BASE, b""),
            base_frames=_frames_array(large.get(Field.BASE_FRAMES, b"")),
            journal={name: value for name, value in large.items() if name.startswith(_JOURNAL)},
            last_error=fields.get(Field.LAST_ERROR, ""),
            result=_json(fields, Field.RESULT),
            dlq_id=fields.get(Field.DLQ_ID, ""),
            reason=fields.get(Field.REASON, ""),
            replay_of=fields.get(Field.REPLAY_OF, ""),
            replayed_as=fields.get(Field.REPLAYED_AS, ""),
            deadline_at_ms=_int(fields, Field.DEADLINE_AT_MS),
            cancel_reason=fields.get(Field.CANCEL_REASON, ""),
            handovers=_int(fields, Field.HANDOVERS),
            paused_at_ms=_int(fields, Field.PAUSED_AT_MS),
            pause_expires_at_ms=_int(fields, Field.PAUSE_EXPIRES_AT_MS),
            decisions={
                name.removeprefix(_DECISION): value
                for name, value in large.items()
                if name.startswith(_DECISION)
            },
            deciders={
                name.removeprefix(FieldPrefix.DECIDED_BY): value
                for name, value in fields.items()
                if name.startswith(FieldPrefix.DECIDED_BY)
            },
            trace=fields.get(Field.TRACE, ""),
            runnable_at_ms=_int(fields, Field.RUNNABLE_AT_MS),
        )

    def as_dict(self, progress: AgentRunCheckpoint | None = None) -> dict[str, Any]:
        """The record for people and JSON output (camelCase keys, no lease token), with its
        progress when given (TurnRecords.progress)."""
        return {
            "turnId": self.turn_id,
            "state": str(self.state),
            "agent": self.agent,
            "conversationId": self.conversation_id,
            "namespace": self.namespace,
            "attempt": self.attempt,
            "deliveries": self.deliveries,
            "redeliveries": self.redeliveries,
            "handovers": self.handovers,
            "iteration": self.iteration,
            "createdAtMs": self.created_at_ms,
            "updatedAtMs": self.updated_at_ms,
            "startedAtMs": self.started_at_ms or None,
            "finishedAtMs": self.finished_at_ms or None,
            "dueAtMs": self.due_at_ms or None,
            "firstFailedAtMs": self.first_failed_at_ms or None,
            "worker": self.worker or None,
            "lastError": self.last_error or None,
            "deadLetterId": self.dlq_id or None,
            "reason": self.reason or None,
            "replayOf": self.replay_of or None,
            "replayedAs": self.replayed_as or None,
            "deadlineAtMs": self.deadline_at_ms or None,
            "cancelReason": self.cancel_reason or None,
            "payload": self.payload,
            "result": self.result,
            "checkpoint": progress.wire() if progress is not None else None,
        }


def _frames_array(raw: bytes) -> tuple[Frame, ...]:
    """The conversation frames keep_base (common.lua) kept as one JSON array."""
    if not raw:
        return ()
    frames = orjson.loads(raw)
    if not isinstance(frames, list) or not all(isinstance(frame, dict) for frame in frames):
        raise ValueError(f"{Field.BASE_FRAMES} is not an array of frames")
    return tuple(frames)


# Fields kept as bytes, not decoded with the small ones (plain str, for the set lookup).
_LARGE_FIELDS = frozenset(str(name) for name in (Field.CHECKPOINT, Field.BASE, Field.BASE_FRAMES))
_JOURNAL, _DECISION = str(FieldPrefix.JOURNAL), str(FieldPrefix.DECISION)
_LARGE_PREFIXES = (str(FieldPrefix.FRAME), _JOURNAL, _DECISION)


@dataclass(frozen=True)
class Claim:
    status: ClaimStatus
    record: TurnRecord | None = None
    # The stored conversation envelope, when the turn starts from it (no checkpoint of its own),
    # and the conversation frames on it (tasks/store/conversations.py).
    stored: bytes | None = None
    stored_frames: tuple[bytes, ...] = ()
    # Held turns the fairness gate admitted with this claim, for the worker to publish
    # (tasks/turn/fairness.py).
    released: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class Ended:
    """What ending a turn did: whether this call ended it, and the conversation's next head."""

    ended: bool
    next_head: str | None = None
    next_head_agent: str = ""


@dataclass(frozen=True)
class CeleryResult:
    """A succeeded turn's Celery result as the result backend would store it: its key, the
    encoded meta and the results' expiry (0: none). Written by succeed when the backend is
    the state Redis (tasks/queue/results.py)."""

    key: str
    meta: bytes
    ttl_s: int


@dataclass(frozen=True)
class Due:
    turn_id: str
    namespace: str
    agent: str = ""
    conversation_id: str = ""


@functools.cache
def _source(name: str) -> str:
    """The text of script `name` as Redis runs it: the prelude schema.lua_prelude generates for
    it, the functions of common.lua it uses (schema.lua_common), then tasks/store/lua/<name>.lua.
    The same files give the same text, so the same SHA."""
    lua = resources.files("tasks.store") / "lua"
    body = (lua / f"{name}.lua").read_text()
    code = schema.lua_common((lua / "common.lua").read_text(), body) + "\n" + body
    return schema.lua_prelude(schema.SCRIPTS[name], code) + code


class TurnRecords:
    """The turn records and the conversation queues and leases that go with them."""

    def __init__(
        self, client: StateClient, keys: Keys, *, gate: tuple[str, bytes] = ("", b"")
    ) -> None:
        self._redis = client
        self._keys = keys
        # The tenant fairness gate's key tag and settings, ('', b'') when off
        # (tasks/queue/context.py, fairness_gate; tasks/turn/fairness.py).
        self.gate = gate
        self._scripts: dict[str, LuaScript] = {}
        self.unreadable_seen: set[str] = set()  # logged once per process
        self._probe_failures: set[str] = set()  # due_indices: each logged once

    @property
    def keys(self) -> Keys:
        return self._keys

    def script(self, name: str) -> LuaScript:
        """tasks/store/lua/<name>.lua with its prelude and common.lua in front (`_source`),
        registered once per client. Called with KEYS and ARGV in the order of
        schema.SCRIPTS[name]."""
        found = self._scripts.get(name)
        if found is None:
            found = self._scripts[name] = LuaScript(self._redis, _source(name))
        return found

    def _run(
        self,
        script: ScriptSchema,
        keys: Mapping[str, str],
        args: Mapping[str, Any],
        rest: Sequence[Any] = (),
    ) -> Any:
        """Run `script` with its KEYS and ARGV given by name (and what follows the named ARGV)."""
        ordered = script.args_from(args, rest)
        return self.script(script.name)(keys=script.keys_from(keys), args=ordered)

    def get(self, turn_id: str, namespace: str | None = None) -> TurnRecord | None:
        """The turn's record; without its namespace every shard is asked (one round trip).
        Raises UnreadableRecord for a record that cannot be read (sweeps use `readable`)."""
        if namespace is not None:
            raw: Any = self._redis.hgetall(self._keys.for_namespace(namespace).turn(turn_id))
            return TurnRecord.from_redis(turn_id, raw) if raw else None
        with self._redis.pipeline(transaction=False) as pipe:
            for shard in self._keys.all_shards():
                pipe.hgetall(shard.turn(turn_id))
            found = [raw for raw in pipe.execute() if raw]
        if not found:
            return None
        # A turn id belongs to one namespace (claim_turn_id): more than one record means two
        # conversations of one shard hold the key, which register.lua refuses; read the first.
        return TurnRecord.from_redis(turn_id, found[0])

    def find(self, turn_id: str, identity: Mapping[str, Any] | None = None) -> TurnRecord | None:
        """The record a by-id call acts on: with `identity` (the mapping run_turn takes), a
        turn of another tenant, principal or conversation is exactly as unknown as a turn that
        never was, so the call tells its caller nothing about it."""
        record = self.get(turn_id)
        if record is None or identity is None:
            return record
        try:
            mine = in_namespace_of(record.namespace, identity)
        except BadPayload as exc:
            raise InvalidTurnRequest(exc.field, exc.problem) from None
        return record if mine else None

    def readable(self, turn_id: str, namespace: str | None = None) -> TurnRecord | None:
        """`get` for a sweep (the pump, heartbeats, listings): an unreadable record is noted
        once (note_unreadable) and read as missing, so one damaged record stops nobody."""
        try:
            return self.get(turn_id, namespace)
        except UnreadableRecord as exc:
            self.note_unreadable(exc)
            return None

    def sweep(self, items: Iterable[Due], action: Callable[[Due], int]) -> int:
        """Apply `action` to each due entry of a sweep (the pump), adding up what it returns.
        One whose record cannot be read, or whose handling fails for a reason of its own, is
        logged once and skipped (it stays in its index, pushed back in time): no record stops
        a sweep for everyone else. A store that is away stops the sweep (RedisError)."""
        done = 0
        for due in items:
            try:
                done += action(due)
            except RedisError:
                raise
            except UnreadableRecord as exc:
                self.note_unreadable(exc)
            except Exception as exc:
                if due.turn_id not in self.unreadable_seen:
                    logger.exception("turn %s could not be handled; skipping it", due.turn_id)
                problem = f"it could not be handled: {type(exc).__name__}"
                self.note_unreadable(UnreadableRecord(due.turn_id, problem))
        return done

    def note_unreadable(self, exc: UnreadableRecord) -> None:
        """Log an unreadable record once per process and add it to the set `agentjobs stats`
        counts (best effort: a store that refuses the write still lets the sweep go on)."""
        if exc.turn_id in self.unreadable_seen:
            return
        self.unreadable_seen.add(exc.turn_id)
        logger.error("%s", exc)
        try:
            self._redis.sadd(self._keys.unreadable_records, exc.turn_id)
        except Exception as write_error:  # noted in the log above; counting is a nicety
            logger.debug("could not count unreadable record %s: %s", exc.turn_id, write_error)

    def owner_of(self, turn_id: str) -> set[str]:
        """The namespaces holding a record of `turn_id`, over every shard (one round trip)."""
        with self._redis.pipeline(transaction=False) as pipe:
            self._ask_namespaces(pipe, turn_id)
            return {_text(found) for found in pipe.execute() if found is not None}

    def _ask_namespaces(self, pipe: Any, turn_id: str) -> None:
        """Queue on `pipe` a read of each shard's record of `turn_id` for its namespace."""
        for shard in self._keys.all_shards():
            pipe.hget(shard.turn(turn_id), Field.NAMESPACE)

    def claim_turn_id(self, turn_id: str, namespace: str) -> bool:
        """Whether `turn_id` may name a turn of `namespace`: no other conversation holds a
        record, result or dead letter of it (a dead-lettered record lives as long as its entry,
        a finished one as long as its Celery result). The short-lived marker makes two
        concurrent first submissions of one id for two conversations agree on one of them;
        after it expires the record is the evidence. One round trip."""
        marker = self._keys.turn_id_owner(turn_id)
        with self._redis.pipeline(transaction=False) as pipe:
            pipe.set(marker, namespace, nx=True, ex=TURN_ID_MARKER_TTL_S)
            pipe.get(marker)
            self._ask_namespaces(pipe, turn_id)
            replies = pipe.execute()
        marked = replies[1]
        if marked is not None and _text(marked) != namespace:
            return False
        return all(_text(found) == namespace for found in replies[2:] if found is not None)

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
        deadline_s: float = 0,
        trace: str = "",
        tenant: str = "",
        gated: bool = False,
        publish: tuple[str, bytes] | None = None,
    ) -> Registered:
        """Record a submitted turn and queue it behind its conversation's earlier turns, with
        the trace context its attempts join (`trace`, tasks/telemetry/tracing.py). A turn id already
        recorded is left as it is. `publish`: (the broker's list, the message) to push a new
        turn's message in the same step, when the broker is this Redis (a client that is not
        a Cluster's: the list's key is in no turn's slot)."""
        k = self._keys.for_namespace(namespace)
        keys = self._queue_keys(k, turn_id, namespace)
        keys["broker_queue"] = publish[0] if publish else keys["turn"]
        args = {
            "turn_id": turn_id,
            "payload": payload,
            "agent": agent,
            "conversation_id": conversation_id,
            "namespace": namespace,
            "checkpoint": checkpoint,
            "replay_of": replay_of,
            "deadline_ms": deadline_ms(deadline_s) if deadline_s else 0,
            "trace": trace,
            "gate": self.gate[0] if gated else "",
            "gate_cfg": self.gate[1] if gated else b"",
            "tenant": tenant,
            "message": publish[1] if publish else b"",
        }
        created = int(self._run(schema.REGISTER, keys, args))
        return REGISTERED.get(created, Registered.CONFLICT)

    def unregister(self, turn_id: str, namespace: str) -> None:
        """Undo register for a turn whose message could not be published."""
        k = self._keys.for_namespace(namespace)
        keys = self._queue_keys(k, turn_id, namespace)
        self._run(schema.UNREGISTER, keys, {"turn_id": turn_id})

    def _queue_keys(self, k: ShardKeys, turn_id: str, namespace: str) -> dict[str, str]:
        # The keys register.lua and unregister.lua take, by name.
        return {
            "turn": k.turn(turn_id),
            "queue": k.queue(namespace),
            "pending": k.pending,
            "events": k.events(turn_id),
            "deadlines": k.deadlines,
            "submitted": k.submitted,
        }

    def claim(
        self, turn_id: str, namespace: str, token: str, lease_ttl_s: float, worker: str
    ) -> Claim:
        """Take the turn if it may run now. One round trip, which also returns its record and,
        for a turn starting from the stored conversation, that conversation (its envelope and
        conversation frames)."""
        k = self._keys.for_namespace(namespace)
        keys = {
            "turn": k.turn(turn_id),
            "queue": k.queue(namespace),
            "lease": k.lease(namespace),
            "retries": k.retries,
            "running": k.running,
            "pending": k.pending,
            "conversation": k.conversation(namespace),
            "conversation_frames": k.conversation_frames(namespace),
            "events": k.events(turn_id),
        }
        args = {
            "turn_id": turn_id,
            "token": token,
            "lease_ms": int(lease_ttl_s * 1000),
            "worker": worker,
            "gate": self.gate[0],
            "gate_cfg": self.gate[1],
        }
        reply = self._run(schema.CLAIM, keys, args)
        status = ClaimStatus(_text(reply[0]))
        if status is not ClaimStatus.CLAIMED:
            return Claim(status)
        flat = reply[2]
        raw = {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)}
        stored = reply[3] if isinstance(reply[3], bytes) else None
        frames = tuple(reply[4]) if stored is not None and len(reply) > 4 else ()
        released = tuple(reply[5]) if len(reply) > 5 else ()
        return Claim(status, TurnRecord.from_redis(turn_id, raw), stored, frames, released)

    def renew(
        self,
        turn_id: str,
        namespace: str,
        token: str,
        lease_ttl_s: float,
        frame: bytes | None = None,
        iteration: int = 0,
        *,
        ends_iteration: bool = True,
        finished: Sequence[bytes] = (),
    ) -> bool:
        """Extend the lease; with a progress frame (tasks/store/progress.py), also persist it, and
        when it `ends_iteration`, drop that iteration's journal, writing first a `tool.finished`
        event for each of `finished` (the event data of calls whose outcomes the frame holds
        and the journal did not get). False when the lease is no longer this turn's."""
        if finished and frame is None:
            raise ValueError("tool.finished events go with a progress frame")
        k = self._keys.for_namespace(namespace)
        args: dict[str, Any] = {
            "turn_id": turn_id,
            "token": token,
            "lease_ms": int(lease_ttl_s * 1000),
        }
        if frame is not None:
            args.update(frame=frame, iteration=iteration, ends_iteration=int(ends_iteration))
        keys = {
            "turn": k.turn(turn_id),
            "lease": k.lease(namespace),
            "running": k.running,
            "events": k.events(turn_id),
        }
        return bool(self._run(schema.PROGRESS, keys, args, finished))

    def hand_over(
        self, turn_id: str, namespace: str, token: str, *, worker: str, reason: str
    ) -> Due | None:
        """Release a running turn's lease for another worker to claim at once, queued again with
        its last persisted checkpoint; returns what to wake, or None when the lease was no
        longer this turn's."""
        k = self._keys.for_namespace(namespace)
        keys = {
            "turn": k.turn(turn_id),
            "lease": k.lease(namespace),
            "running": k.running,
            "pending": k.pending,
            "events": k.events(turn_id),
        }
        args = {"turn_id": turn_id, "token": token, "worker": worker, "reason": reason}
        reply = self._run(schema.HANDOVER, keys, args)
        if _text(reply[0]) != Outcome.OK:
            return None
        return Due(turn_id, namespace, _text(reply[1]), _text(reply[2]))

    def pause(
        self,
        turn_id: str,
        namespace: str,
        token: str,
        *,
        ttl_s: float,
        frame: bytes,
        requests: bytes,
        kinds: list[tuple[str, str]],
        journal: dict[str, bytes],
    ) -> int:
        """Pause a running turn for a person (tasks/store/lua/pause.lua): its progress `frame`, its
        `requests` (JSON) with each (request id, kind), and journal fields not yet written.
        Returns the pause's expiry (server epoch ms), or 0 when the lease was not this turn's."""
        k = self._keys.for_namespace(namespace)
        keys = {
            "turn": k.turn(turn_id),
            "lease": k.lease(namespace),
            "running": k.running,
            "events": k.events(turn_id),
            "deadlines": k.deadlines,
            "pauses": k.pauses,
        }
        args = {
            "turn_id": turn_id,
            "token": token,
            "ttl_ms": int(ttl_s * 1000),
            "frame": frame,
            "requests": requests,
            "request_count": len(kinds),
        }
        rest: list[Any] = [item for pair in kinds for item in pair]
        rest += [item for pair in journal.items() for item in pair]
        return int(self._run(schema.PAUSE, keys, args, rest))

    def decide(
        self,
        turn_id: str,
        namespace: str,
        request_id: str,
        *,
        decision: str,
        body: bytes,
        actor: str,
        event: bytes,
    ) -> list[str]:
        """Record a decision on a paused turn's request (tasks/store/lua/decide.lua); the script's
        reply as text (a schema.Decided first: recorded, resumed with agent and conversation
        id, or a refusal)."""
        k = self._keys.for_namespace(namespace)
        keys = {
            "turn": k.turn(turn_id),
            "events": k.events(turn_id),
            "deadlines": k.deadlines,
            "pauses": k.pauses,
            "pending": k.pending,
        }
        args = {
            "turn_id": turn_id,
            "request_id": request_id,
            "decision": decision,
            "body": body,
            "actor": actor,
            "event": event,
        }
        return [_text(item) for item in self._run(schema.DECIDE, keys, args)]

    def keep_trace(self, turn_id: str, namespace: str, token: str, trace: str) -> str | None:
        """Record `trace` as the context the turn's attempts join, unless one is recorded;
        returns the one recorded, or None when the lease is no longer this turn's."""
        k = self._keys.for_namespace(namespace)
        keys = {"turn": k.turn(turn_id), "lease": k.lease(namespace)}
        kept = self._run(schema.TRACE, keys, {"turn_id": turn_id, "token": token, "trace": trace})
        return _text(kept) if kept else None

    def write_journal(
        self,
        turn_id: str,
        namespace: str,
        token: str,
        fields: dict[str, bytes],
        *,
        event_type: str = "",
        event_data: bytes = b"{}",
    ) -> bool:
        """Write journal fields of the iteration in flight (tasks/store/journal.py), with an event
        in the same step when given; False when the lease is no longer this turn's."""
        k = self._keys.for_namespace(namespace)
        keys = {"turn": k.turn(turn_id), "lease": k.lease(namespace), "events": k.events(turn_id)}
        args = {
            "turn_id": turn_id,
            "token": token,
            "event_type": event_type,
            "event_data": event_data,
        }
        flat = [item for pair in fields.items() for item in pair]
        return bool(self._run(schema.JOURNAL, keys, args, flat))

    def write_tokens(
        self, turn_id: str, namespace: str, token: str, text: str, *, check_ms: int
    ) -> bool:
        """Append streamed answer text as a token.delta event (tasks/store/lua/tokens.lua); the
        pump first looks at the turn's deltas `check_ms` later. False when the lease is no
        longer this turn's."""
        k = self._keys.for_namespace(namespace)
        keys = {
            "turn": k.turn(turn_id),
            "lease": k.lease(namespace),
            "events": k.events(turn_id),
            "tokens": k.tokens,
        }
        args = {
            "turn_id": turn_id,
            "token": token,
            "data": orjson.dumps({"text": text}),
            "check_ms": check_ms,
        }
        return bool(self._run(schema.TOKENS, keys, args))

    def drop_tokens(self, shard: ShardKeys, turn_id: str, *, ttl_ms: int) -> bool:
        """Remove the token.delta events of a turn of `shard`'s token index that ended `ttl_ms`
        ago (True), or put it back in the index for when it will have (False)."""
        keys = {
            "turn": shard.turn(turn_id),
            "events": shard.events(turn_id),
            "tokens": shard.tokens,
        }
        args = {"turn_id": turn_id, "ttl_ms": ttl_ms}
        return int(self._run(schema.DROP_TOKENS, keys, args)) == 0

    def progress(self, record: TurnRecord) -> AgentRunCheckpoint | None:
        """The turn's last persisted progress as a checkpoint (tasks/store/progress.py), reading the
        stored conversation (envelope and frames, one round trip) when its frames build on it;
        None when it has none of its own."""
        stored, stored_frames = record.base or None, record.base_frames
        if record.frames and not record.checkpoint and stored is None and record.namespace:
            with self._redis.pipeline(transaction=False) as pipe:
                pipe.get(self._keys.conversation(record.namespace))
                pipe.lrange(self._keys.conversation_frames(record.namespace), 0, -1)
                found, listed = pipe.execute()
            if isinstance(found, bytes):
                stored, stored_frames = found, tuple(listed)
        return progress_checkpoint(record.checkpoint, record.frames, stored, stored_frames)

    def _ending_keys(self, k: ShardKeys, turn_id: str, namespace: str) -> dict[str, str]:
        # The keys common.lua's end_turn reads (schema.ENDING_KEYS), by name.
        return {
            "turn": k.turn(turn_id),
            "lease": k.lease(namespace),
            "running": k.running,
            "queue": k.queue(namespace),
            "retries": k.retries,
            "pending": k.pending,
            "finished": k.finished,
            "events": k.events(turn_id),
            "deadlines": k.deadlines,
            "conversation": k.conversation(namespace),
            "conversation_frames": k.conversation_frames(namespace),
            "pauses": k.pauses,
        }

    def succeed(
        self,
        turn_id: str,
        namespace: str,
        token: str,
        *,
        envelope: bytes = b"",
        frame: bytes = b"",
        result: bytes,
        ttl_s: int,
        celery_result: CeleryResult | None = None,
        usage: bytes = b"",
    ) -> Ended:
        """Store the conversation and end the turn, atomically: a whole `envelope` (dropping
        the conversation frames) or one conversation `frame` appended, exactly one of them
        (tasks/store/conversations.py, turn_write); with `celery_result`, write the turn's
        Celery result in the same step."""
        if bool(envelope) == bool(frame):
            raise ValueError("succeed stores the conversation as an envelope or as a frame")
        k = self._keys.for_namespace(namespace)
        keys = self._ending_keys(k, turn_id, namespace)
        keys["celery_result"] = celery_result.key if celery_result else keys["turn"]
        args = {
            "turn_id": turn_id,
            "token": token,
            "envelope": envelope,
            "frame": frame,
            "result": result,
            "ttl_s": ttl_s,
            "turn_prefix": k.turn_prefix,
            "celery_meta": celery_result.meta if celery_result else b"",
            "celery_ttl_s": celery_result.ttl_s if celery_result else 0,
        }
        if usage:
            args["usage"] = usage
        return _ended(self._run(schema.SUCCEED, keys, args))

    def schedule_retry(
        self,
        turn_id: str,
        namespace: str,
        token: str,
        *,
        delay_ms: int,
        next_attempt: int,
        checkpoint: bytes,
        error: str,
    ) -> int:
        """Park the turn until `delay_ms` from now by the server's clock; returns the due time
        (epoch ms), or 0 when the lease was no longer this turn's."""
        keys = self._waiting_keys(turn_id, namespace)
        args = {
            "turn_id": turn_id,
            "token": token,
            "delay_ms": delay_ms,
            "next_attempt": next_attempt,
            "checkpoint": checkpoint,
            "error": error,
        }
        return int(self._run(schema.RETRY, keys, args))

    def _waiting_keys(self, turn_id: str, namespace: str) -> dict[str, str]:
        # The keys retry.lua and wait.lua take, by name.
        k = self._keys.for_namespace(namespace)
        return {
            "turn": k.turn(turn_id),
            "lease": k.lease(namespace),
            "running": k.running,
            "retries": k.retries,
            "events": k.events(turn_id),
        }

    def wait(
        self,
        turn_id: str,
        namespace: str,
        token: str,
        *,
        due_at_ms: int,
        waiting_for: str,
        budget: str,
        limit: str,
    ) -> int:
        """Park the turn until `due_at_ms` (server epoch ms) for a budget or a tenant cap
        (tasks/store/lua/wait.lua); returns the due time, or 0 when the lease was no longer
        this turn's."""
        keys = self._waiting_keys(turn_id, namespace)
        args = {
            "turn_id": turn_id,
            "token": token,
            "due_at_ms": due_at_ms,
            "waiting_for": waiting_for,
            "budget": budget,
            "limit": limit,
        }
        return int(self._run(schema.WAIT, keys, args))

    def gate_fill(self, limit: int) -> list[bytes]:
        """Admit held turns where the fairness gate has room (tasks/store/lua/gate_fill.lua);
        -> their refs, to publish. [] when the gate is off."""
        gate, config = self.gate
        if not gate:
            return []
        args = {"gate": gate, "gate_cfg": config, "limit": limit}
        return list(self._run(schema.GATE_FILL, {}, args) or [])

    def gate_sweep(self, stale_ms: int, limit: int) -> int:
        """Mend the fairness gate's counts (tasks/store/lua/gate_sweep.lua); -> how many."""
        gate, _ = self.gate
        if not gate:
            return 0
        args = {"gate": gate, "stale_ms": stale_ms, "limit": limit}
        return int(self._run(schema.GATE_SWEEP, {}, args))

    def add_usage(self, turn_id: str, namespace: str, usage: bytes) -> None:
        """Count reported tokens (tasks/budgets/usage.py, usage_json) in the turn's shard."""
        k = self._keys.for_namespace(namespace)
        self._run(schema.USAGE, {"turn": k.turn(turn_id)}, {"turn_id": turn_id, "usage": usage})

    def dead_letter(
        self,
        turn_id: str,
        namespace: str,
        token: str,
        *,
        entry_id: str,
        entry: bytes,
        reason: str,
        checkpoint: bytes = b"",
    ) -> Ended:
        """File the entry summary and end the turn, atomically (token '' for a turn that was
        never claimed). `checkpoint` replaces the record's when given."""
        k = self._keys.for_namespace(namespace)
        keys = self._ending_keys(k, turn_id, namespace)
        keys.update(dead_letters=k.dead_letters, dead_letter_index=k.dead_letter_index)
        args = {
            "turn_id": turn_id,
            "token": token,
            "entry_id": entry_id,
            "entry": entry,
            "reason": reason,
            "checkpoint": checkpoint,
            "turn_prefix": k.turn_prefix,
        }
        return _ended(self._run(schema.DEAD_LETTER, keys, args))

    def cancel(self, turn_id: str, namespace: str, *, reason: str, ttl_s: int) -> Ended:
        """End an unfinished turn as cancelled, whatever its state and whoever runs it."""
        k = self._keys.for_namespace(namespace)
        keys = self._ending_keys(k, turn_id, namespace)
        args = {"turn_id": turn_id, "reason": reason, "ttl_s": ttl_s, "turn_prefix": k.turn_prefix}
        return _ended(self._run(schema.CANCEL, keys, args))

    def take_due(
        self, shard: ShardKeys, index_key: str, *, limit: int, bump_ms: int, lag_ms: int = 0
    ) -> list[Due]:
        """Members of one of `shard`'s time indices due by the server's clock minus `lag_ms`,
        each pushed `bump_ms` later so another pump does not take it again meanwhile."""
        args = {
            "limit": limit,
            "bump_ms": bump_ms,
            "lag_ms": lag_ms,
            "turn_prefix": shard.turn_prefix,
        }
        flat = self._run(schema.TAKE_DUE, {"index": index_key}, args)
        return [Due(*(_text(v) for v in flat[i : i + 4])) for i in range(0, len(flat), 4)]

    def due_indices(self, indices: Mapping[str, int]) -> set[str]:
        """Which of `indices` (time index key -> lag_ms) hold a member due by the server's clock
        minus its lag, as take_due counts it, so the pump takes only from those. One due_probe
        call per Redis node, its argument packed once (_packed_by_slot): on a cluster the
        indices are grouped by the node serving their slot (a script without flags may read
        keys of several slots when they all live on its node). A cluster node whose probe
        fails (its slots moved, it is down) has all its indices reported due: take_due sweeps
        them through the cluster client, which follows the move or raises, as before."""
        by_slot = _packed_by_slot(tuple(indices.items()))
        if not isinstance(self._redis, RedisCluster):
            return self._probe(list(by_slot.values()))
        due: set[str] = set()
        by_node: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
        for packed, keys in by_slot.values():
            try:
                node = self._redis.get_node_from_key(keys[0]).name  # type: ignore[no-untyped-call]
            except RedisClusterException:  # a slot no node serves now: take_due will say
                due.update(keys)
                continue
            by_node.setdefault(node, []).append((packed, keys))
        for name, parts in by_node.items():
            try:
                server = self._redis.get_node(node_name=name)  # type: ignore[no-untyped-call]
                due |= self._probe(parts, self._redis.get_redis_connection(server))
            except RedisError as exc:
                if f"{name}: {exc}" not in self._probe_failures:
                    self._probe_failures.add(f"{name}: {exc}")
                    logger.warning("due probe on %s failed (%s); sweeping its shards", name, exc)
                due.update(key for _, keys in parts for key in keys)
        return due

    def _probe(
        self, parts: Sequence[tuple[str, tuple[str, ...]]], client: redis.Redis | None = None
    ) -> set[str]:
        """due_probe over the packed `parts` (of one node), on `client` (default: the store's)."""
        args = {"indices": " ".join(packed for packed, _ in parts)}
        if client is None:
            reply = self._run(schema.DUE_PROBE, {}, args)
        else:
            script = schema.DUE_PROBE
            ordered = script.args_from(args)
            reply = self.script(script.name)(keys=script.keys_from({}), args=ordered, client=client)
        keys = [key for _, held in parts for key in held]
        return {keys[int(position)] for position in reply}

    def has_ended(self, turn_id: str, namespace: str) -> bool:
        """Whether the turn's record says it ended (one field, one round trip)."""
        state = self._redis.hget(self._keys.for_namespace(namespace).turn(turn_id), Field.STATE)
        return state is not None and _text(state) in schema.TERMINAL_STATES

    def conversation_head(self, namespace: str) -> str | None:
        head = self._redis.lindex(self._keys.for_namespace(namespace).queue(namespace), 0)
        return _text(head) if isinstance(head, bytes | str) else None

    def turn_ahead(self, turn_id: str, namespace: str) -> str | None:
        """The turn just before `turn_id` in its conversation's queue, or None at the head."""
        queue = self._keys.for_namespace(namespace).queue(namespace)
        position: Any = self._redis.lpos(queue, turn_id)
        if not position:
            return None
        ahead = self._redis.lindex(queue, int(position) - 1)
        return _text(ahead) if isinstance(ahead, bytes | str) else None

    def lease_holder(self, namespace: str) -> str | None:
        """The turn id holding the conversation's lease, or None."""
        k = self._keys.for_namespace(namespace)
        holder = self._run(schema.LEASE_HOLDER, {"lease": k.lease(namespace)}, {})
        return _text(holder) if holder else None

    def server_time_ms(self) -> int:
        seconds, micros = self._redis.time()
        return int(seconds) * 1000 + int(micros) // 1000


@functools.lru_cache(maxsize=8)
def _packed_by_slot(pairs: tuple[tuple[str, int], ...]) -> dict[int, tuple[str, tuple[str, ...]]]:
    """Time indices (key, lag_ms) by hash slot, each slot's as due_probe reads them ("key lag_ms"
    pairs, space-separated) with its keys in that order. The pump asks about the same indices
    every tick: packed once, one argument however many shards."""
    by_slot: dict[int, list[tuple[str, int]]] = {}
    for key, lag_ms in pairs:
        if not key or any(c.isspace() for c in key):
            raise ValueError(f"time index {key!r}: a key without whitespace is expected")
        by_slot.setdefault(key_slot(key.encode()), []).append((key, int(lag_ms)))
    return {
        slot: (" ".join(f"{key} {lag_ms}" for key, lag_ms in held), tuple(k for k, _ in held))
        for slot, held in by_slot.items()
    }


def _ended(reply: list[Any]) -> Ended:
    if _text(reply[0]) != Outcome.OK:
        return Ended(False)
    head = reply[1] if len(reply) > 1 else None
    if not isinstance(head, list):
        return Ended(True)
    return Ended(True, _text(head[0]), _text(head[1]))
