"""The job system's errors and dead-letter reasons.

    JobError                      .code, .reason (a dead-letter reason)
    ├── BadPayload                a run_turn payload that cannot be a turn
    ├── UnknownAgent              no agent registered under that name
    ├── UnreadableConversation    a stored conversation that is not a conversation-v1 envelope
    ├── PoisonTurn                a turn whose worker died every time it ran
    ├── AgentUnavailable          a registered agent whose factory failed
    ├── DeadlineExceeded          a turn still unfinished at its deadline
    ├── PauseExpired              a paused turn nobody decided on within the pause TTL
    ├── StateLost                 a message whose turn record the store lost (store/client.py)
    ├── UnreadableRecord          a turn record whose fields cannot be read (skipped, counted)
    └── LeaseLost                 another worker took the conversation over, or the turn was
        │                         cancelled (this delivery stops writing)
        └── HandedOver            this worker is shutting down: the run stops at a check point
                                  and the turn goes to another worker at once
    TurnDeadLettered              what result.get() raises for a turn that ended dead-lettered
    TurnCancelled                 what result.get() raises for a cancelled turn
    InvalidTurnRequest (ValueError)   run_turn.delay(...) refused before anything is queued
    ActionConflict (ValueError)   a decision that contradicts one recorded, does not fit its
                                  request, or names no request pending on that turn

TurnDeadLettered and TurnCancelled are rebuilt by Celery's result backend from their
constructor arguments, so their constructors take exactly those, positionally.
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    MAX_ATTEMPTS = "max_attempts"
    NON_RESUMABLE = "non_resumable"
    POISON = "poison"
    INVALID_CHECKPOINT = "invalid_checkpoint"
    UNREADABLE_CONVERSATION = "unreadable_conversation"
    UNKNOWN_AGENT = "unknown_agent"
    CONVERSATION_MISMATCH = "conversation_mismatch"
    BAD_PAYLOAD = "bad_payload"
    MESSAGE_DENIED = "message_denied"
    AGENT_UNAVAILABLE = "agent_unavailable"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    PAUSE_EXPIRED = "pause_expired"
    STATE_LOST = "state_lost"
    BUDGET_TOO_SMALL = "budget_too_small"
    TENANT_OVER_LIMIT = "tenant_over_limit"
    INTERNAL_ERROR = "internal_error"


class JobError(Exception):
    code = "ERR_JOB"
    reason: Reason = Reason.INTERNAL_ERROR


class BadPayload(JobError):
    code = "ERR_BAD_PAYLOAD"
    reason = Reason.BAD_PAYLOAD

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"bad run_turn payload: {field}: {problem}")


class UnknownAgent(JobError):
    code = "ERR_UNKNOWN_AGENT"
    reason = Reason.UNKNOWN_AGENT

    def __init__(self, name: str, known: list[str], problem: str | None = None) -> None:
        self.name = name
        what = problem or f"no agent registered as {name!r} (registered: {known})"
        super().__init__(
            f"{what}; register it in AGENTS (celeryconfig.py) or AGENTJOBS_AGENTS, then replay "
            "the dead letter"
        )


class UnreadableConversation(JobError):
    code = "ERR_UNREADABLE_CONVERSATION"
    reason = Reason.UNREADABLE_CONVERSATION

    def __init__(self, key: str, problem: str) -> None:
        self.key = key
        super().__init__(
            f"stored conversation {key} is unreadable: {problem}; it was left untouched and is "
            "not treated as a new conversation"
        )


class PoisonTurn(JobError):
    code = "ERR_POISON_TURN"
    reason = Reason.POISON

    def __init__(self, turn_id: str, deliveries: int) -> None:
        super().__init__(
            f"turn {turn_id} was started {deliveries} times without finishing (its worker died "
            "each time); it is set aside instead of killing more workers"
        )


class AgentUnavailable(JobError):
    code = "ERR_AGENT_UNAVAILABLE"
    reason = Reason.AGENT_UNAVAILABLE

    def __init__(self, name: str, problem: str) -> None:
        self.name = name
        super().__init__(f"{problem}; fix the factory, restart the workers, then replay")


class DeadlineExceeded(JobError):
    code = "ERR_DEADLINE_EXCEEDED"
    reason = Reason.DEADLINE_EXCEEDED

    def __init__(self, turn_id: str, state: str) -> None:
        super().__init__(
            f"turn {turn_id} was still {state} at its deadline (run_turn's deadline_s, default "
            "AGENTJOBS_TURN_DEADLINE_S); its conversation moved on"
        )


class PauseExpired(JobError):
    code = "ERR_PAUSE_EXPIRED"
    reason = Reason.PAUSE_EXPIRED

    def __init__(self, turn_id: str, pending: int) -> None:
        super().__init__(
            f"turn {turn_id} waited for {pending} decision(s) of a person past its pause TTL "
            "(AGENTJOBS_PAUSE_TTL_S); its conversation moved on"
        )


class ActionConflict(JobError, ValueError):
    """A decision that cannot be recorded: `turn_id`, `request_id` and `problem` say why."""

    code = "ERR_ACTION_CONFLICT"

    def __init__(self, turn_id: str, request_id: str, problem: str) -> None:
        self.turn_id = turn_id
        self.request_id = request_id
        self.problem = problem
        super().__init__(f"turn {turn_id}, request {request_id}: {problem}")


class StateLost(JobError):
    code = "ERR_STATE_LOST"
    reason = Reason.STATE_LOST

    def __init__(self, turn_id: str, why: str) -> None:
        self.turn_id = turn_id
        super().__init__(
            f"turn {turn_id} has a message but no record: the state store lost its data ({why}); "
            "it was not run on what is left of its conversation. The entry keeps what the "
            "message carried; replay it to run that message on the conversation as it is now"
        )


class UnreadableRecord(JobError):
    """A turn record in the store that cannot be read as one (written by hand, by an older
    version, or damaged): every sweep logs it once, skips it and goes on."""

    code = "ERR_UNREADABLE_RECORD"

    def __init__(self, turn_id: str, problem: str) -> None:
        self.turn_id = turn_id
        self.problem = problem
        super().__init__(
            f"turn record {turn_id!r} is unreadable ({problem}); it is skipped. Inspect it with "
            f"`agentjobs turn show {turn_id}` or remove it with redis-cli"
        )


class LeaseLost(JobError):
    code = "ERR_LEASE_LOST"

    def __init__(self, turn_id: str) -> None:
        super().__init__(f"turn {turn_id} lost its conversation lease; another worker owns it")


class HandedOver(LeaseLost):
    """The turn was handed over at a check point: its worker is shutting down. A LeaseLost,
    since the lease is another worker's to take now, and this delivery writes nothing more."""

    code = "ERR_HANDED_OVER"

    def __init__(self, turn_id: str) -> None:
        JobError.__init__(
            self, f"turn {turn_id} was handed over to another worker: this one is shutting down"
        )


class BudgetTooSmall(JobError):
    """A model call needs more than a whole limit of its budget admits: it could never run."""

    code = "ERR_BUDGET_TOO_SMALL"
    reason = Reason.BUDGET_TOO_SMALL

    def __init__(self, budget: str, limit: str, need: int) -> None:
        self.budget = budget
        self.limit = limit
        self.need = need
        super().__init__(
            f"a model call of budget {budget} needs {need}, more than its whole limit {limit}; "
            "raise the limit in AGENTJOBS_BUDGETS (or lower the output cap), then replay"
        )


class TenantOverLimit(JobError):
    """The tenant's reported token usage reached its cap, and AGENTJOBS_TENANT_OVER_LIMIT says
    such turns are dead-lettered rather than left waiting."""

    code = "ERR_TENANT_OVER_LIMIT"
    reason = Reason.TENANT_OVER_LIMIT

    def __init__(self, tenant: str, cap: str, used: int) -> None:
        self.tenant = tenant
        super().__init__(
            f"tenant {tenant!r} used {used} tokens, its cap is {cap} (AGENTJOBS_TENANT_TOKEN_LIMIT)"
        )


class BudgetWait(JobError):
    """A check point's stop: the model call cannot start yet. `waiting_for` is "budget" (a
    provider budget is spent, or closed by a 429) or "tenant_tokens" (the tenant's cap);
    `limit` names the limit ("retry-after" for a closed budget), `due_at_ms` (server epoch ms)
    when it frees. The turn waits
    holding no worker and starts again then."""

    code = "ERR_BUDGET_WAIT"

    def __init__(self, waiting_for: str, limit: str, due_at_ms: int, *, budget: str) -> None:
        self.waiting_for = waiting_for
        self.limit = limit
        self.due_at_ms = due_at_ms
        self.budget = budget  # "provider:model", or "tenant_tokens"
        super().__init__(f"waiting for {waiting_for} {budget} {limit} until {due_at_ms}")


class TurnDeadLettered(Exception):
    code = "ERR_TURN_DEAD_LETTERED"

    def __init__(self, entry_id: str, reason: str, message: str = "") -> None:
        self.entry_id = entry_id
        self.reason = reason
        super().__init__(entry_id, reason, message)

    def __str__(self) -> str:
        message = self.args[2] if len(self.args) > 2 else ""
        return (
            f"turn dead-lettered as {self.entry_id} ({self.reason}): {message}; inspect it with "
            f"`agentjobs dlq show {self.entry_id}`"
        )


class TurnCancelled(Exception):
    code = "ERR_TURN_CANCELLED"

    def __init__(self, turn_id: str, reason: str = "") -> None:
        self.turn_id = turn_id
        self.reason = reason
        super().__init__(turn_id, reason)

    def __str__(self) -> str:
        why = f": {self.reason}" if self.reason else ""
        return f"turn {self.turn_id} was cancelled{why}"


class InvalidTurnRequest(ValueError):
    code = "ERR_INVALID_TURN_REQUEST"

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        super().__init__(f"run_turn: {field}: {problem}")
