"""What Celery's result backend says about a turn: its state while unfinished (RUNNING,
WAITING, with a small `.info`) and its final result, written from the turn record.

The turn record is the truth; these writes mirror it so that Flower and any Celery client see
what a turn is doing (docs/operations.md, "Turn states and status"). They use only the
backend's own API, whatever the backend is. A mirror write that fails never fails a turn.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import states

from tasks.core.errors import TurnCancelled, TurnDeadLettered
from tasks.queue.app import app
from tasks.queue.context import JobContext
from tasks.store.records import TurnRecord, TurnState

logger = logging.getLogger("agentjobs.results")

RUNNING = "RUNNING"
WAITING = "WAITING"
PAUSED = "PAUSED"


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


def write_final_result(ctx: JobContext, turn_id: str, namespace: str | None = None) -> bool:
    """Write an ended turn's Celery result from its record (and a dead letter's redacted
    error from its entry); False when the turn has not ended or is unknown."""
    record = ctx.records.get(turn_id, namespace)
    if record is None or not record.state.terminal:
        return False
    summary = ctx.dead_letters.summary(record.dlq_id) if record.dlq_id else None
    return store_final_result(record, str((summary or {}).get("error", "")))


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
