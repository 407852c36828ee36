"""The conversation store: each conversation's latest checkpoint in the reference runtime's
session envelope, `{"format": "conversation-v1", "data": <checkpoint>, "savedAt": <epoch ms>}`,
under a key holding the identity namespace (tenant/principal/conversationId,
docs/checkpoint.md, "Memory namespace"), with the turns since that envelope was written as
conversation frames beside it (tasks/core/keys.py, ShardKeys.conversation_frames).

A turn's end writes either one frame (its change against the conversation it started from,
tasks/store/progress.py) or, when frames would cost more than the envelope, the whole
envelope again and no frames (a compaction, `turn_write`): the bytes a turn writes stay
proportional to what it adds, not to the conversation. Each frame names the envelope it builds
on by its savedAt and size (`on`, `onBytes`), and a reader applies only those: an envelope
written whole by something that knows nothing of frames (an earlier release's worker) wins
over the frames left from before it. (ConversationStore.save drops the frames itself.)

Two tenants with the same conversation id have different namespaces, so different keys; a
record whose own identity names another namespace is refused, never served.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from agent import AgentRunCheckpoint, encode_namespace
from tasks.core.errors import UnreadableConversation
from tasks.core.keys import Keys
from tasks.store.client import StateClient
from tasks.store.progress import (
    EnvelopeMark,
    FrameWriter,
    apply_frames,
    assemble,
    envelope_mark,
    frames_on,
)

CONVERSATION_FORMAT = "conversation-v1"
# A conversation with this many frames is compacted at its next turn's end, so a read never
# assembles more.
MAX_CONVERSATION_FRAMES = 64


def envelope_bytes(checkpoint: AgentRunCheckpoint, saved_at_ms: int | None = None) -> bytes:
    saved_at = saved_at_ms if saved_at_ms is not None else int(time.time() * 1000)
    return orjson.dumps(
        {"format": CONVERSATION_FORMAT, "data": checkpoint.wire(), "savedAt": saved_at}
    )


@dataclass(frozen=True)
class StoredConversation:
    """A stored conversation: its envelope and conversation frames as Redis holds them, the
    envelope's savedAt, and the checked checkpoint they stand for."""

    envelope: bytes
    frames: tuple[bytes, ...]
    saved_at: Any
    checkpoint: AgentRunCheckpoint
    # Every frame builds on this envelope: none was left from before one written whole.
    current: bool = True

    @property
    def mark(self) -> EnvelopeMark:
        return envelope_mark(self.saved_at, self.envelope)

    @property
    def frame_bytes(self) -> int:
        return sum(len(frame) for frame in self.frames)

    @property
    def size(self) -> int:
        return len(self.envelope) + self.frame_bytes


def _envelope(raw: bytes, key: str) -> dict[str, Any]:
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
    return envelope


def _in_namespace(checkpoint: AgentRunCheckpoint, key: str, namespace: str) -> None:
    if checkpoint.identity is not None:
        stored_namespace = encode_namespace(checkpoint.identity)
        if stored_namespace != namespace:
            raise UnreadableConversation(key, "its identity belongs to another namespace")


def _unfit(key: str, exc: Exception) -> UnreadableConversation:
    problem = f"{type(exc).__name__}: {exc}"[:120]
    return UnreadableConversation(key, f"its frames do not fit its envelope ({problem})")


def read_conversation(
    envelope: bytes, frames: Sequence[bytes], key: str, namespace: str
) -> StoredConversation:
    """The stored conversation an envelope and its conversation frames stand for. Unreadable
    bytes, an unknown format or frames that do not fit raise UnreadableConversation; a
    readable conversation with a bad checkpoint raises CheckpointFormatError (from the one
    validator)."""
    parsed = _envelope(envelope, key)
    saved_at, data = parsed.get("savedAt"), parsed.get("data")
    try:
        on = frames_on(envelope_mark(saved_at, envelope), frames)
        if on and isinstance(data, dict):
            data = assemble(data, on)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # JSONDecodeError, BadProgress
        raise _unfit(key, exc) from None
    checkpoint = AgentRunCheckpoint.from_parsed(data)
    _in_namespace(checkpoint, key, namespace)
    return StoredConversation(
        envelope, tuple(frames), saved_at, checkpoint, current=len(on) == len(frames)
    )


def read_envelope(raw: bytes, key: str, namespace: str) -> AgentRunCheckpoint:
    """The checkpoint inside a stored envelope (without frames): read_conversation's checks."""
    return read_conversation(raw, (), key, namespace).checkpoint


def _extended(
    stored: StoredConversation, frames: tuple[bytes, ...], key: str, namespace: str
) -> StoredConversation:
    """`stored` with the frames appended since it was read or written (`frames` starts with
    its own): only those are parsed and applied."""
    added = frames[len(stored.frames) :]
    try:
        on = frames_on(stored.mark, added)
        checkpoint = apply_frames(stored.checkpoint, on)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise _unfit(key, exc) from None
    assert checkpoint is not None
    _in_namespace(checkpoint, key, namespace)
    current = stored.current and len(on) == len(added)
    return StoredConversation(stored.envelope, frames, stored.saved_at, checkpoint, current)


@dataclass(frozen=True)
class ConversationWrite:
    """What a turn's end writes of its conversation: a whole envelope (a compaction) or one
    conversation frame, the other b"", and the stored conversation that leaves."""

    envelope: bytes
    frame: bytes
    stored: StoredConversation


def turn_write(
    started_from: StoredConversation | None,
    checkpoint: AgentRunCheckpoint,
    *,
    saved_at_ms: int | None = None,
    max_frames: int = MAX_CONVERSATION_FRAMES,
) -> ConversationWrite:
    """How a turn that started from `started_from` (None: from no stored conversation, or from
    a checkpoint of its own) stores `checkpoint`, its final one. A frame against
    `started_from`, unless there is no envelope to build on, a frame is left from before an
    envelope written whole, the frames reach `max_frames`, or the frames with this one would
    be more bytes than the envelope: then the whole envelope, dropping the frames. So the
    envelope is written again once the frames have added as much as it holds: the bytes a
    turn writes, amortized, stay proportional to what the turn adds."""
    if (
        started_from is not None
        and started_from.current
        and type(started_from.saved_at) is int
        and len(started_from.frames) < max_frames
    ):
        frame = FrameWriter(started_from.checkpoint).frame(checkpoint, on=started_from.mark)
        if started_from.frame_bytes + len(frame) <= len(started_from.envelope):
            frames = (*started_from.frames, frame)
            stored = StoredConversation(
                started_from.envelope, frames, started_from.saved_at, checkpoint
            )
            return ConversationWrite(b"", frame, stored)
    saved_at = saved_at_ms if saved_at_ms is not None else int(time.time() * 1000)
    if started_from is not None and saved_at == started_from.saved_at:
        saved_at += 1  # frames on the envelope before must never match this one
    envelope = envelope_bytes(checkpoint, saved_at)
    return ConversationWrite(envelope, b"", StoredConversation(envelope, (), saved_at, checkpoint))


# The stored conversations a worker last wrote or read, kept checked, by total size.
RECENT_ENVELOPE_BYTES = 16 * 1024 * 1024


class RecentConversations:
    """Checked conversations by namespace, with the envelope and frames they were read from.

    A conversation's next turn is claimed with its stored envelope and frames; when those are
    the bytes this process wrote or read last for the namespace, their checkpoint is the one
    already checked, so the worker does not parse and check the whole conversation again (the
    cost of a turn that grows with the conversation). The same envelope with more frames (turns
    another worker appended since) has only the new frames applied. Bytes that differ
    otherwise are read afresh."""

    def __init__(self, max_bytes: int = RECENT_ENVELOPE_BYTES) -> None:
        self._max_bytes = max_bytes
        self._bytes = 0
        self._entries: OrderedDict[str, StoredConversation] = OrderedDict()
        self._lock = threading.Lock()

    def read(
        self, envelope: bytes, frames: Sequence[bytes], key: str, namespace: str
    ) -> StoredConversation:
        claimed = tuple(frames)
        with self._lock:
            found = self._entries.get(namespace)
        if found is not None and found.envelope == envelope:
            if found.frames == claimed:
                return found
            if claimed[: len(found.frames)] == found.frames:
                stored = _extended(found, claimed, key, namespace)
                self.remember(namespace, stored)
                return stored
        stored = read_conversation(envelope, claimed, key, namespace)
        self.remember(namespace, stored)
        return stored

    def remember(self, namespace: str, stored: StoredConversation) -> None:
        size = stored.size
        with self._lock:
            old = self._entries.pop(namespace, None)
            if old is not None:
                self._bytes -= old.size
            if size > self._max_bytes // 4:
                return  # one conversation must not push every other one out
            self._entries[namespace] = stored
            self._bytes += size
            while self._bytes > self._max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= dropped.size


class ConversationStore:
    def __init__(self, client: StateClient, keys: Keys) -> None:
        self._redis = client
        self._keys = keys
        self.recent = RecentConversations()

    def key(self, namespace: str) -> str:
        return self._keys.conversation(namespace)

    def frames_key(self, namespace: str) -> str:
        return self._keys.conversation_frames(namespace)

    def read(self, namespace: str) -> StoredConversation | None:
        """The stored conversation, envelope and frames in one round trip (a pipeline of two
        reads of one slot, so also on a Cluster)."""
        key = self.key(namespace)
        with self._redis.pipeline(transaction=False) as pipe:
            pipe.get(key)
            pipe.lrange(self.frames_key(namespace), 0, -1)
            raw, frames = pipe.execute()
        if raw is None:
            return None
        assert isinstance(raw, bytes)
        return read_conversation(raw, frames, key, namespace)

    def load(self, namespace: str) -> AgentRunCheckpoint | None:
        stored = self.read(namespace)
        return stored.checkpoint if stored is not None else None

    def save(self, namespace: str, checkpoint: AgentRunCheckpoint) -> None:
        """Write a conversation outside a turn (imports, tests): a whole envelope, and no
        frames, in one MULTI/EXEC. Turns commit through TurnRecords.succeed, atomically with
        the turn's end."""
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(self.key(namespace), envelope_bytes(checkpoint))
            pipe.delete(self.frames_key(namespace))
            pipe.execute()
