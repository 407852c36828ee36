"""Registering a turn: the door every turn enters by, before any message about it is sent.

A turn is recorded (queued) behind its conversation's earlier turns, which fixes the
conversation's order at submission time. Whoever submits goes through `register_turn`:
run_turn.delay (tasks/turn/tasks.py), a message sent around it and found by the worker
(tasks/turn/delivery.py), and a dead-letter replay (tasks/turn/ending.py). A caller-chosen
turn id is checked to belong to this conversation's namespace first (`claim_turn_id`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import orjson

from tasks.core.errors import BadPayload, InvalidTurnRequest
from tasks.core.namespaces import owner_of_namespace
from tasks.core.payload import TurnRequest, check_turn_id, parse_payload, registration_of
from tasks.queue.context import JobContext
from tasks.store.records import Registered
from tasks.telemetry.tracing import current_trace


def register_turn(
    ctx: JobContext,
    turn_id: str,
    kwargs: Any,
    *,
    checkpoint: bytes = b"",
    replay_of: str = "",
    request: TurnRequest | None = None,
    fresh: bool = False,
    gated: bool = False,
    publish: tuple[str, bytes] | None = None,
) -> tuple[str, Registered]:
    """Record a submitted turn behind its conversation's earlier turns; returns its namespace
    ('' for a payload too broken to queue) and whether it was new. `request` is `kwargs`
    already parsed, when the caller has it; `fresh` says this process made the id up (a
    uuid nobody else can hold), so its ownership needs no check. `gated`: the tenant fairness
    gate decides whether it is published now (Registered.HELD: not yet; tasks/turn/fairness.py).
    `publish`: the broker's list and the message to push with a new turn's record
    (tasks/queue/broker.py, PublishFold)."""
    if request is None:
        with contextlib.suppress(BadPayload):
            request = parse_payload(kwargs, max_deadline_s=ctx.settings.max_deadline_s)
    if request is not None:
        agent_name, conversation_id, namespace = (
            request.agent,
            request.conversation_id,
            request.namespace,
        )
    else:
        agent_name, conversation_id, namespace = registration_of(kwargs)
    if not fresh and not ctx.records.claim_turn_id(turn_id, namespace):
        return namespace, Registered.FOREIGN
    deadline_s = (request.deadline_s if request else None) or ctx.settings.turn_deadline_s
    registered = ctx.records.register(
        turn_id,
        payload=orjson.dumps(kwargs),
        agent=agent_name,
        conversation_id=conversation_id,
        namespace=namespace,
        checkpoint=checkpoint,
        replay_of=replay_of,
        deadline_s=deadline_s,
        trace=current_trace() or "",  # the submitter's trace: every attempt joins it
        tenant=owner_of_namespace(namespace)[0] or "" if namespace else "",
        gated=gated,
        publish=publish,
    )
    return namespace, registered


def check_request(args: Any, kwargs: Any, *, max_deadline_s: float) -> TurnRequest:
    """run_turn.delay's arguments as a turn, or InvalidTurnRequest naming what is wrong."""
    if args:
        raise InvalidTurnRequest(
            "<args>",
            "takes keyword arguments only: run_turn.delay(agent=..., "
            "conversation_id=..., message=...)",
        )
    try:
        return parse_payload(kwargs or {}, max_deadline_s=max_deadline_s)
    except BadPayload as exc:
        raise InvalidTurnRequest(exc.field, exc.problem) from None


def check_task_id(task_id: object) -> str:
    try:
        return check_turn_id(task_id)
    except BadPayload as exc:
        raise InvalidTurnRequest(exc.field, exc.problem) from None


def refusal(registered: Registered) -> InvalidTurnRequest | None:
    """The error a submission with a chosen id gets, when its registration was refused."""
    if registered is Registered.FOREIGN:
        # Neither the other conversation nor its tenant is named: the caller may not know it.
        return InvalidTurnRequest(
            "task_id", "names a turn of another conversation; choose a new id"
        )
    if registered is Registered.CONFLICT:
        return InvalidTurnRequest("task_id", "was submitted with another request; choose a new id")
    return None
