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

Celery 5.7's success line (celery/app/trace.py, LOG_SUCCESS: "Task %(name)s[%(id)s] succeeded
in %(runtime)ss: %(return_value)s") logs every task's return value at INFO, and a turn returns
its reply: every answer a model gave would be in the worker's log. Celery has no setting for it,
and the format is a module attribute read at each call, so it is replaced by one without the
value, and the line's `extra["data"]` (which custom log handlers may format) loses
the value and the arguments. tests/tasks/test_worker_logs.py checks it; drop this if Celery
gets an option to leave the result out.

Celery 5.7 logs "Task %(name)s[%(id)s] ignored" at INFO for every task that raises Ignore
(celery/app/trace.py, log_policy_ignore, read by get_log_policy at each call). A delivery that
releases its turn (a retry scheduled, a pause, a hand-over, a turn queued behind another)
raises Ignore, so the line came with every one of them and read like a dropped task; our own
line beside it says what happened ("attempt 2 in 0.4 s", "paused for 1 decision(s)", "not run
by this delivery: not_head"). The policy is replaced by the same one at DEBUG.
tests/tasks/test_flower_events.py checks it; drop this if Celery lets a task choose the level.

kombu 5.7 Redis transport: Channel.conn_or_acquire builds a new redis.Redis client for each call
that is not handed one (every publish, every unacked record on delivery, every ack and reject),
on the channel's one connection pool. Building it (an event dispatcher, the response-callback
table) costs about 0.1 ms, several times a turn, and the client holds nothing a call needs apart
from the pool. A channel now keeps the client it built and hands it out again while its pool is
the same object. A redis.Redis on a pool (not a single-connection client) takes a connection
from the pool for each command and gives it back, and each pipeline() is a new object, so the
threads of a threads-pool worker can share it. The pool is looked up on each call as before:
after the channel's pools are dropped (close, fork, a failed ping) the next call builds a new
pool and a new client for it, or raises where the detached-channel workaround (the first here)
raises. After a connection error kombu closes the channel and opens a new one, which builds its
own client. tests/tasks/test_client_reuse.py checks it; drop this if kombu keeps its client.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

import redis
from celery.app import trace
from kombu.transport import redis as kombu_redis

# Celery's success line without the task's return value.
LOG_SUCCESS = "Task %(name)s[%(id)s] succeeded in %(runtime)ss"
# What the success line's data loses: the reply, and the arguments (a turn's message).
_PRIVATE_FIELDS = ("return_value", "args", "kwargs")
# Celery's policy for a task that raised Ignore, at DEBUG instead of INFO.
LOG_POLICY_IGNORE = trace.log_policy_t(trace.LOG_IGNORED, "ignored", logging.DEBUG, 0, 0)


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


# Where a channel keeps the client conn_or_acquire hands out (kombu uses none of this name).
_REUSED_CLIENT = "_agentjobs_client"


@contextlib.contextmanager
def _conn_or_acquire(channel: Any, client: Any = None) -> Iterator[Any]:
    if client:
        yield client
        return
    pool = channel.pool  # builds the pool, or raises, exactly as kombu's call does
    reused = channel.__dict__.get(_REUSED_CLIENT)
    if reused is None or reused.connection_pool is not pool:
        # Two threads may both get here; each builds a client on the same pool, one is kept.
        reused = channel._create_client()
        setattr(channel, _REUSED_CLIENT, reused)
    yield reused


_conn_or_acquire.agentjobs_workaround = True  # type: ignore[attr-defined]


def _without_content(info: Callable[[str, dict[str, Any]], None]) -> Callable[..., None]:
    @functools.wraps(info)
    def _info(fmt: str, context: dict[str, Any]) -> None:
        if fmt == LOG_SUCCESS:
            context = {k: v for k, v in context.items() if k not in _PRIVATE_FIELDS}
        info(fmt, context)

    _info.agentjobs_workaround = True  # type: ignore[attr-defined]
    return _info


def install() -> None:
    trace.LOG_SUCCESS = LOG_SUCCESS
    trace.log_policy_ignore = LOG_POLICY_IGNORE
    if not getattr(trace.info, "agentjobs_workaround", False):
        trace.info = _without_content(trace.info)
    current = kombu_redis.Channel._connparams
    if not getattr(current, "agentjobs_workaround", False):
        kombu_redis.Channel._connparams = _refuse_detached_channel(current)  # type: ignore[method-assign]
    if not getattr(kombu_redis.Channel.conn_or_acquire, "agentjobs_workaround", False):
        kombu_redis.Channel.conn_or_acquire = _conn_or_acquire  # type: ignore[method-assign,assignment]
