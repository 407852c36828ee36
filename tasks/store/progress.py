"""A running turn's progress as frames: each persisted round writes what it changed, not the
whole conversation again, so the bytes written per round do not grow with the conversation.

A turn's progress is its base followed by its frames, in the turn record:

    base    the record's `checkpoint` field (a whole checkpoint: a retry's, a replay's), or
            else the stored conversation the turn started from (which nobody else writes
            while the turn is unfinished; a turn that ends without a checkpoint of its own
            keeps a copy of it as `base`), or else nothing (the conversation's first turn);
    frames  `frame:1` .. `frame:<frames>`: each holds the checkpoint's keys in order, every
            key but the lists as they are now, and for each list that changed, where the
            change starts and the items from there.

The lists are the ones that grow with a conversation (`history`, `folded`, `findingsLedger`);
a fold rewrites the history, and its frame then starts at 0. Assembled, base and frames give
the same AgentRunCheckpoint v1 value the runtime reported, key order included.

The stored conversation is built the same way (tasks/store/conversations.py): its envelope,
then the conversation frames of the turns since the envelope was written whole, each one
turn's change against the conversation that turn started from, and each naming the envelope
it builds on by its `savedAt` and its size in bytes (the frame's `on` and `onBytes`). Only
frames on the envelope there is are applied (`frames_on`): an envelope written whole by
something that does not know frames (an earlier release's worker) wins over the frames left
from before it, even one written in the same millisecond.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from agent import AgentRunCheckpoint

# The checkpoint's keys that grow with the conversation, written as changes.
LIST_KEYS = ("history", "folded", "findingsLedger")


def _extends(old: list[Any], new: list[Any]) -> bool:
    """Whether `new` starts with `old`. The runtime builds each list from the last one, so the
    items are the same objects and identity settles it; equality is the fallback."""
    if len(new) < len(old):
        return False
    return all(a is b or a == b for a, b in zip(old, new, strict=False))


# What names a stored envelope to the conversation frames on it: its savedAt and its size.
EnvelopeMark = tuple[Any, int]


def envelope_mark(saved_at: Any, envelope: bytes) -> EnvelopeMark:
    return (saved_at, len(envelope))


class FrameWriter:
    """Turns each reported checkpoint into a frame against what was written before."""

    def __init__(self, base: AgentRunCheckpoint | None) -> None:
        wire = base.wire() if base is not None else {}
        self._lists: dict[str, list[Any]] = {key: wire.get(key) or [] for key in LIST_KEYS}

    def frame(self, checkpoint: AgentRunCheckpoint, *, on: EnvelopeMark | None = None) -> bytes:
        """The frame from what was written before to `checkpoint`; `on`: the envelope a
        conversation frame builds on (envelope_mark)."""
        wire = checkpoint.wire()
        head = {key: value for key, value in wire.items() if key not in LIST_KEYS}
        changes: dict[str, Any] = {}
        for key in LIST_KEYS:
            old, new = self._lists[key], wire.get(key) or []
            start = len(old) if _extends(old, new) else 0
            if start != len(old) or start != len(new):
                changes[key] = [start, new[start:]]
            self._lists[key] = new
        body: dict[str, Any] = {"keys": list(wire), "head": head, "lists": changes}
        if on is not None:
            body["on"], body["onBytes"] = on
        return orjson.dumps(body)


class BadProgress(ValueError):
    """Frames that do not fit their base: the record was written by something else."""


# A frame as Redis holds it, or already parsed (a turn record keeps the conversation frames
# its base had as one JSON array: base_frames).
Frame = bytes | dict[str, Any]


def _parsed(frames: Iterable[Frame]) -> list[dict[str, Any]]:
    parsed = [raw if isinstance(raw, dict) else orjson.loads(raw) for raw in frames]
    if not all(isinstance(frame, dict) for frame in parsed):
        raise BadProgress("a frame is not a JSON object")
    return parsed


def assemble(base: dict[str, Any] | None, frames: Sequence[Frame]) -> dict[str, Any] | None:
    """The checkpoint (wire dict) that `base` and `frames` stand for; `base` alone without
    frames, None when there is neither."""
    if not frames:
        return base
    lists = {key: list((base or {}).get(key) or []) for key in LIST_KEYS}
    last: dict[str, Any] = {}
    for last in _parsed(frames):
        for key, (start, items) in last["lists"].items():
            if key not in lists or not 0 <= start <= len(lists[key]):
                raise BadProgress(f"a frame changes {key!r} from {start}, past its end")
            lists[key] = lists[key][:start] + items
    head = last["head"]
    return {key: lists[key] if key in lists else head[key] for key in last["keys"]}


def frames_on(mark: EnvelopeMark, frames: Iterable[Frame]) -> list[dict[str, Any]]:
    """The conversation frames (parsed) that build on the envelope `mark` names, in order; one
    on another envelope, or on none, is left out."""
    saved_at, size = mark
    if saved_at is None:
        return []
    return [
        frame
        for frame in _parsed(frames)
        if frame.get("on") == saved_at and frame.get("onBytes") == size
    ]


def stored_data(envelope: bytes, frames: Sequence[Frame] = ()) -> dict[str, Any] | None:
    """The checkpoint wire dict a stored conversation stands for: its envelope's data with the
    conversation frames on that envelope applied (tasks/store/conversations.py checks what the
    worker resumes; this only reads)."""
    parsed = orjson.loads(envelope)
    data = parsed.get("data") if isinstance(parsed, dict) else None
    if not isinstance(data, dict):
        return None
    return assemble(data, frames_on(envelope_mark(parsed.get("savedAt"), envelope), frames))


def apply_frames(
    base: AgentRunCheckpoint | None, frames: Sequence[Frame]
) -> AgentRunCheckpoint | None:
    """`base` with `frames` applied (the base unchanged without frames)."""
    if not frames:
        return base
    whole = assemble(base.wire() if base is not None else None, frames)
    return AgentRunCheckpoint.from_parsed(whole) if whole is not None else None


def progress_checkpoint(
    checkpoint: bytes,
    frames: Sequence[bytes],
    stored: bytes | None,
    stored_frames: Sequence[Frame] = (),
) -> AgentRunCheckpoint | None:
    """A turn's last persisted progress: its whole checkpoint, or else the stored conversation
    (envelope `stored` and its conversation frames `stored_frames`), with the turn's frames
    applied; None when it has no progress of its own."""
    if checkpoint:
        return apply_frames(AgentRunCheckpoint.from_json(checkpoint), frames)
    if not frames:
        return None
    data = stored_data(stored, stored_frames) if stored else None
    whole = assemble(data, frames)
    return AgentRunCheckpoint.from_parsed(whole) if whole is not None else None
