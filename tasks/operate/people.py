"""A person in the loop, in the job system (docs/operations.md, "People in the loop").

A turn whose run pauses (agent/pauses.py) is written `paused` by tasks/store/lua/pause.lua: its
progress and its paused iteration (the response and the outcomes of its other calls) stay in
the turn record, the lease and the worker are released, and the turn keeps its place at the
head of its conversation, so later turns wait. Nothing runs until a person decides, by turn id
and request id alone (a stateless web handler can): approve_action, reject_action,
answer_question, each one fenced script (tasks/store/lua/decide.lua). When every request of the
pause is decided the turn is queued again and woken; the worker that claims it resumes the run
with the recorded decisions, and the model is not asked again for the paused response. A pause
lasts AGENTJOBS_PAUSE_TTL_S at most: the pump then dead-letters it as pause_expired
(tasks/turn/pump.py). What a pause waits for is read by tasks/store/pending.py.

    pause.lua    running -> paused       journal:requests, request:<id> -> kind, deadline held
    decide.lua   paused -> paused        decision:<id> -> body, decided_by:<id> -> actor
                 paused -> queued        once every request is decided (turn.resumed)

Decisions stay in the record as long as it lives, so deciding again the same way is harmless
(False) even after the turn resumed or ended.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import orjson

from tasks.core.errors import ActionConflict, BadPayload
from tasks.core.payload import MAX_JSON_DEPTH, check_json_value
from tasks.core.schema import Decided
from tasks.queue.context import JobContext, job_context
from tasks.store.pending import PendingAction, pending_actions
from tasks.store.records import TurnRecord, TurnState
from tasks.turn.ending import wake

logger = logging.getLogger("agentjobs.pauses")


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
    if status == Decided.RECORDED:
        return True
    if status == Decided.RESUMED:
        logger.info("turn %s resumes: every request of its pause is decided", turn_id)
        wake(ctx, turn_id, record.namespace, reply[1], reply[2], attempt=record.attempt)
        return True
    if status == Decided.SAME:
        return False
    raise ActionConflict(turn_id, request_id, _refusal(status, reply[1:], decision))


# The call that makes each decision, as a refusal names it (the command line says
# `agentjobs turn approve` and so on instead: tasks/cli/errors.py).
_CALLS = {"approve": "approve_action", "reject": "reject_action", "answer": "answer_question"}


def _refusal(status: str, detail: list[str], decision: str) -> str:
    if status == "conflict":
        return "it was already decided otherwise"
    if status == "kind":
        # Rejecting fits either kind, so the refused decision is approving or answering.
        kind = detail[0] if detail else "request"
        fits = "approve_action" if kind == "approval" else "answer_question"
        article = "an" if kind[:1] in ("a", "e", "i", "o", "u") else "a"
        made = _CALLS.get(decision, decision)
        return f"{article} {kind} is decided with {fits} or reject_action, not {made}"
    if status == "unknown":
        return "that request was never pending on this turn"
    if status == "ended":
        state = detail[0] if detail else "ended"
        return f"the turn is {state}: its pause ended before this request was decided"
    return "no such turn (or its record expired)"
