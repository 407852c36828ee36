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
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

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


def _append(self: Any, message: Any, delivery_tag: Any) -> None:
    try:
        _redis_append(self, message, delivery_tag)
    except REFUSED_WRITES as exc:
        # BRPOP already took it from the queue: run it from memory rather than drop it.
        OUTAGE.refused(exc)
        _memory_append(self, message, delivery_tag)
    else:
        OUTAGE.accepted()


def _ack(self: Any, delivery_tag: Any) -> None:
    try:
        _redis_ack(self, delivery_tag)
    except REFUSED_WRITES as exc:
        # Free the prefetch slot; Redis still lists the message as unacked.
        OUTAGE.refused(exc)
        _memory_ack(self, delivery_tag)


def _reject(self: Any, delivery_tag: Any, requeue: bool = False) -> None:
    try:
        _redis_reject(self, delivery_tag, requeue=requeue)
    except REFUSED_WRITES as exc:
        OUTAGE.refused(exc)
        _memory_ack(self, delivery_tag)  # as kombu's reject does: forget it in memory


def install() -> None:
    qos = kombu_redis.QoS
    if qos.ack is not _ack:
        qos.append, qos.ack, qos.reject = _append, _ack, _reject  # type: ignore[method-assign]
    errors = kombu_redis.Transport.connection_errors
    missing = tuple(kind for kind in REFUSED_WRITES if kind not in errors)
    kombu_redis.Transport.connection_errors = errors + missing
