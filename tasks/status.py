"""A turn's status for people and programs: `turn_status(turn_id)` (docs/operations.md,
"Turn states and status")."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from tasks.context import job_context
from tasks.pauses import PendingAction, pending_actions
from tasks.records import TurnRecord, TurnState


def _when(epoch_ms: int) -> datetime | None:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC) if epoch_ms else None


@dataclass(frozen=True)
class TurnStatus:
    turn_id: str
    state: TurnState
    agent: str
    conversation_id: str
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

    @classmethod
    def of(cls, record: TurnRecord, queued_behind: str | None) -> TurnStatus:
        return cls(
            turn_id=record.turn_id,
            state=record.state,
            agent=record.agent,
            conversation_id=record.conversation_id,
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
        )


def turn_status(turn_id: str) -> TurnStatus | None:
    """The turn's status, or None for an id never submitted (or whose record expired)."""
    ctx = job_context()
    record = ctx.records.get(turn_id)
    if record is None:
        return None
    behind = None
    if record.state is TurnState.QUEUED and record.namespace:
        behind = ctx.records.turn_ahead(turn_id, record.namespace)
    return TurnStatus.of(record, behind)
