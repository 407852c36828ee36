"""The conversation store: each conversation's latest checkpoint in the reference runtime's
session envelope, `{"format": "conversation-v1", "data": <checkpoint>, "savedAt": <epoch ms>}`,
under a key holding the identity namespace (tenant/principal/conversationId,
docs/checkpoint.md, "Memory namespace").

Two tenants with the same conversation id have different namespaces, so different keys; a
record whose own identity names another namespace is refused, never served.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

import orjson

from agent import AgentRunCheckpoint, encode_namespace
from tasks.core.errors import UnreadableConversation
from tasks.core.keys import Keys
from tasks.store.client import StateClient

CONVERSATION_FORMAT = "conversation-v1"


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


# The stored conversations a worker last wrote or read, kept checked, by total envelope size.
RECENT_ENVELOPE_BYTES = 16 * 1024 * 1024


class RecentConversations:
    """Checked conversations by namespace, with the envelope bytes they were read from.

    A conversation's next turn is claimed with its stored envelope; when those are the bytes
    this process wrote or read last for the namespace, their checkpoint is the one already
    checked, so the worker does not parse and check the whole conversation again (the cost
    of a turn that grows with the conversation). Bytes that differ are read afresh."""

    def __init__(self, max_bytes: int = RECENT_ENVELOPE_BYTES) -> None:
        self._max_bytes = max_bytes
        self._bytes = 0
        self._entries: OrderedDict[str, tuple[bytes, AgentRunCheckpoint]] = OrderedDict()
        self._lock = threading.Lock()

    def read(self, raw: bytes, key: str, namespace: str) -> AgentRunCheckpoint:
        with self._lock:
            found = self._entries.get(namespace)
        if found is not None and found[0] == raw:
            return found[1]
        checkpoint = read_envelope(raw, key, namespace)
        self.remember(namespace, raw, checkpoint)
        return checkpoint

    def remember(self, namespace: str, raw: bytes, checkpoint: AgentRunCheckpoint) -> None:
        if len(raw) > self._max_bytes // 4:
            return  # one conversation must not push every other one out
        with self._lock:
            old = self._entries.pop(namespace, None)
            if old is not None:
                self._bytes -= len(old[0])
            self._entries[namespace] = (raw, checkpoint)
            self._bytes += len(raw)
            while self._bytes > self._max_bytes:
                _, (dropped, _) = self._entries.popitem(last=False)
                self._bytes -= len(dropped)


class ConversationStore:
    def __init__(self, client: StateClient, keys: Keys) -> None:
        self._redis = client
        self._keys = keys
        self.recent = RecentConversations()

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
