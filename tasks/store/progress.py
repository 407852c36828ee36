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
"""

from __future__ import annotations

from collections.abc import Sequence
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


class FrameWriter:
    """Turns each reported checkpoint into a frame against what was written before."""

    def __init__(self, base: AgentRunCheckpoint | None) -> None:
        wire = base.wire() if base is not None else {}
        self._lists: dict[str, list[Any]] = {key: wire.get(key) or [] for key in LIST_KEYS}

    def frame(self, checkpoint: AgentRunCheckpoint) -> bytes:
        wire = checkpoint.wire()
        head = {key: value for key, value in wire.items() if key not in LIST_KEYS}
        changes: dict[str, Any] = {}
        for key in LIST_KEYS:
            old, new = self._lists[key], wire.get(key) or []
            start = len(old) if _extends(old, new) else 0
            if start != len(old) or start != len(new):
                changes[key] = [start, new[start:]]
            self._lists[key] = new
        return orjson.dumps({"keys": list(wire), "head": head, "lists": changes})


class BadProgress(ValueError):
    """Frames that do not fit their base: the record was written by something else."""


def assemble(base: dict[str, Any] | None, frames: Sequence[bytes]) -> dict[str, Any] | None:
    """The checkpoint (wire dict) that `base` and `frames` stand for; `base` alone without
    frames, None when there is neither."""
    if not frames:
        return base
    lists = {key: list((base or {}).get(key) or []) for key in LIST_KEYS}
    last: dict[str, Any] = {}
    for raw in frames:
        last = orjson.loads(raw)
        for key, (start, items) in last["lists"].items():
            if key not in lists or not 0 <= start <= len(lists[key]):
                raise BadProgress(f"a frame changes {key!r} from {start}, past its end")
            lists[key] = lists[key][:start] + items
    head = last["head"]
    return {key: lists[key] if key in lists else head[key] for key in last["keys"]}


def envelope_data(envelope: bytes) -> dict[str, Any] | None:
    """The checkpoint wire dict inside a stored conversation envelope (read_envelope checks
    what the worker resumes; this only reads)."""
    data = orjson.loads(envelope).get("data")
    return data if isinstance(data, dict) else None


def apply_frames(
    base: AgentRunCheckpoint | None, frames: Sequence[bytes]
) -> AgentRunCheckpoint | None:
    """`base` with `frames` applied (the base unchanged without frames)."""
    if not frames:
        return base
    whole = assemble(base.wire() if base is not None else None, frames)
    return AgentRunCheckpoint.from_parsed(whole) if whole is not None else None


def progress_checkpoint(
    checkpoint: bytes, frames: Sequence[bytes], stored: bytes | None
) -> AgentRunCheckpoint | None:
    """A turn's last persisted progress: its whole checkpoint, or else the stored conversation
    envelope `stored`, with its frames applied; None when it has no progress of its own."""
    if checkpoint:
        base: AgentRunCheckpoint | None = AgentRunCheckpoint.from_json(checkpoint)
    elif not frames:
        return None
    else:
        data = envelope_data(stored) if stored else None
        base = AgentRunCheckpoint.from_parsed(data) if data is not None else None
    return apply_frames(base, frames)
