"""run_turn's payload: what a caller may send, checked before anything else happens."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent import InvalidRunInputError
from agent.runtime import normalize_input
from tasks.core.errors import BadPayload
from tasks.core.namespaces import namespace_for

ALLOWED_KEYS = frozenset(
    {"agent", "conversation_id", "message", "identity", "message_from", "time", "deadline_s"}
)
MAX_CONVERSATION_ID_CHARS = 512
# A caller-chosen turn id (task_id): printable ASCII without whitespace. It names Redis keys,
# Celery result keys and log lines, so nothing in it may be read as a separator or control.
MAX_TURN_ID_CHARS = 200
_TURN_ID = re.compile(rf"[!-~]{{1,{MAX_TURN_ID_CHARS}}}")
# JSON values the payload may hold: what every Redis value, Celery message and checkpoint
# round-trips exactly (orjson refuses deeper nesting and wider ints; NaN would become null).
MAX_JSON_DEPTH = 64
_INT_BOUND = 2**63


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


def check_turn_id(value: object) -> str:
    """A caller-chosen turn id, or BadPayload naming what is wrong with it (never quoting it:
    it may be anything)."""
    if not isinstance(value, str):
        raise BadPayload("task_id", "must be a string")
    if not _TURN_ID.fullmatch(value):
        raise BadPayload(
            "task_id",
            f"must be 1-{MAX_TURN_ID_CHARS} printable ASCII characters without whitespace",
        )
    return value


def check_json_value(value: object, field: str, depth: int = 0) -> None:
    """Refuse, naming the field, a value that would not round-trip as JSON through Redis and
    the broker exactly: non-string keys, NaN or infinite floats, ints beyond 64 bits, strings
    that are not valid Unicode, other types, or nesting deeper than MAX_JSON_DEPTH."""
    if depth > MAX_JSON_DEPTH:
        raise BadPayload(field, f"is nested deeper than {MAX_JSON_DEPTH} levels")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            raise BadPayload(field, "holds a string that is not valid Unicode") from None
    elif isinstance(value, int):
        if not -_INT_BOUND <= value < _INT_BOUND:
            raise BadPayload(field, "holds an integer beyond 64 bits")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise BadPayload(field, "holds a NaN or infinite number (not JSON)")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise BadPayload(field, "holds an object key that is not a string")
            check_json_value(key, field, depth + 1)
            check_json_value(item, field, depth + 1)
    elif isinstance(value, list | tuple):
        for item in value:
            check_json_value(item, field, depth + 1)
    else:
        raise BadPayload(field, f"holds a {type(value).__name__}, which is not a JSON value")


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


def _deadline_s(value: object, max_deadline_s: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadPayload("deadline_s", "must be a number of seconds")
    if not math.isfinite(value) or not value > 0:
        raise BadPayload("deadline_s", "must be a finite number of seconds greater than 0")
    if max_deadline_s is not None and value > max_deadline_s:
        raise BadPayload(
            "deadline_s", f"must be at most {max_deadline_s:g} s (AGENTJOBS_MAX_DEADLINE_S)"
        )
    return float(value)


def deadline_ms(deadline_s: float) -> int:
    """A deadline as whole ms, never 0 for a positive one (0 means none in the record)."""
    return max(1, math.ceil(deadline_s * 1000))


def parse_payload(
    kwargs: object, *, max_deadline_s: float | None = None, stored: bool = False
) -> TurnRequest:
    """The request `kwargs` names, or BadPayload. `max_deadline_s` is
    AGENTJOBS_MAX_DEADLINE_S where a new turn is being accepted; None where a recorded one is
    read back. `stored` says `kwargs` was read back from a turn record: JSON the store holds
    is JSON-safe already (orjson writes no NaN, reads no integer beyond 64 bits), so the walk
    over every value is skipped; the fields are checked as ever."""
    if not isinstance(kwargs, Mapping):
        raise BadPayload("<payload>", "run_turn takes keyword arguments only")
    unknown = sorted(str(k) for k in kwargs if k not in ALLOWED_KEYS)
    if unknown:
        raise BadPayload(
            "<payload>", f"unknown arguments {unknown}; allowed: {sorted(ALLOWED_KEYS)}"
        )
    if not stored:
        for key, value in kwargs.items():
            check_json_value(value, key)
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
        deadline_s=_deadline_s(kwargs.get("deadline_s"), max_deadline_s),
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
