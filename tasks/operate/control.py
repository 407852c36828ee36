"""Stopping turns: cancel_turn and cancel_conversation (docs/operations.md, "Cancel and
deadlines"), and the pump's deadline check.

A cancel takes effect in the turn record at once, whatever the state: the turn ends as
cancelled, its lease, retry and queue place are released and the next turn of the conversation
is woken (tasks/store/lua/cancel.lua). A worker still running it is fenced out: it stops at its next
check point (each tool call's event, each persisted round, the lease keeper's renewal) and its
late writes are refused. Whoever ends a turn writes its Celery result, so result.get() raises
TurnCancelled at once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from tasks.core.errors import DeadlineExceeded, Reason
from tasks.core.keys import ShardKeys
from tasks.queue.context import JobContext, job_context
from tasks.queue.results import write_final_result
from tasks.store.conversations import namespace_for
from tasks.store.dead_letters import file_dead_letter
from tasks.store.records import Due, TurnRecord

logger = logging.getLogger("agentjobs.control")


def wake_turn(turn_id: str | None, namespace: str, agent: str, conversation_id: str) -> None:
    from tasks.turn.tasks import wake  # the Celery tasks import this module's callers

    wake(turn_id, namespace or None, agent, conversation_id)


def cancel_turn(
    turn_id: str, *, reason: str = "", identity: Mapping[str, Any] | None = None
) -> bool:
    """True when the turn was unfinished and is now cancelled; False when it had already ended
    or is unknown (with `identity`, a turn of another one is unknown)."""
    ctx = job_context()
    record = ctx.records.find(turn_id, identity)
    if record is None or record.state.terminal:
        return False
    ended = ctx.records.cancel(
        turn_id, record.namespace, reason=reason, ttl_s=ctx.settings.record_ttl_s
    )
    if not ended.ended:
        return False
    write_final_result(ctx, turn_id, record.namespace)
    logger.info("turn %s cancelled%s", turn_id, f": {reason}" if reason else "")
    wake_turn(ended.next_head, record.namespace, ended.next_head_agent, record.conversation_id)
    return True


def cancel_conversation(
    conversation_id: str, identity: Mapping[str, Any] | None = None, *, reason: str = ""
) -> int:
    """Cancel every unfinished turn of the conversation; returns how many were cancelled."""
    ctx = job_context()
    namespace = namespace_for(conversation_id, identity)
    queue = ctx.keys.for_namespace(namespace).queue(namespace)
    turn_ids: Any = ctx.redis.lrange(queue, 0, -1)
    # Last first: cancelling the head would wake the next one only to cancel it too.
    return sum(cancel_turn(t.decode(), reason=reason) for t in reversed(turn_ids))


def end_overdue_turns(ctx: JobContext, shard: ShardKeys, *, limit: int) -> int:
    """Dead-letter the shard's unfinished turns past their deadline, even one whose worker is
    stuck in a tool forever: the conversation moves on. Returns how many."""

    def end_overdue(due: Due) -> int:
        record = ctx.records.get(due.turn_id, due.namespace)
        if record is None or record.state.terminal:
            ctx.redis.zrem(shard.deadlines, due.turn_id)
            return 0
        entry_id = force_dead_letter(
            ctx,
            record,
            Reason.DEADLINE_EXCEEDED,
            DeadlineExceeded(record.turn_id, str(record.state)),
        )
        if entry_id is None:
            return 0
        logger.warning(
            "turn %s passed its deadline while %s: %s", record.turn_id, record.state, entry_id
        )
        return 1

    overdue = ctx.records.take_due(shard, shard.deadlines, limit=limit, bump_ms=5000)
    return ctx.records.sweep(overdue, end_overdue)


def force_dead_letter(
    ctx: JobContext, record: TurnRecord, reason: Reason, error: Exception
) -> str | None:
    """Dead-letter an unfinished turn from outside its worker (the pump: a deadline, a pause
    that expired), write its Celery result and wake the next turn of its conversation. Returns
    the entry id, or None when the turn had ended meanwhile."""
    entry_id, _error_text, ended = file_dead_letter(
        ctx.records,
        record,
        "",  # forced: whoever holds the lease, if anyone, is fenced out
        reason=reason,
        error=error,
        attempts=record.attempt,
        checkpoint=b"",
        base_run_id=stored_run_id(ctx, record.namespace),
    )
    if not ended.ended:
        return None
    write_final_result(ctx, record.turn_id, record.namespace)
    wake_turn(ended.next_head, record.namespace, ended.next_head_agent, record.conversation_id)
    return entry_id


def stored_run_id(ctx: JobContext, namespace: str) -> str:
    try:
        stored = ctx.store.load(namespace) if namespace else None
    except Exception:
        return ""
    return stored.run_id if stored else ""
