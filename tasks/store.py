"""The conversation store: each conversation's latest checkpoint in the reference runtime's
session envelope, `{"format": "conversation-v1", "data": <checkpoint>, "savedAt": <epoch ms>}`,
under a key holding the identity namespace (tenant/principal/conversationId,
docs/checkpoint.md, "Memory namespace").

Two tenants with the same conversation id have different namespaces, so different keys; a
record whose own identity names another namespace is refused, never served.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import orjson
import redis

from agent import AgentRunCheckpoint, encode_namespace
from tasks.errors import UnreadableConversation
from tasks.keys import Keys

CONVERSATION_FORMAT = "conversation-v1"


def namespace_for(conversation_id: str, identity: Mapping[str, Any] | None) -> str:
    return encode_namespace({**(identity or {}), "conversationId": conversation_id})


def envelope_bytes(checkpoint: AgentRunCheckpoint, saved_at_ms: int | None = None) -> bytes:
    saved_at = saved_at_ms if saved_at_ms is not None else int(time.time() * 1000)
    return orjson.dumps(
        {"format": CONVERSATION_FORMAT, "data": checkpoint.wire(), "savedAt": saved_at}
    )


def read_envelope(raw: bytes, key: str, namespace: str) -> AgentRunCheckpoint:
    """The checkpoint inside a stored envelope. Unreadable bytes or an unknown format raise
    UnreadableConversation; a readable envelope with a bad checkpoint raises
    CheckpointFormatError (from the one validator)."""
    try:
        envelope = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise UnreadableConversation(key, "not JSON") from None
    if not isinstance(envelope, dict):
        raise UnreadableConversation(key, "not an envelope object")
    found = envelope.get("format")
    if found != CONVERSATION_FORMAT:
        shown = repr(found)[:40] if isinstance(found, str) else "missing"
        raise UnreadableConversation(
            key, f"format {shown} is not {CONVERSATION_FORMAT!r} (paused runs are not served)"
        )
    checkpoint = AgentRunCheckpoint.from_parsed(envelope.get("data"))
    if checkpoint.identity is not None:
        stored_namespace = encode_namespace(checkpoint.identity)
        if stored_namespace != namespace:
            raise UnreadableConversation(key, "its identity belongs to another namespace")
    return checkpoint


class ConversationStore:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self._redis = client
        self._keys = keys

    def key(self, namespace: str) -> str:
        return self._keys.conversation(namespace)

    def load(self, namespace: str) -> AgentRunCheckpoint | None:
        key = self.key(namespace)
        raw = self._redis.get(key)
        if raw is None:
            return None
        assert isinstance(raw, bytes)
        return read_envelope(raw, key, namespace)

    def save(self, namespace: str, checkpoint: AgentRunCheckpoint) -> None:
        """Write a conversation outside a turn (imports, tests). Turns commit through
        TurnRecords.succeed, atomically with the turn's end."""
        self._redis.set(self.key(namespace), envelope_bytes(checkpoint))
