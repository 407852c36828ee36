"""A turn's status for people and programs: `turn_status(turn_id)` (docs/operations.md,
"Turn states and status")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tasks.core.namespaces import owner_of_namespace
from tasks.queue.context import job_context
from tasks.store.pending import PendingAction, pending_actions
from tasks.store.records import TurnRecord, TurnState


def _when(epoch_ms: int) -> datetime | None:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC) if epoch_ms else None


@dataclass(frozen=True)
class TurnStatus:
    turn_id: str
    state: TurnState
    agent: str
    conversation_id: str
    # Whose turn it is (the identity run_turn was given; None where it named none): a handler
    # that serves turns by id checks these, or passes the caller's identity to turn_status.
    tenant: str | None
    principal: str | None
    attempt: int  # 1 for the first
    iteration: int  # in flight or last persisted, counted across attempts
    due_at: datetime | None  # while waiting
    last_error: str | None  # redacted
    dead_letter_id: str | None
    queued_behind: str | None  # the earlier unfinished turn of the conversation it waits for
    pending: tuple[PendingAction, ...]  # what it waits for while paused, else empty
    cancel_reason: str | None
    replayed_as: str | None
    created_at: datetime
    updated_at: datetime
    # While waiting: "retry" (a backoff after a failed attempt), "budget" (a provider budget is
    # spent or closed by a 429) or "tenant_tokens" (the tenant reached its token cap); else None.
    waiting_for: str | None = None

    @classmethod
    def of(cls, record: TurnRecord, queued_behind: str | None) -> TurnStatus:
        tenant, principal = owner_of_namespace(record.namespace)
        return cls(
            turn_id=record.turn_id,
            state=record.state,
            agent=record.agent,
            conversation_id=record.conversation_id,
            tenant=tenant,
            principal=principal,
            attempt=record.attempt,
            iteration=record.iteration or (1 if record.state is not TurnState.QUEUED else 0),
            due_at=_when(record.due_at_ms) if record.state is TurnState.WAITING else None,
            last_error=record.last_error or None,
            dead_letter_id=record.dlq_id or None,
            queued_behind=queued_behind,
            pending=pending_actions(record),
            cancel_reason=record.cancel_reason or None,
            replayed_as=record.replayed_as or None,
            created_at=_when(record.created_at_ms) or datetime.fromtimestamp(0, UTC),
            updated_at=_when(record.updated_at_ms) or datetime.fromtimestamp(0, UTC),
            waiting_for=_waiting_for(record),
        )


def _waiting_for(record: TurnRecord) -> str | None:
    if record.state is not TurnState.WAITING:
        return None
    return record.waiting_for or "retry"


def turn_status(turn_id: str, identity: Mapping[str, Any] | None = None) -> TurnStatus | None:
    """The turn's status, or None for an id never submitted (or whose record expired), or,
    with `identity` ({tenant?, principal?} as run_turn takes it), a turn of another one."""
    ctx = job_context()
    record = ctx.records.find(turn_id, identity)
    if record is None:
        return None
    behind = None
    if record.state is TurnState.QUEUED and record.namespace:
        behind = ctx.records.turn_ahead(turn_id, record.namespace)
    return TurnStatus.of(record, behind)
