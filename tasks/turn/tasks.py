"""run_turn and resume_turn: the two Celery tasks a turn runs as.

    run_turn.delay(...)  --register-->  turn record (queued) + conversation queue, then publish
    worker: one delivery (tasks/turn/delivery.py): claim, one attempt (tasks/turn/attempt.py),
            its outcome (tasks/turn/ending.py); the next turn of the conversation is woken
            when this one ends

A turn's Celery task id is its turn id; resume_turn messages reuse it, so `AsyncResult.get()`
on the submitted task sees the final result however many attempts it took. Every message is
only a wake-up: the turn record decides what runs, so duplicates and redeliveries are harmless
(tasks/store/records.py draws the states).
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from celery import Task

from tasks.core.errors import TurnDeadLettered
from tasks.core.payload import TurnRequest
from tasks.queue.app import app
from tasks.queue.broker import FOLD, PublishFold
from tasks.queue.context import JobContext, job_context
from tasks.store.client import stamp_of
from tasks.store.records import Registered
from tasks.turn import ending
from tasks.turn.delivery import drive_turn
from tasks.turn.registration import check_request, check_task_id, refusal, register_turn

logger = logging.getLogger("agentjobs.submit")


class SubmitTurnTask(Task):  # type: ignore[misc]
    """run_turn's task class: submitting checks the request and registers the turn before its
    message is published, which fixes the conversation's order at submission time."""

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        **options: Any,
    ) -> Any:
        ctx = job_context()
        request = check_request(args, kwargs, max_deadline_s=ctx.settings.max_deadline_s)
        fresh = task_id is None
        task_id = str(uuid.uuid4()) if task_id is None else check_task_id(task_id)
        if fresh and ctx.folds_publish:
            return self._register_publishing(ctx, task_id, kwargs, request, options)
        namespace, registered = register_turn(
            ctx, task_id, kwargs, request=request, fresh=fresh, gated=True
        )
        refused = refusal(registered)
        if refused is not None:
            raise refused
        if registered is Registered.EXISTS:
            return self.AsyncResult(task_id)  # the same request again: the same turn
        if registered is Registered.HELD:
            # Recorded and queued; the fairness gate publishes it in its tenant's turn.
            return self.AsyncResult(task_id)
        try:
            # The publish's own result: the backend subscribed to its channel for it, and a
            # second AsyncResult would leave this one to unsubscribe when dropped (and get()
            # to subscribe again), two round trips per turn.
            return ending.publish_turn(ctx, task_id, kwargs, **options)
        except Exception:
            # Nothing was published: take the turn back so it does not run behind the
            # caller's back when the caller retries with a new id.
            ctx.records.unregister(task_id, namespace)
            raise

    def _register_publishing(
        self,
        ctx: JobContext,
        task_id: str,
        kwargs: Any,
        request: TurnRequest,
        options: dict[str, Any],
    ) -> Any:
        """Register the turn as its message reaches the broker, in the same step when the
        broker is the state store's Redis (tasks/queue/broker.py, PublishFold): one round
        trip for both. A new id is the caller's own, so only a refused write can fail it."""

        def register(publish: tuple[str, bytes] | None) -> Registered:
            return register_turn(
                ctx, task_id, kwargs, request=request, fresh=True, gated=True, publish=publish
            )[1]

        fold = PublishFold(ctx.redis, register)
        token = FOLD.set(fold)
        try:
            result = ending.publish_turn(ctx, task_id, kwargs, **options)
        except Exception:
            ctx.records.unregister(task_id, request.namespace)  # as apply_async does
            raise
        finally:
            FOLD.reset(token)
        if fold.outcome is None:
            # kombu published without its Redis channel's push (a transport it chose
            # otherwise): recorded now, as a worker would record a message it finds no turn for.
            logger.warning("turn %s: published before it was registered", task_id)
            fold.outcome = register(None)
        refused = refusal(fold.outcome)
        if refused is not None:
            raise refused
        return result


_TASK_OPTIONS: dict[str, Any] = {
    "bind": True,
    "acks_late": True,
    "reject_on_worker_lost": True,
    # Expected outcomes, logged without a traceback.
    "throws": (TurnDeadLettered,),
}


@app.task(name=ending.RUN_TURN, base=SubmitTurnTask, **_TASK_OPTIONS)  # type: ignore[untyped-decorator]
def run_turn(self: Task, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Run one turn of a conversation: run_turn.delay(agent=, conversation_id=, message=,
    identity=None, message_from=None, time=None)."""
    submitted = kwargs if not args else {"<args>": list(args)}
    return drive_turn(
        self.request.id,
        submitted,
        worker=self.request.hostname or "",
        stamp=_stamp(self.request),
        celery_request=self.request,
    )


@app.task(name=ending.RESUME_TURN, **_TASK_OPTIONS)  # type: ignore[untyped-decorator]
def resume_turn(
    self: Task,
    turn_id: str,
    namespace: str | None = None,
    agent: str = "",
    conversation_id: str = "",
) -> dict[str, Any]:
    """Wake a recorded turn: a retry that is due, the next turn of a conversation, or a turn
    whose worker died. What runs is decided by the turn record; `agent` and
    `conversation_id` only name the turn in Flower and task events (and in a state_lost
    dead letter, when the record is gone)."""
    return drive_turn(
        turn_id,
        None,
        namespace=namespace,
        worker=self.request.hostname or "",
        stamp=_stamp(self.request),
        known={"agent": agent, "conversation_id": conversation_id},
        celery_request=self.request,
    )


def _stamp(request: Any) -> dict[str, Any] | None:
    # Celery keeps custom headers in request.headers, and as attributes too.
    return stamp_of(request.headers) or stamp_of(vars(request))
