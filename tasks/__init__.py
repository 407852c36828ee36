"""agentjobs' job system: agent turns as Celery tasks on Redis, with checkpointed retries,
backoff, per-conversation order, crash recovery and a dead-letter store."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent import AgentRunCheckpoint
from tasks.core.errors import (
    ActionConflict,
    InvalidTurnRequest,
    Reason,
    TurnCancelled,
    TurnDeadLettered,
)
from tasks.core.namespaces import namespace_for
from tasks.operate.control import cancel_conversation, cancel_turn
from tasks.operate.events import TurnEvent, iter_events
from tasks.operate.people import answer_question, approve_action, reject_action
from tasks.operate.status import TurnStatus, turn_status
from tasks.queue.app import app
from tasks.queue.context import job_context
from tasks.store.pending import PendingAction
from tasks.store.records import TurnState
from tasks.turn.tasks import resume_turn, run_turn
from tasks.turn.worker import HandoverStep, PresenceStep

app.steps["worker"].add(PresenceStep)
app.steps["worker"].add(HandoverStep)


def load_conversation(
    conversation_id: str, identity: Mapping[str, Any] | None = None
) -> AgentRunCheckpoint | None:
    """The conversation as stored after its last completed turn, or None if it has none.

    `identity` ({tenant?, principal?}) selects the namespace, as it did for run_turn.
    """
    return job_context().store.load(namespace_for(conversation_id, identity))


__all__ = [
    "ActionConflict",
    "InvalidTurnRequest",
    "PendingAction",
    "Reason",
    "TurnCancelled",
    "TurnDeadLettered",
    "TurnEvent",
    "TurnState",
    "TurnStatus",
    "answer_question",
    "app",
    "approve_action",
    "cancel_conversation",
    "cancel_turn",
    "iter_events",
    "load_conversation",
    "reject_action",
    "resume_turn",
    "run_turn",
    "turn_status",
]
