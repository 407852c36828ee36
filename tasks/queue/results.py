"""What Celery says about a turn: its state in the result backend while unfinished (RUNNING,
WAITING, PAUSED, with a small `.info`) and its final result, written from the turn record; and
the task events that tell a monitor (Flower) what the worker's own events cannot.

The turn record is the truth; these writes mirror it so that Flower and any Celery client see
what a turn is doing (docs/operations.md, "Turn states and status" and "What Flower shows").
They use only the backend's and the broker's own API, whatever they are. A mirror write or an
event that fails never fails a turn.

Flower builds its view from task events alone, through celery.events.state.State, never from
the backend. A worker sends task-received, task-started and task-succeeded or task-failed for
each delivery, but nothing when a task raises Ignore, which is how a delivery ends that
released its turn (waiting, paused, handed over, queued behind). Two senders fill the gaps:

    send_from_worker   a release, from the worker that released the turn: task-retried, the
                       one state Celery's State lets every later event replace (a resumed
                       attempt's task-started, a cancel's task-revoked). Through the worker's
                       own dispatcher, only while it sends task events, right after the task
                       events it has buffered for the turn, so they arrive in order.
    send_ending        an ending from outside the worker (a cancel, the pump's deadline and
                       pause-expiry dead letters): task-revoked or task-failed, which no later
                       task-received or task-started of a stray delivery replaces. Always: the
                       sender cannot know whether a monitor listens, and a publish nobody
                       subscribed to is dropped by the broker.

A worker whose delivery finds its turn ended already sends that ending again (send_final), so
a monitor that started after the end does not keep the delivery's task-started.
"""

from __future__ import annotations

import logging
import socket
import weakref
from datetime import datetime
from typing import Any

import orjson
import redis
from celery import states
from celery.backends.redis import RedisBackend
from celery.signals import worker_ready

from tasks.core.errors import TurnCancelled, TurnDeadLettered
from tasks.queue.app import app
from tasks.queue.context import JobContext
from tasks.store.client import same_server
from tasks.store.records import CeleryResult, TurnRecord, TurnState

logger = logging.getLogger("agentjobs.results")

RUNNING = "RUNNING"
WAITING = "WAITING"
PAUSED = "PAUSED"

# The task events sent here (Celery's names; celery.events.state maps them to states).
TASK_RETRIED = "task-retried"
TASK_FAILED = "task-failed"
TASK_REVOKED = "task-revoked"
TASK_SUCCEEDED = "task-succeeded"

# An event from outside a worker is worth one reconnection at most, never a wait that holds
# up the pump's sweep or a cancel's caller.
_EVENT_RETRY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.1, "interval_max": 0.1}


def report_state(turn_id: str, state: str, info: dict[str, Any]) -> None:
    """Mirror an unfinished turn's state; result.get() keeps waiting through it."""
    try:
        app.backend.store_result(turn_id, info, state)
    except Exception as exc:
        logger.warning(
            "turn %s: could not report %s to the result backend (%s)", turn_id, state, exc
        )


def has_final_result(turn_id: str) -> bool:
    return app.backend.get_task_meta(turn_id).get("status") in states.READY_STATES


def write_final_result(
    ctx: JobContext, turn_id: str, namespace: str | None = None, *, resend: bool = False
) -> bool:
    """Write an ended turn's Celery result from its record (and a dead letter's redacted
    error from its entry); False when the turn has not ended or is unknown. With `resend`,
    this worker also tells its monitors again how the turn ended (send_final)."""
    record = ctx.records.get(turn_id, namespace)
    if record is None or not record.state.terminal:
        return False
    error_text = _error_text(ctx, record)
    if resend:
        send_final(record, error_text)
    return store_final_result(record, error_text)


def store_final_result(record: TurnRecord, error_text: str = "") -> bool:
    """Write an ended turn's Celery result from its record; False when it has not ended."""
    backend = app.backend
    if record.state is TurnState.SUCCEEDED:
        backend.store_result(record.turn_id, record.result, states.SUCCESS)
        return True
    if record.state is TurnState.DEAD_LETTERED:
        error = TurnDeadLettered(record.dlq_id, record.reason, error_text)
        backend.mark_as_failure(record.turn_id, error)
        return True
    if record.state is TurnState.CANCELLED:
        backend.mark_as_failure(record.turn_id, TurnCancelled(record.turn_id, record.cancel_reason))
        return True
    return False


def inline_result(ctx: JobContext, turn_id: str, reply: Any) -> CeleryResult | None:
    """A succeeded turn's Celery result for the script that ends the turn to write, when the
    result backend is the state Redis itself (the default: REDIS_URL names both); None for any
    other backend, which Celery writes to after the task returns as usual.

    Celery's Redis backend reads the key first (so as not to overwrite a success), then writes
    it and publishes it: a round trip and two commands per turn after the one that ended it.
    Written inside the ending, the result is there the moment the turn is, and the task tells
    Celery not to store it again (tasks/turn/delivery.py). The meta is the backend's own
    (status, result, traceback, children, date_done, task_id), in its serializer."""
    backend = app.backend
    if not _backend_is_state_redis(backend, ctx.redis):
        return None
    key = backend.get_key_for_task(turn_id)
    return CeleryResult(
        key=key.decode() if isinstance(key, bytes) else str(key),
        meta=_success_meta(backend, turn_id, reply),
        ttl_s=int(backend.expires or 0),
    )


def _success_meta(backend: Any, turn_id: str, reply: Any) -> bytes:
    """The backend's meta of a success, encoded as the backend does. In this app's own
    configuration (orjson, no extended fields, no compression) it is built here, in a tenth
    of the time Celery's generic path takes (a configuration lookup and a time-zone
    conversion per result); the same fields, in the same order."""
    if backend.serializer != "orjson" or backend.compression or app.conf.result_extended:
        meta = backend._get_result_meta(
            result=reply, state=states.SUCCESS, traceback=None, request=None
        )
        meta["task_id"] = turn_id
        return _as_bytes(backend.encode(meta))
    meta = {
        "status": states.SUCCESS,
        "result": reply,
        "traceback": None,
        "children": backend.current_task_children(None),
        "date_done": datetime.now(app.timezone).isoformat(),
        "task_id": turn_id,
    }
    return orjson.dumps(meta)


def writes_inline(ctx: JobContext) -> bool:
    """Whether succeeded turns get their Celery result from the script that ends them."""
    return _backend_is_state_redis(app.backend, ctx.redis)


# Per state client, the verdict (each thread has a backend of its own, all alike).
_SHARED: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _backend_is_state_redis(backend: Any, client: Any) -> bool:
    found = _SHARED.get(client)
    if found is None:
        found = _SHARED[client] = _same_redis(backend, client)
    return found


def _same_redis(backend: Any, client: Any) -> bool:
    """The backend is Celery's plain Redis backend (not Sentinel's, not another kind) on the
    state store's server, database and user (store/client.py, same_server)."""
    if type(backend) is not RedisBackend:
        return False
    theirs = backend.connparams
    return same_server(theirs, theirs.get("connection_class", redis.Connection), client)


def _as_bytes(payload: str | bytes) -> bytes:
    return payload if isinstance(payload, bytes) else payload.encode()


def _error_text(ctx: JobContext, record: TurnRecord) -> str:
    summary = ctx.dead_letters.summary(record.dlq_id) if record.dlq_id else None
    return str((summary or {}).get("error", ""))


# -- task events ---------------------------------------------------------------------------------


class _Worker:
    """This process's worker consumer, once it is ready: None in any other process (a client,
    the pump) and in a prefork pool's children, which have no consumer of their own."""

    consumer: Any = None


@worker_ready.connect  # type: ignore[untyped-decorator]
def _remember_consumer(sender: Any = None, **_: Any) -> None:
    _Worker.consumer = sender


class _Trouble:
    """One warning when events stop getting through, not one per turn."""

    failing = False

    @classmethod
    def failed(cls, kind: str, turn_id: str, exc: BaseException) -> None:
        if cls.failing:
            logger.debug("turn %s: %s event not sent (%s)", turn_id, kind, exc)
            return
        cls.failing = True
        logger.warning(
            "turn %s: could not send its %s event (%s); monitors such as Flower show the "
            "turn's previous state until one gets through (until then, failures log at debug)",
            turn_id,
            kind,
            exc,
        )

    @classmethod
    def sent(cls) -> None:
        cls.failing = False


def failed_fields(error: BaseException) -> dict[str, Any]:
    """A task-failed event's fields for a turn ended by `error`: its repr, as in Celery's own
    (no traceback: an ending is not a crash)."""
    return {"exception": repr(error)}


def revoked_fields(turn_id: str, reason: str) -> dict[str, Any]:
    """A task-revoked event's fields for a cancelled turn: Celery's (not terminated, not
    expired), with the TurnCancelled that result.get() raises as its exception."""
    return {
        "terminated": False,
        "signum": None,
        "expired": False,
        "exception": repr(TurnCancelled(turn_id, reason)),
    }


def sender_name(role: str) -> str:
    """Who an event says it comes from (Flower's worker column): this worker's node name in a
    worker, otherwise agentjobs-<role>@<host> (role: cancel, pump)."""
    consumer = _Worker.consumer
    hostname = getattr(consumer, "hostname", None)
    return str(hostname) if hostname else f"agentjobs-{role}@{socket.gethostname()}"


def worker_dispatcher() -> Any | None:
    """This worker's own event dispatcher while it sends task events (started with -E, or
    told to by a monitor's enable_events); None otherwise and in any other process."""
    dispatcher = getattr(_Worker.consumer, "event_dispatcher", None)
    if dispatcher is None or not dispatcher.enabled:
        return None
    groups = dispatcher.groups
    return dispatcher if not groups or "task" in groups else None


def send_from_worker(turn_id: str, kind: str, **fields: Any) -> bool:
    """Send a task event for `turn_id` through this worker's dispatcher, after (and with) the
    events it holds buffered, when the worker sends task events at all; False when not sent.
    The dispatcher guards its buffer and its producer with its own lock, and a threads pool
    sends Celery's own events from its task threads in the same way."""
    dispatcher = worker_dispatcher()
    if dispatcher is None:
        return False
    try:
        dispatcher.send(kind, uuid=turn_id, **fields)
        dispatcher.flush()
    except Exception as exc:
        _Trouble.failed(kind, turn_id, exc)
        return False
    _Trouble.sent()
    return True


def send_ending(turn_id: str, kind: str, *, role: str, **fields: Any) -> bool:
    """Send a task event for a turn ended from outside its worker, whether or not anyone
    listens: one publish to the event exchange on a pooled broker connection (a Redis
    PUBLISH, or a RabbitMQ topic exchange that drops it when no queue is bound). False when
    it could not be sent, which the ending does not depend on."""
    try:
        with app.producer_or_acquire() as producer:
            dispatcher = app.events.Dispatcher(
                producer.connection, hostname=sender_name(role), enabled=False
            )
            dispatcher.publish(
                kind, {"uuid": turn_id, **fields}, producer, retry=True, retry_policy=_EVENT_RETRY
            )
    except Exception as exc:
        _Trouble.failed(kind, turn_id, exc)
        return False
    _Trouble.sent()
    return True


def final_event(record: TurnRecord, error_text: str = "") -> tuple[str, dict[str, Any]] | None:
    """The task event that shows how an ended turn ended; None for an unfinished one. A
    success's event leaves the reply out."""
    if record.state is TurnState.SUCCEEDED:
        return TASK_SUCCEEDED, {}
    if record.state is TurnState.DEAD_LETTERED:
        return TASK_FAILED, failed_fields(
            TurnDeadLettered(record.dlq_id, record.reason, error_text)
        )
    if record.state is TurnState.CANCELLED:
        return TASK_REVOKED, revoked_fields(record.turn_id, record.cancel_reason)
    return None


def send_final(record: TurnRecord, error_text: str = "") -> bool:
    """From a worker whose delivery found its turn ended: tell its monitors how it ended
    again, since this delivery's task-received and task-started may be all a monitor that
    started after the ending knows of the turn."""
    event = final_event(record, error_text)
    if event is None:
        return False
    return send_from_worker(record.turn_id, event[0], **event[1])


def send_final_of(ctx: JobContext, turn_id: str, namespace: str) -> bool:
    """send_final for a turn known by id, reading its record only while this worker sends
    task events."""
    if worker_dispatcher() is None:
        return False
    record = ctx.records.get(turn_id, namespace)
    if record is None or not record.state.terminal:
        return False
    return send_final(record, _error_text(ctx, record))
