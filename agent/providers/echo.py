"""EchoProvider: a model for local runs that needs no key, no network and never runs out."""

from __future__ import annotations

from collections.abc import Iterator

from agent.messages import LLMRequest, LLMResponse, StreamChunk, stream_response

PREFIX = "echo: "


class EchoProvider:
    """Answers every request with its last user message, prefixed `echo: `.

    The last user message is the last message of role `user` in `request.messages`; a request
    without one (or whose last one has no string content) is answered `echo: ` alone. It never
    calls a tool, even when tools are offered, so every turn ends after one model call.

    `usage` holds `inputTokens` and `outputTokens`, the keys the real providers fill, counted
    as whitespace-separated words (`str.split()`): the input is the words of the system prompt
    plus those of every message's content, the output the words of the answer, `echo:`
    included. "echo: Book a table." is 4 output tokens.

    It keeps no state, so one instance can be shared by any number of threads.
    """

    name = "echo"

    def complete(self, request: LLMRequest) -> LLMResponse:
        answer = PREFIX + _last_user_text(request)
        input_tokens = _words(request.system_prompt) + sum(
            _words(message.get("content")) for message in request.messages
        )
        return LLMResponse(
            content=answer,
            usage={"inputTokens": input_tokens, "outputTokens": _words(answer)},
            stop_reason="stop",
        )

    def stream(self, request: LLMRequest) -> Iterator[StreamChunk]:
        """`complete`'s answer a word at a time, so local runs show streaming too."""
        return stream_response(self.complete(request))

    def __repr__(self) -> str:
        return "EchoProvider()"


def _last_user_text(request: LLMRequest) -> str:
    for message in reversed(request.messages):
        if message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else ""
    return ""


def _words(text: object) -> int:
    return len(text.split()) if isinstance(text, str) else 0
