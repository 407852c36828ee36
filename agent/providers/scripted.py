"""ScriptedProvider: a deterministic provider for tests, demos and the job system's default."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator

from agent.errors import ProviderError
from agent.messages import LLMRequest, LLMResponse, StreamChunk, stream_response

Step = LLMResponse | BaseException | Callable[[LLMRequest], LLMResponse]


class ScriptExhaustedError(ProviderError):
    code = "ERR_SCRIPT_EXHAUSTED"


class ScriptedProvider:
    """Answers each request with the next step: an LLMResponse is returned, an exception
    instance is raised, a callable is called with the request. Every request is recorded in
    `.requests`. Safe to share between threads: steps are taken one at a time."""

    name = "scripted"

    def __init__(self, steps: Iterable[Step]) -> None:
        self._steps = list(steps)
        self._next = 0
        self._lock = threading.Lock()
        self.requests: list[LLMRequest] = []

    def complete(self, request: LLMRequest) -> LLMResponse:
        with self._lock:
            self.requests.append(request)
            if self._next >= len(self._steps):
                raise ScriptExhaustedError(
                    f"scripted provider ran out of steps after {len(self._steps)} requests"
                )
            step = self._steps[self._next]
            self._next += 1
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, LLMResponse):
            return step
        return step(request)

    def stream(self, request: LLMRequest) -> Iterator[StreamChunk]:
        """The next step as `complete` takes it (a raising step raises here, before any chunk),
        its text a word at a time."""
        return stream_response(self.complete(request))

    @property
    def remaining(self) -> int:
        with self._lock:
            return len(self._steps) - self._next
