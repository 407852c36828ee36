"""Stopping turns by hand: cancel_turn and cancel_conversation (docs/operations.md, "Cancel and
deadlines").

A cancel takes effect in the turn record at once, whatever the state: the turn ends as
cancelled, its lease, retry and queue place are released and the next turn of the conversation
is woken (tasks/turn/ending.py, `cancel`). A worker still running it is fenced out: it stops at
its next check point (each tool call's event, each persisted round, the lease keeper's
renewal) and its late writes are refused. result.get() raises TurnCancelled at once.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from tasks.core.namespaces import (
    IdentityHint,
    broader_identities,
    describe_identity,
    namespace_for,
)
from tasks.queue.context import JobContext, job_context
from tasks.turn import ending


def cancel_turn(
    turn_id: str, *, reason: str = "", identity: Mapping[str, Any] | None = None
) -> bool:
    """True when the turn was unfinished and is now cancelled; False when it had already ended
    or is unknown (with `identity`, a turn of another one is unknown)."""
    ctx = job_context()
    record = ctx.records.find(turn_id, identity)
    if record is None or record.state.terminal:
        return False
    return ending.cancel(ctx, record, reason=reason)


def cancel_conversation(
    conversation_id: str, identity: Mapping[str, Any] | None = None, *, reason: str = ""
) -> int:
    """Cancel every unfinished turn of the conversation; returns how many were cancelled.

    `identity` ({tenant?, principal?}) selects the namespace, as it did for run_turn: turns
    submitted with an identity are not found without it. Finding none, it may warn
    IdentityHint (identity_hint says when)."""
    ctx = job_context()
    namespace = namespace_for(conversation_id, identity)
    queue = ctx.keys.for_namespace(namespace).queue(namespace)
    turn_ids: Any = ctx.redis.lrange(queue, 0, -1)
    if not turn_ids:
        identity_hint(ctx, "cancel_conversation", conversation_id, identity)
        return 0
    # Last first: cancelling the head would wake the next one only to cancel it too.
    return sum(cancel_turn(t.decode(), reason=reason) for t in reversed(turn_ids))


def identity_hint(
    ctx: JobContext, caller: str, conversation_id: str, identity: Mapping[str, Any] | None
) -> None:
    """After `caller` found nothing for `conversation_id` under `identity`: warn IdentityHint
    when that namespace is unused (no stored conversation, no unfinished turn) and the caller
    may have meant another identity. Cheap: a few EXISTS in one round trip, never a scan.

    - Without tenant and principal (no identity, or an empty one): the default namespace
      `_/_/<id>` was looked in. The namespace of an identity cannot be found without knowing
      the identity (it is in the key, and no index lists a conversation id's namespaces), so
      the warning says which namespace was used and asks for the identity run_turn was given.
    - With one: the namespaces of the identities it narrows (tenant alone, principal alone,
      neither) are looked in too, and the first in use is named by the fields it sets. None
      in use: no warning. The conversation may not exist, and identities with more fields
      than this one cannot be listed without a scan.
    """
    candidates = broader_identities(identity)
    namespaces = [namespace_for(conversation_id, identity)]
    namespaces += [namespace_for(conversation_id, other) for other in candidates]
    with ctx.redis.pipeline(transaction=False) as pipe:
        for namespace in namespaces:
            shard = ctx.keys.for_namespace(namespace)
            pipe.exists(shard.conversation(namespace))
            pipe.exists(shard.queue(namespace))
        found: list[Any] = pipe.execute()
    stored, queued = found[0::2], found[1::2]
    if stored[0] or queued[0]:
        return  # the namespace is in use: finding nothing is the answer
    called = f"{caller}({conversation_id!r})"
    if not candidates:
        warnings.warn(
            f"{called} found nothing in the default namespace {namespaces[0]!r} (no tenant, no "
            "principal given). A conversation whose turns were submitted with an identity is "
            "filed under that identity's namespace: pass the identity run_turn was given.",
            IdentityHint,
            stacklevel=3,
        )
        return
    for n, other in enumerate(candidates, start=1):
        if stored[n] or queued[n]:
            what = "unfinished turns" if queued[n] else "a stored conversation"
            where = describe_identity(other)
            if not other:
                where += f" (the default namespace {namespaces[n]!r})"
            warnings.warn(
                f"{called} found nothing under the identity it was given "
                f"({describe_identity(identity)}), but the conversation has {what} under an "
                f"identity with {where}: were its turns submitted with that identity?",
                IdentityHint,
                stacklevel=3,
            )
            return
