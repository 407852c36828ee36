"""Stopping turns by hand: cancel_turn and cancel_conversation (docs/operations.md, "Cancel and
deadlines").

A cancel takes effect in the turn record at once, whatever the state: the turn ends as
cancelled, its lease, retry and queue place are released and the next turn of the conversation
is woken (tasks/turn/ending.py, `cancel`). A worker still running it is fenced out: it stops at
its next check point (each tool call's event, each persisted round, the lease keeper's
renewal) and its late writes are refused. result.get() raises TurnCancelled at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tasks.core.namespaces import namespace_for
from tasks.queue.context import job_context
from tasks.turn import ending


def cancel_turn(
    turn_id: str, *, reason: str = "", identity: Mapping[str, Any] | None = None
) -> bool:
    """True when the turn was unfinished and is now cancelled; False when it had already ended
    or is unknown (with `identity`, a turn of another one is unknown)."""
    ctx = job_context()
    record = ctx.records.find(turn_id, identity)
    if record is None or record.state.terminal:
        return False
    return ending.cancel(ctx, record, reason=reason)


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
