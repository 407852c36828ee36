"""The one table from how an attempt ended to what happens to its turn (`decide`), and the
outcomes it picks from. tasks/turn/ending.py carries each outcome out."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import redis

from agent import (
    AgentError,
    AgentRunCheckpoint,
    CheckpointFormatError,
    ConversationMismatchError,
    InvalidRunInputError,
    MessageDeniedError,
    RunCheckpointError,
    RunStopped,
    can_resume,
)
from tasks.core.errors import BudgetWait, HandedOver, JobError, LeaseLost, Reason


class Outcome(StrEnum):
    SUCCEED = "succeed"
    RETRY = "retry"
    DEAD_LETTER = "dead_letter"
    HAND_OVER = "hand_over"  # this worker is shutting down: another takes the turn at once
    PAUSE = "pause"  # a call waits for a person: the turn holds no worker until decided
    WAIT = "wait"  # a model call waits for a budget or a tenant cap: no worker until it frees
    IGNORE = "ignore"  # write nothing: another delivery owns the turn, or Redis is away


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    reason: Reason | None = None
    error: BaseException | None = None
    # The checkpoint to keep (a failed run's), when the failure carries one.
    checkpoint: AgentRunCheckpoint | None = None


# Errors the runtime raises at a door (before or instead of running), by dead-letter reason.
_DOOR_REASONS: dict[type[BaseException], Reason] = {
    CheckpointFormatError: Reason.INVALID_CHECKPOINT,
    ConversationMismatchError: Reason.CONVERSATION_MISMATCH,
    InvalidRunInputError: Reason.BAD_PAYLOAD,
    MessageDeniedError: Reason.MESSAGE_DENIED,
}


def decide(exc: BaseException, *, attempt: int, max_attempts: int) -> Decision:
    """What a failed attempt's exception means for the turn. A run the job system's own
    check points stopped (tasks/turn/checkpoints.py) carries their reason: the worker shuts
    down (hand the turn over), the turn is no longer this delivery's (write nothing), a budget
    or tenant cap holds the next model call (wait), or can never admit it (dead letter)."""
    if isinstance(exc, RunStopped):
        if isinstance(exc.reason, HandedOver):
            return Decision(Outcome.HAND_OVER)
        if isinstance(exc.reason, LeaseLost):
            return Decision(Outcome.IGNORE)
        if isinstance(exc.reason, BudgetWait):
            return Decision(Outcome.WAIT, None, exc.reason)
        if isinstance(exc.reason, JobError):  # budget_too_small, tenant_over_limit
            return Decision(Outcome.DEAD_LETTER, exc.reason.reason, exc.reason, exc.checkpoint)
        return Decision(Outcome.DEAD_LETTER, Reason.INTERNAL_ERROR, exc)
    if isinstance(exc, RunCheckpointError):
        if isinstance(exc.cause, LeaseLost | redis.RedisError):
            # A write of a check point failed: Redis went away mid-run. Nothing is written;
            # the lease runs out and the pump wakes the turn.
            return Decision(Outcome.IGNORE)
        if not can_resume(exc):
            return Decision(Outcome.DEAD_LETTER, Reason.NON_RESUMABLE, exc.cause, exc.checkpoint)
        if attempt >= max_attempts:
            return Decision(Outcome.DEAD_LETTER, Reason.MAX_ATTEMPTS, exc.cause, exc.checkpoint)
        return Decision(Outcome.RETRY, None, exc.cause, exc.checkpoint)
    if isinstance(exc, LeaseLost | redis.RedisError):
        return Decision(Outcome.IGNORE)
    if isinstance(exc, JobError):
        return Decision(Outcome.DEAD_LETTER, exc.reason, exc)
    if isinstance(exc, AgentError):
        return Decision(
            Outcome.DEAD_LETTER, _DOOR_REASONS.get(type(exc), Reason.INTERNAL_ERROR), exc
        )
    return Decision(Outcome.DEAD_LETTER, Reason.INTERNAL_ERROR, exc)
