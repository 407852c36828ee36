"""run_turn's payload: what a caller may send, checked before anything else happens."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent import InvalidRunInputError
from agent.runtime import normalize_input
from tasks.errors import BadPayload
from tasks.store import namespace_for

ALLOWED_KEYS = frozenset(
    {"agent", "conversation_id", "message", "identity", "message_from", "time", "deadline_s"}
)
MAX_CONVERSATION_ID_CHARS = 512


@dataclass(frozen=True)
class TurnRequest:
    agent: str
    conversation_id: str
    message: str
    # The caller's identity with conversationId filled in; None when the caller named nobody.
    identity: dict[str, Any] | None
    message_from: str | None
    time: Any
    namespace: str
    deadline_s: float | None  # None: AGENTJOBS_TURN_DEADLINE_S


def _check_conversation_id(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise BadPayload("conversation_id", "must be a non-empty string")
    if len(value) > MAX_CONVERSATION_ID_CHARS:
        raise BadPayload("conversation_id", f"longer than {MAX_CONVERSATION_ID_CHARS} characters")
    return value


def _identity(value: object, conversation_id: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise BadPayload("identity", "must be an object {tenant?, principal?}")
    identity = dict(value)
    for key in ("tenant", "principal"):
        if identity.get(key) is not None and not isinstance(identity[key], str):
            raise BadPayload(f"identity.{key}", "must be a string")
    stated = identity.get("conversationId")
    if stated is not None and stated != conversation_id:
        raise BadPayload(
            "identity.conversationId",
            "differs from conversation_id; leave it out or make them equal",
        )
    identity["conversationId"] = conversation_id
    return {k: v for k, v in identity.items() if v is not None}


def _deadline_s(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise BadPayload("deadline_s", "must be a positive number of seconds")
    if value == float("inf"):
        raise BadPayload("deadline_s", "must be finite")
    return float(value)


def parse_payload(kwargs: object) -> TurnRequest:
    if not isinstance(kwargs, Mapping):
        raise BadPayload("<payload>", "run_turn takes keyword arguments only")
    unknown = sorted(str(k) for k in kwargs if k not in ALLOWED_KEYS)
    if unknown:
        raise BadPayload(
            "<payload>", f"unknown arguments {unknown}; allowed: {sorted(ALLOWED_KEYS)}"
        )
    agent = kwargs.get("agent")
    if not isinstance(agent, str) or not agent:
        raise BadPayload("agent", "must be a registered agent name")
    conversation_id = _check_conversation_id(kwargs.get("conversation_id"))
    identity = _identity(kwargs.get("identity"), conversation_id)
    try:
        checked = normalize_input(
            {"message": kwargs.get("message"), "messageFrom": kwargs.get("message_from")}
        )
    except InvalidRunInputError as exc:
        raise BadPayload(exc.field, exc.problem) from None
    return TurnRequest(
        agent=agent,
        conversation_id=conversation_id,
        message=checked.message,
        identity=identity,
        message_from=checked.message_from,
        time=kwargs.get("time"),
        namespace=namespace_for(conversation_id, identity),
        deadline_s=_deadline_s(kwargs.get("deadline_s")),
    )


def registration_of(kwargs: object) -> tuple[str, str, str]:
    """(agent, conversation_id, namespace) as far as they can be read; namespace is '' for a
    payload too broken to queue (the worker dead-letters it as bad_payload)."""
    try:
        request = parse_payload(kwargs)
    except BadPayload:
        agent = kwargs.get("agent") if isinstance(kwargs, Mapping) else None
        conversation = kwargs.get("conversation_id") if isinstance(kwargs, Mapping) else None
        return (
            agent if isinstance(agent, str) else "",
            conversation if isinstance(conversation, str) else "",
            "",
        )
    return request.agent, request.conversation_id, request.namespace
