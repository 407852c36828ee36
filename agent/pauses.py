"""A person in the loop (docs/operations.md, "People in the loop"): tools that need a person's
yes, the ready tool `ask_user`, and a paused run that a later process resumes with the
decisions.

A tool with `approval=True`, or a callable `(args, ctx) -> bool` that says so (or raises: it
fails closed), does not run when the model calls it: the run pauses once the other calls of
the same response have run. So does a call of `ask_user`, whose answer becomes its tool result.
The run returns an AgentResult with `stop_reason == "paused"` and `pause`, a RunPause: the
checkpoint of the last completed iteration, the journal of the paused one (the response and
the outcomes of its other calls) and the pending requests. `agent.resume(decisions)` (the
instance's pause) or `agent.resume(decisions, pause=RunPause.from_json(...))` (in any later
process) goes on: approved calls run, with edited arguments when given; rejected ones get a
tool message `[rejected] <message>`; an answer is the `ask_user` result verbatim. Decisions for
only some requests pause the run again with the rest. `agent.abandon_pause()` drops the
instance's pause. While an instance holds a pause, `run`, `follow_up` and `resume_on_error`
refuse with RunPausedError.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from agent.checkpoint import AgentRunCheckpoint
from agent.errors import InvalidRunInputError
from agent.journal import (
    IterationJournal,
    JournaledCall,
    PendingRequest,
    RequestKind,
    call_from_dict,
)
from agent.tools import Tool, ToolContext

REJECTED = "[rejected]"

ApprovalCheck = Callable[[Mapping[str, Any], ToolContext], bool]


def rejected_text(message: str) -> str:
    return f"{REJECTED} {message}" if message else REJECTED


def new_request_id() -> str:
    return f"req-{uuid.uuid4().hex}"


@dataclass(frozen=True, slots=True)
class Decision:
    """A person's decision on one pending request: `Decision.approve(edited_args=None)`,
    `Decision.reject(message="")` or `Decision.answer(text)`."""

    kind: Literal["approve", "reject", "answer"]
    edited_args: Mapping[str, Any] | None = None
    message: str = ""
    text: str = ""

    @classmethod
    def approve(cls, edited_args: Mapping[str, Any] | None = None) -> Decision:
        return cls("approve", edited_args=edited_args)

    @classmethod
    def reject(cls, message: str = "") -> Decision:
        return cls("reject", message=message)

    @classmethod
    def answer(cls, text: str) -> Decision:
        return cls("answer", text=text)

    def fits(self, request: PendingRequest) -> bool:
        """Approving a question or answering an approval does not fit; rejecting fits both."""
        if self.kind == "approve":
            return request.kind is RequestKind.APPROVAL
        if self.kind == "answer":
            return request.kind is RequestKind.QUESTION
        return True


class _AskUser(Tool):
    """The `ask_user` tool: its calls wait for a person's answer instead of running."""


def _never_run(args: Mapping[str, Any]) -> str:
    raise RuntimeError("ask_user is answered by a person, never run")


ask_user: Tool = _AskUser(
    name="ask_user",
    description=(
        "Ask the person a question and wait for their answer. Use it when you cannot go on "
        "without information or a choice only they have."
    ),
    input_schema={
        "type": "object",
        "properties": {"question": {"type": "string", "description": "The question to ask."}},
        "required": ["question"],
    },
    execute=_never_run,
    effect="read_only",
)


def person_request(
    tool: Tool, index: int, call: Mapping[str, Any], ctx: ToolContext
) -> PendingRequest | None:
    """The request a call makes of a person, or None when it may run as it is."""
    args = call.get("args") or {}
    if isinstance(tool, _AskUser):
        question = args.get("question")
        return PendingRequest(
            new_request_id(),
            RequestKind.QUESTION,
            tool.name,
            call["id"],
            index,
            args,
            question=question if isinstance(question, str) else "",
        )
    if not _needs_approval(tool.approval, args, ctx):
        return None
    return PendingRequest(
        new_request_id(), RequestKind.APPROVAL, tool.name, call["id"], index, args
    )


def _needs_approval(
    approval: bool | ApprovalCheck, args: Mapping[str, Any], ctx: ToolContext
) -> bool:
    if approval is True:
        return True
    if approval is False or approval is None:
        return False
    try:
        return bool(approval(dict(args), ctx))
    except Exception:
        return True  # a check that fails asks: it never lets the call through


@dataclass(frozen=True, slots=True)
class RunPause:
    """A run waiting for a person: resume it with `agent.resume(decisions, pause=...)`."""

    checkpoint: AgentRunCheckpoint  # the conversation as of the last completed iteration
    journal: IterationJournal  # the paused iteration: its response, its other calls' outcomes
    pending: tuple[PendingRequest, ...] = field(default=())

    def request(self, request_id: str) -> PendingRequest | None:
        return next((r for r in self.pending if r.request_id == request_id), None)

    def to_json(self) -> bytes:
        journal = self.journal
        return orjson.dumps(
            {
                "checkpoint": self.checkpoint.wire(),
                "journal": {
                    "historyLength": journal.history_length,
                    "message": journal.message,
                    "calls": {str(i): _call_dict(c) for i, c in journal.calls.items()},
                },
                "pending": [request_dict(r) for r in self.pending],
            }
        )

    @classmethod
    def from_json(cls, data: bytes | str) -> RunPause:
        try:
            raw = orjson.loads(data)
            requests = tuple(request_from_dict(r) for r in raw["pending"])
            journal = IterationJournal(
                int(raw["journal"]["historyLength"]),
                raw["journal"]["message"],
                {int(i): call_from_dict(c) for i, c in raw["journal"]["calls"].items()},
                {r.index: r for r in requests},
            )
            checkpoint = AgentRunCheckpoint.from_parsed(raw["checkpoint"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise InvalidRunInputError(
                "pause", f"not a RunPause written by to_json: {exc}"
            ) from None
        return cls(checkpoint, journal, requests)


def request_dict(request: PendingRequest) -> dict[str, Any]:
    return {
        "requestId": request.request_id,
        "kind": str(request.kind),
        "tool": request.tool,
        "toolCallId": request.tool_call_id,
        "index": request.index,
        "args": request.args,
        "question": request.question,
    }


def request_from_dict(raw: Mapping[str, Any]) -> PendingRequest:
    return PendingRequest(
        request_id=str(raw["requestId"]),
        kind=RequestKind(raw["kind"]),
        tool=str(raw["tool"]),
        tool_call_id=str(raw["toolCallId"]),
        index=int(raw["index"]),
        args=dict(raw.get("args") or {}),
        question=raw.get("question"),
    )


def _call_dict(call: JournaledCall) -> dict[str, Any]:
    return {
        "toolCallId": call.tool_call_id,
        "idempotencyKey": call.idempotency_key,
        "attempt": call.attempts,
        "content": call.content,
        "ok": call.ok,
        "landed": call.landed,
    }
