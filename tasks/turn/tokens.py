"""The streamed answer text of one attempt, on its way to the turn's event stream.

Every turn streams (docs/operations.md, "Streaming"): the worker passes `TokenWriter.add` to the
agent's door as `on_token`. A provider sends a reply in many small pieces, and a Redis write
for each would cost more than the piece is worth, so the writer coalesces: a piece joins the
held text, and the held text goes out as one token.delta event when a flush interval
(AGENTJOBS_TOKEN_FLUSH_MS) has passed since the last write, on the model's own thread, in
order, without a thread of its own. The model call's end flushes what is left
(TurnCheckpoints.after_model_call), before its response is used, so every delta of a response
is in the stream before any event that follows from it. A model call of D seconds thus
makes at most D / interval + 2 writes, whatever the number of pieces.

What the writer holds after the last write of an interval waits for the next piece or the
call's end: before a long silence (a model writing a tool call's arguments) at most one
interval's text is held back until then. A write that fails mid-call (the store away, or refusing
writes) keeps its text for the next one, an interval later; only the final flush waits for the
store (`patiently`, as the check points' writes do). Once a write finds the lease gone the
writer drops what comes: the turn is not this delivery's, and the model call's end stops the
run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from redis.exceptions import RedisError

from agent import TokenDelta

logger = logging.getLogger("agentjobs.turns")


class TokenWriter:
    """One attempt's held text and when it last went out. Called on the door's thread only."""

    def __init__(self, write: Callable[[str], bool], flush_ms: int) -> None:
        self._write = write  # the text as one event; False when the lease is no longer ours
        self._flush_s = flush_ms / 1000
        self._held: list[str] = []
        self._written_at = -float("inf")  # monotonic: the first piece goes out at once
        self._lost = False

    def add(self, delta: TokenDelta) -> None:
        """A piece of answer text (the door's `on_token`): held, and written with the rest of
        the held text once a flush interval has passed since the last write."""
        if self._lost:
            return
        self._held.append(delta.text)
        if time.monotonic() - self._written_at < self._flush_s:
            return
        try:
            self._send()
        except RedisError as exc:  # kept for the next write; the final flush waits it out
            self._written_at = time.monotonic()
            logger.debug("a token write failed (%s); the text waits for the next", exc)

    def flush(self) -> bool:
        """Write the held text now (a model call ended); False when the lease is no longer
        ours. Raises what the store raises, the text still held, so it can be tried again."""
        if not self._lost and self._held:
            self._send()
        return not self._lost

    def _send(self) -> None:
        text = "".join(self._held)
        written = self._write(text)
        self._held.clear()  # written, or refused for good: the turn is not ours
        self._written_at = time.monotonic()
        self._lost = not written
