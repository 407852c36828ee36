"""A person in the loop, in the job system (docs/operations.md, "People in the loop").

A turn whose run pauses (agent/pauses.py) is written `paused` by tasks/store/lua/pause.lua: its
progress and its paused iteration (the response and the outcomes of its other calls) stay in
the turn record, the lease and the worker are released, and the turn keeps its place at the
head of its conversation, so later turns wait. Nothing runs until a person decides, by turn id
and request id alone (a stateless web handler can): approve_action, reject_action,
answer_question, each one fenced script (tasks/store/lua/decide.lua). When every request of the
pause is decided the turn is queued again and woken; the worker that claims it resumes the run
with the recorded decisions, and the model is not asked again for the paused response. A pause
lasts AGENTJOBS_PAUSE_TTL_S at most: the pump then dead-letters it as pause_expired.

    pause.lua    running -> paused       journal:requests, request:<id> -> kind, deadline held
    decide.lua   paused -> paused        decision:<id> -> body, decided_by:<id> -> actor
                 paused -> queued        once every request is decided (turn.resumed)

Decisions stay in the record as long as it lives, so deciding again the same way is harmless
(False) even after the turn resumed or ended.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import orjson

from agent import Decision, PendingRequest
from agent.pauses import request_dict, request_from_dict
from tasks.core.errors import ActionConflict, BadPayload, PauseExpired, Reason
from tasks.core.keys import ShardKeys
from tasks.core.payload import MAX_JSON_DEPTH, check_json_value
from tasks.operate.control import force_dead_letter, wake_turn
from tasks.queue.context import JobContext, job_context
from tasks.store.conversations import owner_of_namespace
from tasks.store.journal import REQUESTS
from tasks.store.records import Due, TurnRecord, TurnState

logger = logging.getLogger("agentjobs.pauses")


@dataclass(frozen=True)
class PendingAction:
    """A decision a paused turn waits for."""

    request_id: str
    kind: Literal["approval", "question"]
    tool: str
    tool_call_id: str
    args: Mapping[str, Any]
    question: str | None
    requested_at: datetime
    expires_at: datetime
    turn_id: str = ""
    # Whose turn waits (as TurnStatus): a handler approving by id checks these first.
    tenant: str | None = None
    principal: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "turnId": self.turn_id,
            "tenant": self.tenant,
            "principal": self.principal,
            "requestId": self.request_id,
            "kind": self.kind,
            "tool": self.tool,
            "toolCallId": self.tool_call_id,
            "args": dict(self.args),
            "question": self.question,
            "requestedAt": self.requested_at.isoformat(),
            "expiresAt": self.expires_at.isoformat(),
        }


def _utc(epoch_ms: int) -> datetime:
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)


def requests_json(requests: tuple[PendingRequest, ...]) -> bytes:
    return orjson.dumps([request_dict(r) for r in requests])


def paused_requests(record: TurnRecord) -> tuple[PendingRequest, ...]:
    """The requests of the turn's iteration in flight, when it paused for a person."""
    raw = record.journal.get(REQUESTS)
    return tuple(request_from_dict(r) for r in orjson.loads(raw)) if raw else ()


def pending_actions(record: TurnRecord) -> tuple[PendingAction, ...]:
    """What a paused turn waits for (empty unless it is paused): its requests not decided."""
    if record.state is not TurnState.PAUSED:
        return ()
    requested, expires = _utc(record.paused_at_ms), _utc(record.pause_expires_at_ms)
    tenant, principal = owner_of_namespace(record.namespace)
    return tuple(
        PendingAction(
            request_id=r.request_id,
            kind="question" if r.kind == "question" else "approval",
            tool=r.tool,
            tool_call_id=r.tool_call_id,
            args=dict(r.args),
            question=r.question,
            requested_at=requested,
            expires_at=expires,
            turn_id=record.turn_id,
            tenant=tenant,
            principal=principal,
        )
        for r in paused_requests(record)
        if r.request_id not in record.decisions
    )


def recorded_decisions(record: TurnRecord) -> dict[str, Decision]:
    """The decisions recorded for the requests of the turn's paused iteration."""
    decisions = {}
    for request in paused_requests(record):
        body = record.decisions.get(request.request_id)
        if body is not None:
            decisions[request.request_id] = _decision_of(orjson.loads(body))
    return decisions


def paused_turns(ctx: JobContext) -> list[tuple[TurnRecord, tuple[PendingAction, ...]]]:
    """Every paused turn with what it waits for, the soonest to expire first."""
    found: list[tuple[int, str]] = []
    for shard in ctx.keys.all_shards():
        members: Any = ctx.redis.zrange(shard.pauses, 0, -1, withscores=True)
        found += [(int(score), member.decode()) for member, score in members]
    turns = []
    for _, turn_id in sorted(found):
        record = ctx.records.readable(turn_id)
        if record is not None and record.state is TurnState.PAUSED:
            turns.append((record, pending_actions(record)))
    return turns


# -- decisions ----------------------------------------------------------------------------------


def _body(decision: str, **fields: Any) -> bytes:
    # Sorted keys: the same decision always has the same bytes, so the script can compare.
    present = {key: value for key, value in fields.items() if value is not None}
    return orjson.dumps({"decision": decision, **present}, option=orjson.OPT_SORT_KEYS)


def _decision_of(body: Mapping[str, Any]) -> Decision:
    kind = body.get("decision")
    if kind == "approve":
        return Decision.approve(body.get("editedArgs"))
    if kind == "answer":
        return Decision.answer(str(body.get("answer", "")))
    return Decision.reject(str(body.get("message", "")))


_PLAIN_JSON = (
    "send JSON values only (strings, finite numbers, integers within 64 bits, booleans, null, "
    f"lists, objects with string keys, at most {MAX_JSON_DEPTH} levels deep) and approve again"
)


def approve_action(
    turn_id: str,
    request_id: str,
    *,
    edited_args: Mapping[str, Any] | None = None,
    actor: str = "",
    identity: Mapping[str, Any] | None = None,
) -> bool:
    """Approve a paused turn's call (with `edited_args` in place of the model's when given).
    True when recorded; False when this decision was already recorded."""
    if edited_args is not None and not isinstance(edited_args, Mapping):
        raise ActionConflict(turn_id, request_id, "edited_args must be a mapping of arguments")
    edited = dict(edited_args) if edited_args is not None else None
    try:
        # Refused here, before anything is stored: orjson would raise deep inside, or write
        # NaN as null, and the tool would run with arguments nobody approved.
        check_json_value(edited, "edited_args")
        body = _body("approve", editedArgs=edited)
    except (BadPayload, TypeError) as bad:
        problem = bad.problem if isinstance(bad, BadPayload) else "is not JSON"
        raise ActionConflict(turn_id, request_id, f"edited_args {problem}; {_PLAIN_JSON}") from None
    return _decide(turn_id, request_id, "approve", body, actor, identity)


def reject_action(
    turn_id: str,
    request_id: str,
    *,
    message: str = "",
    actor: str = "",
    identity: Mapping[str, Any] | None = None,
) -> bool:
    """Reject a paused turn's call: the model gets `[rejected] <message>` for it."""
    if not isinstance(message, str):
        raise ActionConflict(turn_id, request_id, "a rejection's message must be a string")
    body = _body("reject", message=message)
    return _decide(turn_id, request_id, "reject", body, actor, identity)


def answer_question(
    turn_id: str,
    request_id: str,
    answer: str,
    *,
    actor: str = "",
    identity: Mapping[str, Any] | None = None,
) -> bool:
    """Answer a paused turn's question (agent.ask_user): the answer is its tool result."""
    if not isinstance(answer, str):
        raise ActionConflict(turn_id, request_id, "an answer must be a string")
    body = _body("answer", answer=answer)
    return _decide(turn_id, request_id, "answer", body, actor, identity)


def _decide(
    turn_id: str,
    request_id: str,
    decision: str,
    body: bytes,
    actor: str,
    identity: Mapping[str, Any] | None,
) -> bool:
    """Record one decision. `actor` is recorded as given, never checked: with `identity`,
    a turn of another tenant or principal is refused exactly as an unknown one."""
    if not isinstance(actor, str):
        raise ActionConflict(turn_id, request_id, "actor must be a string")
    ctx = job_context()
    record = ctx.records.find(turn_id, identity)
    if record is None:
        raise ActionConflict(turn_id, request_id, "no such turn (or its record expired)")
    event = orjson.dumps({"requestId": request_id, "decision": decision, "actor": actor})
    reply = ctx.records.decide(
        turn_id,
        record.namespace,
        request_id,
        decision=decision,
        body=body,
        actor=actor,
        event=event,
    )
    status = reply[0]
    if status == "recorded":
        return True
    if status == "resumed":
        logger.info("turn %s resumes: every request of its pause is decided", turn_id)
        wake_turn(turn_id, record.namespace, reply[1], reply[2])
        return True
    if status == "same":
        return False
    raise ActionConflict(turn_id, request_id, _refusal(status, reply[1:], decision))


def _refusal(status: str, detail: list[str], decision: str) -> str:
    if status == "conflict":
        return "it was already decided otherwise"
    if status == "kind":
        kind = detail[0] if detail else "request"
        wanted = "approve_action or reject_action" if kind == "approval" else "answer_question"
        return f"a {kind} is decided with {wanted}, not {decision}"
    if status == "unknown":
        return "that request was never pending on this turn"
    if status == "ended":
        state = detail[0] if detail else "ended"
        return f"the turn is {state}: its pause ended before this request was decided"
    return "no such turn (or its record expired)"


# -- expiry (the pump) ----------------------------------------------------------------------------


def end_expired_pauses(ctx: JobContext, shard: ShardKeys, *, limit: int) -> int:
    """Dead-letter the shard's paused turns nobody decided on in time (pause_expired); the
    conversation moves on. Returns how many."""

    def end_expired(due: Due) -> int:
        record = ctx.records.get(due.turn_id, due.namespace)
        if record is None or record.state is not TurnState.PAUSED:
            ctx.redis.zrem(shard.pauses, due.turn_id)
            return 0
        pending = len(pending_actions(record))
        error = PauseExpired(record.turn_id, pending)
        entry_id = force_dead_letter(ctx, record, Reason.PAUSE_EXPIRED, error)
        if entry_id is None:
            return 0
        logger.warning("turn %s: its pause expired undecided: %s", record.turn_id, entry_id)
        return 1

    expired = ctx.records.take_due(shard, shard.pauses, limit=limit, bump_ms=5000)
    return ctx.records.sweep(expired, end_expired)
