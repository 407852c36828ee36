"""Workarounds for upstream bugs, each with its evidence and the way to drop it.

kombu 5.7 Redis transport (with Celery 5.7): when Redis restarts under a worker that holds
unacknowledged (acks_late) messages, Celery collects the lost connection, which detaches each
channel from its connection info; the channel then still restores unacked messages on close
and acks the messages of tasks that finish afterwards, and building a client for that reads
`connection.client.hostname` from None. The AttributeError is not a connection error, so Celery
calls it unrecoverable and the worker exits (seen in bench/soak.py; reproduced by
tests/tasks/test_redis_restart.py). Raising a Redis ConnectionError there instead lets kombu
and Celery treat it as the connection loss it is: the worker reconnects, the acks that could
not be sent leave their messages in Redis's unacked set until the visibility timeout, and the
job system has finished or resumed those turns long before (duplicates are dropped by the turn
record). Drop this once that test passes without it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import redis
from kombu.transport import redis as kombu_redis


def _refuse_detached_channel(
    connparams: Callable[..., dict[str, Any]],
) -> Callable[..., dict[str, Any]]:
    @functools.wraps(connparams)
    def _connparams(channel: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if getattr(channel.connection, "client", None) is None:
            raise redis.exceptions.ConnectionError("the broker connection was already closed")
        return connparams(channel, *args, **kwargs)

    _connparams.agentjobs_workaround = True  # type: ignore[attr-defined]
    return _connparams


def install() -> None:
    current = kombu_redis.Channel._connparams
    if not getattr(current, "agentjobs_workaround", False):
        kombu_redis.Channel._connparams = _refuse_detached_channel(current)  # type: ignore[method-assign]
