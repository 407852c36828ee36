"""What a paused turn waits for, read from its record: the pending actions a person decides
on (`PendingAction`, public from `tasks`), and the decisions recorded so far, as the worker
resumes with them. Writing a pause is tasks/store/lua/pause.lua; deciding is decide.lua
(tasks/operate/people.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import orjson

from agent import Decision, PendingRequest
from agent.pauses import request_dict, request_from_dict
from tasks.core.namespaces import owner_of_namespace
from tasks.store.journal import REQUESTS
from tasks.store.records import TurnRecord, TurnState


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


def _decision_of(body: Mapping[str, Any]) -> Decision:
    kind = body.get("decision")
    if kind == "approve":
        return Decision.approve(body.get("editedArgs"))
    if kind == "answer":
        return Decision.answer(str(body.get("answer", "")))
    return Decision.reject(str(body.get("message", "")))
