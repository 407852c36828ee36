"""One delivery of a turn message on a worker: find the turn's record, claim it, run one
attempt and end it (tasks/turn/attempt.py), or settle what the message cannot run.

    run_turn / resume_turn message
      -> the worker drains?               back to the broker as it came, for a worker that stays
      -> no record, the store lost it     dead-lettered as state_lost from what the message says
      -> no record, sent around .delay    registered from its kwargs, then claimed
      -> a payload too broken to queue    dead-lettered as bad_payload
      -> another delivery holds the turn  nothing (the turn record decides what runs)
      -> claimed                          one attempt, then its outcome

Every message is only a wake-up: duplicates and redeliveries are harmless.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

import orjson
import redis
from celery.exceptions import Ignore, Reject

from tasks.core.errors import BadPayload, Reason, StateLost, UnreadableRecord
from tasks.core.payload import parse_payload, registration_of
from tasks.queue.context import JobContext, job_context
from tasks.store.client import lost_state
from tasks.store.records import ClaimStatus, Registered, TurnRecord
from tasks.telemetry.tracing import attempt as trace_attempt
from tasks.turn import ending
from tasks.turn.attempt import Attempt
from tasks.turn.fairness import publish_released
from tasks.turn.registration import register_turn

logger = logging.getLogger("agentjobs.turns")


def drive_turn(
    turn_id: str,
    submitted: Mapping[str, Any] | None,
    *,
    worker: str,
    namespace: str | None = None,
    stamp: Mapping[str, Any] | None = None,
    known: Mapping[str, str] | None = None,
    celery_request: Any = None,
) -> dict[str, Any]:
    """Handle one delivery; returns the turn's reply or raises what Celery should see. When
    the turn's ending wrote its Celery result, `celery_request` (the task's request) is told
    to ignore the result, so that Celery does not read and write it again."""
    ctx = job_context()
    if ctx.leases.draining:
        # This worker is shutting down: the message goes back to the broker as it came, for
        # a worker that stays (tasks/turn/worker.py).
        raise Reject(requeue=True)
    try:
        if namespace is None:
            namespace = _namespace_of(ctx, turn_id, submitted, stamp, known)
        if not namespace:
            _dead_letter_bad_payload(ctx, turn_id, submitted)
            raise Ignore()
        token = uuid.uuid4().hex
        lease_ttl_s = ctx.settings.lease_ttl_s
        claim = ctx.records.claim(turn_id, namespace, token, lease_ttl_s, worker)
        if claim.status is ClaimStatus.MISSING:
            _refuse_lost_state(ctx, turn_id, namespace, submitted, stamp, known, worker=worker)
        if claim.status is ClaimStatus.MISSING and submitted is not None:
            # Sent without going through run_turn.delay (app.send_task, a forged message).
            if register_turn(ctx, turn_id, submitted)[1] is Registered.FOREIGN:
                _drop_foreign(turn_id)
            claim = ctx.records.claim(turn_id, namespace, token, lease_ttl_s, worker)
        if claim.record is None:
            logger.info("turn %s not run by this delivery: %s", turn_id, claim.status)
            ending.not_run(ctx, turn_id, namespace, claim.status)
            raise Ignore()
        if claim.released:  # held turns the fairness gate admitted in this one's place
            publish_released(ctx, list(claim.released))
        attempt = Attempt.from_claim(ctx, claim, token=token)
        points = attempt.points
        with (
            trace_attempt(ctx, claim.record, token) as points.trace,
            ctx.leases.holding(turn_id, namespace, token, on_renewed=points.report_running),
        ):
            reply = attempt.finish(attempt.run())
        if attempt.result_stored and celery_request is not None:
            celery_request.ignore_result = True  # stored by the ending already
        return reply
    except UnreadableRecord as exc:
        ctx.records.note_unreadable(exc)  # nothing can be run or ended from it
        raise Ignore() from None
    except redis.RedisError as exc:
        # Redis is unreachable: nothing can be recorded now. The turn's lease runs out and the
        # pump wakes it again once Redis answers.
        logger.warning("turn %s: Redis unavailable (%s); leaving it to recovery", turn_id, exc)
        raise Ignore() from None


def _drop_foreign(turn_id: str) -> None:
    """A message that would make `turn_id` a turn of a second conversation: dropped, and the
    turn that owns the id is left as it is."""
    logger.warning(
        "message for turn %s dropped: that id names a turn of another conversation", turn_id
    )
    raise Ignore()


def _namespace_of(
    ctx: JobContext,
    turn_id: str,
    submitted: Mapping[str, Any] | None,
    stamp: Mapping[str, Any] | None = None,
    known: Mapping[str, str] | None = None,
) -> str:
    """The conversation namespace a delivery claims under ('' for a broken payload)."""
    if submitted is not None:
        return registration_of(submitted)[2]
    record = ctx.records.get(turn_id)
    if record is None:
        _refuse_lost_state(ctx, turn_id, "", None, stamp, known, worker="")
        logger.warning("resume_turn for unknown turn %s: ignored", turn_id)
        raise Ignore()
    return record.namespace


def _refuse_lost_state(
    ctx: JobContext,
    turn_id: str,
    namespace: str,
    submitted: Mapping[str, Any] | None,
    stamp: Mapping[str, Any] | None,
    known: Mapping[str, str] | None,
    *,
    worker: str,
) -> None:
    """A message whose turn record is missing: when the store lost it (tasks/store/client.py),
    file the turn as state_lost from what the message carries, rather than run it on what is
    left of its conversation (raises Ignore or TurnDeadLettered); otherwise return (an
    unknown turn)."""
    if stamp is None:
        return
    ctx.epoch.check(worker)  # read now, not from the cache: the verdict depends on it
    why = lost_state(stamp, ctx.epoch.current(), record_ttl_s=ctx.settings.record_ttl_s)
    if not why:
        return
    ctx.epoch.message_from(str(stamp.get("epoch", "")), worker, turn_id)
    logger.error("turn %s: its record is gone, the state store lost it: %s", turn_id, why)
    payload: Any = dict(submitted) if submitted is not None else {**(known or {}), "lost": True}
    agent_name, conversation_id = str(payload.get("agent", "")), ""
    if submitted is not None:
        agent_name, conversation_id, _ = registration_of(submitted)
    else:
        conversation_id = str(payload.get("conversation_id", ""))
    if not ctx.records.claim_turn_id(turn_id, namespace):
        _drop_foreign(turn_id)
    ctx.records.register(
        turn_id,
        payload=orjson.dumps(payload),
        agent=agent_name,
        conversation_id=conversation_id,
        namespace=namespace,
        deadline_s=ctx.settings.turn_deadline_s,
    )
    record = ctx.records.get(turn_id, namespace)
    _dead_letter_unclaimed(ctx, record, Reason.STATE_LOST, StateLost(turn_id, why))


def _dead_letter_bad_payload(
    ctx: JobContext, turn_id: str, submitted: Mapping[str, Any] | None
) -> None:
    """A turn that was never queued: dead-letter it as bad_payload."""
    record = ctx.records.get(turn_id, "")
    if record is None and submitted is not None:
        if register_turn(ctx, turn_id, submitted)[1] is Registered.FOREIGN:
            _drop_foreign(turn_id)
        record = ctx.records.get(turn_id, "")
    try:
        if record is not None:
            parse_payload(record.payload)
    except BadPayload as exc:
        _dead_letter_unclaimed(ctx, record, exc.reason, exc)


def _dead_letter_unclaimed(
    ctx: JobContext, record: TurnRecord | None, reason: Reason, error: Exception
) -> None:
    """Dead-letter a turn no delivery could claim (token ''); raises TurnDeadLettered for
    Celery, or Ignore when the turn had ended already."""
    if record is None or record.state.terminal:
        raise Ignore()
    # Raised to Celery, whose task-failed event shows it: none of our own.
    ended = ending.dead_letter(ctx, record, "", reason, error, announce=False)
    if ended is None:
        raise Ignore()
    raise ended.error() from None
