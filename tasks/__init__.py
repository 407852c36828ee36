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
from tasks.core.namespaces import IdentityHint, namespace_for
from tasks.operate.control import cancel_conversation, cancel_turn, identity_hint
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

    `identity` ({tenant?, principal?}) selects the namespace, as it did for run_turn: a
    conversation whose turns were submitted with an identity is not found without it. When
    None comes back and the namespace has no unfinished turn either, this warns IdentityHint
    (tasks.core.namespaces): called without tenant and principal, that the default namespace
    `_/_/<id>` was used; called with an identity, where the conversation is when it is filed
    under a part of that identity (tenant alone, principal alone, or neither). Key lookups
    only, never a scan (tasks.operate.control.identity_hint).
    """
    ctx = job_context()
    found = ctx.store.load(namespace_for(conversation_id, identity))
    if found is None:
        identity_hint(ctx, "load_conversation", conversation_id, identity)
    return found


__all__ = [
    "ActionConflict",
    "IdentityHint",
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
