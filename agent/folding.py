"""Folded spans: fnv1a fingerprints, joining a summary to its span, and compaction.

A summary message is joined to its span by the fingerprint of its whole content, never by
index, because every later fold moves the indexes after it
(docs/checkpoint.md, "Folding").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agent.messages import Message

_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193
SUMMARY_PREFIX = "[compacted history"


def fnv1a(text: str) -> str:
    """32-bit FNV-1a over UTF-16 code units, lowercase hex without zero padding."""
    h = _FNV_OFFSET
    data = text.encode("utf-16-le", "surrogatepass")
    for i in range(0, len(data), 2):
        h ^= data[i] | (data[i + 1] << 8)
        h = (h * _FNV_PRIME) & 0xFFFFFFFF
    return format(h, "x")


def is_compacted_summary(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, str) and content.startswith(SUMMARY_PREFIX)


def _spans_of(conversation: Any) -> Sequence[Mapping[str, Any]] | None:
    if isinstance(conversation, Mapping):
        spans = conversation.get("folded")
    else:
        spans = getattr(conversation, "folded", None)
    return spans if isinstance(spans, list | tuple) else None


def folded_span_for(conversation: Any, message: Mapping[str, Any]) -> dict[str, Any] | None:
    """The first span whose summaryFingerprint matches `message`'s content, or None.

    `conversation` is an AgentRunCheckpoint or its wire dict.
    """
    spans = _spans_of(conversation)
    content = message.get("content")
    if not spans or not isinstance(content, str):
        return None
    fingerprint = fnv1a(content)
    for span in spans:
        if isinstance(span, Mapping) and span.get("summaryFingerprint") == fingerprint:
            return dict(span)
    return None


def folded_messages(conversation: Any) -> list[Message]:
    """Every retained folded message, oldest span first; discarded spans add nothing."""
    out: list[Message] = []
    for span in _spans_of(conversation) or ():
        messages = span.get("messages") if isinstance(span, Mapping) else None
        if isinstance(messages, list):
            out.extend(messages)
    return out


Summarizer = Callable[[Sequence[Message]], str]


def _default_summary(messages: Sequence[Message]) -> str:
    users = [m["content"] for m in messages if m.get("role") == "user"]
    gist = " | ".join(u[:80] for u in users[-3:])
    return f"earlier user requests: {gist}" if gist else "earlier tool exchanges"


@dataclass(frozen=True)
class Compaction:
    """Fold old messages into one summary message once history grows past `max_messages`.

    The most recent `keep_last` messages stay verbatim (moved back so a tool result is never
    separated from the call it answers). Earlier summaries stay in history, so every span this
    runtime writes keeps its summary there (D4).
    """

    max_messages: int = 40
    keep_last: int = 10
    retain: Literal["conversation", "discard"] = "conversation"
    summarize: Summarizer | None = None

    def __post_init__(self) -> None:
        if self.retain not in ("conversation", "discard"):
            raise ValueError("Compaction.retain must be 'conversation' or 'discard'")
        if not 1 <= self.keep_last < self.max_messages:
            raise ValueError("Compaction needs 1 <= keep_last < max_messages")

    def fold(
        self,
        history: list[Message],
        *,
        run_id: str,
        iteration: int,
        model: str,
        fold_number: int = 1,
    ) -> tuple[list[Message], dict[str, Any]] | None:
        """The compacted history and its new span, or None when nothing needs folding."""
        if len(history) <= self.max_messages:
            return None
        cut = len(history) - self.keep_last
        while cut > 0 and history[cut].get("role") == "tool":
            cut -= 1
        summaries = [m for m in history[:cut] if is_compacted_summary(m)]
        removed = [m for m in history[:cut] if not is_compacted_summary(m)]
        if not removed:
            return None
        text = (self.summarize or _default_summary)(removed)
        summary: Message = {
            "role": "user",
            # The fold number keeps two summaries of the same text apart: spans are joined to
            # their summary by fingerprint alone.
            "content": f"{SUMMARY_PREFIX} #{fold_number}: {len(removed)} messages]\n{text}",
        }
        span: dict[str, Any] = {
            "summaryFingerprint": fnv1a(summary["content"]),
            "runId": run_id,
            "iteration": iteration,
            "foldedAtMs": int(time.time() * 1000),
            "model": model,
            "messageCount": len(removed),
            "removedStageIds": [],
            "retained": self.retain,
        }
        if self.retain == "conversation":
            span["messages"] = list(removed)
        return [*summaries, summary, *history[cut:]], span
