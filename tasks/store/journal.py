"""The journal of a running turn's iteration in flight, in its turn record (docs/operations.md,
"Tools that do not run twice"): the model response, written before any of its tools runs, and
each call as it starts (its key and attempt) and completes (its result), every write fenced by
the lease token. The next delivery of the turn hands it back to the runtime
(agent.IterationJournal), which continues the iteration instead of calling the model again.

    journal:response   {historyLength, iteration, message}: the assistant message with toolCalls
    journal:calls      how many calls the response has
    journal:<index>    {toolCallId, idempotencyKey, attempt, effect, content?, ok?, landed?}
    journal:requests   the calls that wait for a person, when the turn paused (operate/people.py)

Persisting the iteration's progress drops its journal in the same step (lua/progress.lua);
a retry keeps it, since the next attempt continues the same iteration.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from agent import IterationJournal, ResponseReport, ToolCallPhase, ToolCallReport
from agent.journal import call_from_dict
from agent.pauses import request_from_dict
from tasks.core.schema import Field, FieldPrefix

RESPONSE = Field.JOURNAL_RESPONSE
CALLS = Field.JOURNAL_CALLS
REQUESTS = Field.JOURNAL_REQUESTS  # a pause's requests (tasks/operate/people.py)


def call_field(index: int) -> str:
    return f"{FieldPrefix.JOURNAL}{index}"


def response_fields(report: ResponseReport) -> dict[str, bytes]:
    response = {
        "historyLength": report.history_length,
        "iteration": report.iteration,
        "message": report.message,
    }
    calls = len(report.message.get("toolCalls") or ())
    return {RESPONSE: orjson.dumps(response), CALLS: str(calls).encode()}


def call_fields(report: ToolCallReport) -> dict[str, bytes]:
    entry: dict[str, Any] = {
        "toolCallId": report.tool_call_id,
        "idempotencyKey": report.idempotency_key,
        "attempt": report.attempt,
        "effect": str(report.effect),
    }
    if report.phase is ToolCallPhase.FINISHED:
        entry.update(content=report.content, ok=report.ok, landed=report.landed)
    return {call_field(report.index): orjson.dumps(entry)}


def read_journal(fields: Mapping[str, bytes]) -> IterationJournal | None:
    """The journal a turn record holds (TurnRecord.journal), or None."""
    raw = fields.get(RESPONSE)
    if not raw:
        return None
    response = orjson.loads(raw)
    calls = {
        int(name.removeprefix(FieldPrefix.JOURNAL)): call_from_dict(orjson.loads(value))
        for name, value in fields.items()
        if name.removeprefix(FieldPrefix.JOURNAL).isdigit()
    }
    raw_requests = fields.get(REQUESTS)
    requests = [request_from_dict(r) for r in orjson.loads(raw_requests)] if raw_requests else []
    return IterationJournal(
        int(response["historyLength"]),
        response["message"],
        calls,
        {request.index: request for request in requests},
    )
