"""What goes to a model and what comes back.

Messages are plain wire-shape dicts (`{"role", "content", "toolCalls"?, ...}`), the same objects
that checkpoint history holds; the runtime never mutates one after it is built.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agent.jsnumbers import js_json

Message = dict[str, Any]

# Keys that belong to the record but never reach a provider (docs/checkpoint.md, D9);
# request_messages tests for the one there is by name.
_RECORD_ONLY_KEYS = ("injectedBy",)

# A word with the whitespace after it, or leading whitespace alone: the pieces join back exactly.
_WORD_PIECES = re.compile(r"\S+\s*|\s+")


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    args: Mapping[str, Any]
    provider_meta: Mapping[str, Any] | None = None

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"id": self.id, "name": self.name, "args": dict(self.args)}
        if self.provider_meta is not None:
            wire["providerMeta"] = dict(self.provider_meta)
        return wire


@dataclass(frozen=True, slots=True)
class LLMResponse:
    content: str = ""
    tool_calls: Sequence[ToolCall] = ()
    usage: Mapping[str, Any] | None = None
    stop_reason: str | None = None
    # Anthropic thinking blocks, wire shape ({type, content, signature?, ...}); echoed back as-is.
    thinking_blocks: Sequence[Mapping[str, Any]] = ()


@dataclass(frozen=True, slots=True)
class LLMRequest:
    system_prompt: str
    messages: list[Message]
    tools: list[dict[str, Any]]
    model: str
    # Run metadata for providers that want it (tracing headers); not part of to_dict().
    run_id: str = field(default="", compare=False)
    iteration: int = field(default=0, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The reference runtime's request shape: {systemPrompt?, messages, tools?, model}.

        No system prompt means no `systemPrompt` key and no tools no `tools` key (not "" or []),
        as the reference writes it (p04)."""
        request: dict[str, Any] = {}
        if self.system_prompt:
            request["systemPrompt"] = self.system_prompt
        request["messages"] = self.messages
        if self.tools:
            request["tools"] = self.tools
        request["model"] = self.model
        return request


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """One piece of a streamed reply: `text`, the answer text it adds (may be ""), and, on the
    last chunk only, `response`, the whole reply as `complete` would have returned it."""

    text: str
    response: LLMResponse | None = None


@runtime_checkable
class LLMProvider(Protocol):
    """`complete(request)` answers a request whole. A provider may also have
    `stream(request) -> Iterator[StreamChunk]`, which the runtime uses when its host watches the
    tokens (`on_token`); it is optional, so it is not part of the Protocol: the runtime looks
    for it and falls back to `complete`."""

    name: str

    def complete(self, request: LLMRequest) -> LLMResponse: ...


def stream_response(response: LLMResponse) -> Iterator[StreamChunk]:
    """A reply a provider has whole, as a stream: its text a word at a time, then the reply."""
    for piece in _WORD_PIECES.findall(response.content):
        yield StreamChunk(piece)
    yield StreamChunk("", response)


def request_messages(history: Sequence[Message]) -> list[Message]:
    """History as the model sees it: ephemeral messages and record-only keys left out."""
    # Called before every model call on the whole history: most messages have neither key,
    # and a key test is the cheapest way to tell.
    out: list[Message] = []
    append = out.append
    for message in history:
        if "ephemeral" in message and message["ephemeral"] is True:
            continue
        if "injectedBy" in message:
            message = {k: v for k, v in message.items() if k not in _RECORD_ONLY_KEYS}
        append(message)
    return out


def is_unicode_text(text: str) -> bool:
    """False for a str holding a lone surrogate: valid Python, but not writable as UTF-8 JSON."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def unicode_text(text: str) -> str:
    """`text` with lone surrogates replaced by U+FFFD (surrogate pairs are joined), so text
    from tools and providers can always be written into a checkpoint."""
    if is_unicode_text(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def user_message(content: str) -> Message:
    return {"role": "user", "content": content}


def assistant_message(response: LLMResponse) -> Message:
    """The model's reply as a history message, its numbers (tool-call args, provider metadata)
    as the reference writes them: this is where they enter the record."""
    message: Message = {"role": "assistant", "content": unicode_text(response.content)}
    if response.tool_calls:
        message["toolCalls"] = [js_json(call.to_wire()) for call in response.tool_calls]
    if response.thinking_blocks:
        message["thinkingBlocks"] = [js_json(dict(block)) for block in response.thinking_blocks]
    return message


def tool_message(call_id: str, tool_name: str, content: str) -> Message:
    return {
        "role": "tool",
        "content": unicode_text(content),
        "toolCallId": call_id,
        "toolName": tool_name,
    }
