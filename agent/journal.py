"""What a host needs to make tool calls durable: effects, idempotency keys and the journal of
the iteration in flight (docs/operations.md, "Tools that do not run twice").

The runtime writes nothing durable itself. It tells its host, through hooks, what to keep:
`on_response` (a ResponseReport) when a model response whose tools will run arrives, before
any of them runs; `on_tool_call` (a ToolCallReport) as each call starts and finishes, with the
call's index, attempt, idempotency key and, once finished, its result text. A host that kept
those passes them back as an `IterationJournal` to `run` or `resume_on_error`; the run then
continues the iteration in flight instead of calling the model again for it:

- a completed call is not run again: its recorded result is the tool message;
- a call that never started runs (attempt 1, a new key);
- a call that started and did not complete runs again with the same key and the next attempt
  when its tool's effect is `read_only` or `idempotent`; an `unsafe` one does not run again and
  its tool message says `[outcome unknown]`.

The journal applies to the first model call of the run whose history has the length the
journal recorded; a journal of any other point is ignored, so a stale one cannot be replayed.
Without a journal a key is minted per call (unique across processes) and the attempt is 1.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from agent.errors import InvalidRunInputError
from agent.messages import Message

OUTCOME_UNKNOWN = "[outcome unknown]"


class ToolEffect(StrEnum):
    """What running a tool again does: `idempotent` (the default) is safe to run again with
    the same idempotency key; `unsafe` must never run twice."""

    READ_ONLY = "read_only"
    IDEMPOTENT = "idempotent"
    UNSAFE = "unsafe"


def tool_effect(value: object, where: str) -> ToolEffect:
    try:
        return ToolEffect(str(value) if isinstance(value, str) else "")
    except ValueError:
        options = ", ".join(repr(str(e)) for e in ToolEffect)
        raise ValueError(f"{where} must be one of {options}, not {value!r}") from None


def new_idempotency_key() -> str:
    """A key no other call anywhere gets (a run id is unique per process only)."""
    return f"call-{uuid.uuid4().hex}"


def outcome_unknown_text(tool_name: str) -> str:
    return (
        f"{OUTCOME_UNKNOWN} The call to {tool_name} started but was interrupted before it "
        "completed; it may or may not have taken effect. It was not run again because the "
        "tool is marked unsafe to repeat. Check its effect before calling it again."
    )


@dataclass(frozen=True, slots=True)
class JournaledCall:
    """One tool call of the iteration in flight, as the host recorded it."""

    tool_call_id: str
    idempotency_key: str
    attempts: int  # starts recorded so far (0: never started)
    content: str | None = None  # the tool message content, once the call completed
    ok: bool | None = None
    landed: bool = True  # whether the result counts for the identical-call note (p02)

    @property
    def completed(self) -> bool:
        return self.content is not None


class RequestKind(StrEnum):
    APPROVAL = "approval"  # a tool call waits for a person's yes
    QUESTION = "question"  # the model asked the person (agent.ask_user)


@dataclass(frozen=True, slots=True)
class PendingRequest:
    """A call of the iteration in flight that waits for a person (agent/pauses.py)."""

    request_id: str
    kind: RequestKind
    tool: str
    tool_call_id: str
    index: int  # the call's position in its response's toolCalls
    args: Mapping[str, Any]
    question: str | None = None  # for a question: what the model asked


def call_from_dict(raw: Mapping[str, Any]) -> JournaledCall:
    """A JournaledCall from its camelCase dict: {toolCallId, idempotencyKey, attempt,
    content?, ok?, landed?} (what RunPause.to_json and the job system's journal write)."""
    content, ok = raw.get("content"), raw.get("ok")
    return JournaledCall(
        tool_call_id=str(raw.get("toolCallId", "")),
        idempotency_key=str(raw.get("idempotencyKey", "")),
        attempts=int(raw.get("attempt", 0)),
        content=content if isinstance(content, str) else None,
        ok=ok if isinstance(ok, bool) else None,
        landed=raw.get("landed") is not False,
    )


@dataclass(frozen=True, slots=True)
class IterationJournal:
    """The iteration in flight: the model response its tools answer (the assistant message as
    history keeps it), what each of its calls did, and the calls that wait for a person, each
    by position in `toolCalls`."""

    history_length: int  # the history's length when the response arrived
    message: Message
    calls: Mapping[int, JournaledCall] = field(default_factory=dict)
    requests: Mapping[int, PendingRequest] = field(default_factory=dict)

    def __post_init__(self) -> None:
        calls = self.message.get("toolCalls") if isinstance(self.message, Mapping) else None
        if self.message.get("role") != "assistant" or not isinstance(calls, list) or not calls:
            raise InvalidRunInputError(
                "journal.message", "must be an assistant message with toolCalls"
            )
        for call in calls:
            if not isinstance(call, Mapping) or not isinstance(call.get("id"), str):
                raise InvalidRunInputError("journal.message", "has a tool call without an id")
            if not isinstance(call.get("name"), str) or not isinstance(call.get("args"), Mapping):
                raise InvalidRunInputError(
                    "journal.message", f"tool call {call.get('id')!r} needs a name and args"
                )


@dataclass(frozen=True, slots=True)
class ResponseReport:
    """A model response whose tools are about to run: keep it before they do."""

    iteration: int
    history_length: int
    message: Message
