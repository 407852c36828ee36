"""A worker's broker connection through a Redis that refuses writes: maxmemory reached under
`noeviction` (OOM), or a primary turned replica (READONLY). Reads still work, so nothing
disconnects; kombu counts these replies as channel errors, which Celery's consumer does not
retry.

Without this, the first ack refused (kombu's Redis transport removes an acknowledged message
from its unacked index with ZREM + HDEL in MULTI, and Redis refuses every command queued in a
MULTI while over maxmemory) ends the worker main process: "Unrecoverable error:
server:OutOfMemoryError", its turns left `running` until the pump recovers them on another
worker, if there is one.

What changes, in kombu's Redis transport (patched in place, as queue/workarounds.py does, so it
holds for every URL scheme kombu maps to it: redis, rediss, sentinel):
- an ack or reject whose write is refused still frees its prefetch slot. Otherwise the slots
  fill with messages that can never be acked and the worker stops consuming for good. The
  message stays in Redis's unacked set and comes back after the visibility timeout: a
  duplicate wake-up, which the turn record drops.
- a delivery whose unacked record is refused is still handed to the worker, held in memory
  only; its turn cannot be claimed while writes are refused, and the pump wakes it again once
  they are accepted (a queued turn after AGENTJOBS_STALL_AFTER_S, a running one when its lease
  runs out).
- anything else refused (declaring the queues when the consumer restarts, publishing) counts
  as a connection error: the consumer reconnects, with Celery's backoff, instead of exiting.
One warning when Redis starts refusing the broker's writes, one line when it accepts them again.

A submission's registration and its message in one step (PublishFold): when the broker is the
state store's Redis, run_turn.delay registers the turn and pushes its message with one script
(tasks/store/lua/register.lua), a round trip fewer per turn. The message is the one kombu's
Redis transport builds and would push (Channel._put, patched here, takes it from there); a
publish kombu would not push as one LPUSH (a queue with an expiry, a publish batch, a global
key prefix) or a channel on another server is registered first and pushed by kombu as before.

Turn wake-ups held in memory only (hold_wakeups_in_memory, on in every worker unless
AGENTJOBS_UNACKED_WAKEUPS=1): kombu's Redis transport records each delivery in its unacked
index (ZADD and HSET of the whole message, in a MULTI) and removes it at the ack (ZREM and
HDEL, another MULTI), so that a message whose worker died comes back after the visibility
timeout (an hour). For a message stamped with the state store's epoch (its turn was recorded
before it was published: tasks/turn/ending.py, publish_turn and wake) that record repeats what
the turn record already guarantees: a turn stays in a time index of its shard (pending, retries,
running) until a claim takes it, and the pump wakes it from there when no worker did
(docs/platform.md, "The hot path"), sooner than the visibility timeout would. Such a
delivery is counted in the worker's memory only (the prefetch limit still holds), its ack
writes nothing, and a requeueing reject pushes it back from memory: two round trips and eight
Redis commands (two MULTI blocks) fewer per delivery. A message without the stamp (sent
around run_turn.delay, its turn not yet recorded) keeps kombu's record.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.json import dumps

from tasks.core.schema import Registered
from tasks.store.client import STAMP_HEADER, same_server

logger = logging.getLogger("agentjobs.broker")

REFUSED_WRITES: tuple[type[redis.RedisError], ...] = (
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
)


class Outage:
    """Whether the broker's writes are being refused, for one log line at each edge."""

    def __init__(self) -> None:
        self.since_s: float | None = None  # monotonic

    def refused(self, exc: BaseException) -> None:
        if self.since_s is None:
            self.since_s = time.monotonic()
            logger.warning(
                "broker: Redis refuses writes (%s); consuming on without recording deliveries "
                "and acks until it accepts them (the pump wakes the turns this delays)",
                exc,
            )

    def accepted(self) -> None:
        if self.since_s is not None:
            logger.warning(
                "broker: Redis accepts writes again after %.0f s", time.monotonic() - self.since_s
            )
            self.since_s = None


OUTAGE = Outage()

# kombu's own: the Redis QoS (writes the unacked set, then the in-memory state) and the
# in-memory QoS it builds on.
_redis_append: Callable[..., None] = kombu_redis.QoS.append
_redis_ack: Callable[..., None] = kombu_redis.QoS.ack
_redis_reject: Callable[..., None] = kombu_redis.QoS.reject
_memory_append: Callable[..., None] = virtual.QoS.append
_memory_ack: Callable[..., None] = virtual.QoS.ack


class _Wakeups:
    """Whether this process holds stamped turn wake-ups in memory only (a worker sets it at
    its start from AGENTJOBS_UNACKED_WAKEUPS); off elsewhere, so kombu is left as it is."""

    in_memory = False


WAKEUPS = _Wakeups()


def hold_wakeups_in_memory(on: bool) -> None:
    WAKEUPS.in_memory = on


def _held_in_memory(message: Any) -> bool:
    """Whether this delivery is kept in the worker's memory only: a stamped wake-up, in a
    process that holds them so. Asked again at its ack or reject, of the delivered message."""
    headers = getattr(message, "headers", None)
    return WAKEUPS.in_memory and isinstance(headers, dict) and STAMP_HEADER in headers


def _append(self: Any, message: Any, delivery_tag: Any) -> None:
    if _held_in_memory(message):
        _memory_append(self, message, delivery_tag)
        return
    try:
        _redis_append(self, message, delivery_tag)
    except REFUSED_WRITES as exc:
        # BRPOP already took it from the queue: run it from memory rather than drop it.
        OUTAGE.refused(exc)
        _memory_append(self, message, delivery_tag)
    else:
        OUTAGE.accepted()


def _ack(self: Any, delivery_tag: Any) -> None:
    if _held_in_memory(self._delivered.get(delivery_tag)):
        _memory_ack(self, delivery_tag)
        return
    try:
        _redis_ack(self, delivery_tag)
    except REFUSED_WRITES as exc:
        # Free the prefetch slot; Redis still lists the message as unacked.
        OUTAGE.refused(exc)
        _memory_ack(self, delivery_tag)


def _reject(self: Any, delivery_tag: Any, requeue: bool = False) -> None:
    message = self._delivered.get(delivery_tag)
    if _held_in_memory(message):
        if requeue:
            # Back on its queue where kombu's own reject puts it (LPUSH: behind the messages
            # waiting), from memory, since kombu's restore reads the record it has none of.
            delivery = message.delivery_info
            with self.channel.conn_or_acquire() as client, client.pipeline() as pipe:
                self.channel._do_restore_message(
                    message._raw, delivery["exchange"], delivery["routing_key"], pipe, True
                )
                pipe.execute()
        _memory_ack(self, delivery_tag)
        return
    try:
        _redis_reject(self, delivery_tag, requeue=requeue)
    except REFUSED_WRITES as exc:
        OUTAGE.refused(exc)
        _memory_ack(self, delivery_tag)  # as kombu's reject does: forget it in memory


@dataclass
class PublishFold:
    """A turn's registration, waiting for its message: `register` records the turn, with
    (the broker's list, the message) to push in the same step, or None to leave the push to
    kombu. `outcome`: what the registration came to, once the message got to the broker."""

    client: Any  # the state store's client
    register: Callable[[tuple[str, bytes] | None], Registered]
    outcome: Registered | None = None


# The fold of the submission this thread is publishing (tasks/turn/tasks.py), if any.
FOLD: ContextVar[PublishFold | None] = ContextVar("agentjobs_publish_fold", default=None)

_redis_put: Callable[..., None] = kombu_redis.Channel._put

# Per channel: whether it is on the state store's server (the verdict of its first fold).
_ON_STATE_SERVER: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _put(self: Any, queue: str, message: Any, **kwargs: Any) -> None:
    fold = FOLD.get()
    if fold is None:
        _redis_put(self, queue, message, **kwargs)
        return
    if not _folds(self, queue, kwargs, fold.client):
        # Registered first (once: kombu calls again after a connection error), then pushed.
        if fold.outcome is None:
            fold.outcome = fold.register(None)
        if fold.outcome in (Registered.CREATED, Registered.EXISTS):
            _redis_put(self, queue, message, **kwargs)
        return
    key = self._q_for_pri(queue, self._get_message_priority(message, reverse=False))
    # Again after a connection error: a registration that ran already is found (EXISTS),
    # with its message pushed by that same step.
    fold.outcome = fold.register((key, dumps(message).encode()))  # type: ignore[no-untyped-call]


def _folds(channel: Any, queue: str, kwargs: dict[str, Any], client: Any) -> bool:
    """Whether kombu would push this message with one LPUSH of its own to the server the
    state store's client is on."""
    expires = getattr(channel, "_expires", None)
    if kwargs.get("_publish_batch") is not None or (expires and queue in expires):
        return False
    if getattr(channel, "global_keyprefix", ""):
        return False
    found = _ON_STATE_SERVER.get(channel)
    if found is None:
        pool = channel.pool
        found = type(pool) is redis.ConnectionPool and same_server(
            pool.connection_kwargs, pool.connection_class, client
        )
        _ON_STATE_SERVER[channel] = found
    return found


def install() -> None:
    if kombu_redis.Channel._put is not _put:
        kombu_redis.Channel._put = _put  # type: ignore[method-assign]
    qos = kombu_redis.QoS
    if qos.ack is not _ack:
        qos.append, qos.ack, qos.reject = _append, _ack, _reject  # type: ignore[method-assign]
    errors = kombu_redis.Transport.connection_errors
    missing = tuple(kind for kind in REFUSED_WRITES if kind not in errors)
    kombu_redis.Transport.connection_errors = errors + missing
