"""Anthropic Messages API.

Thinking blocks go back to the API exactly as they came (Anthropic refuses a tool round whose
thinking signature changed), first in the assistant turn. Only the keys this mapping knows are
sent; anything else on a history message stays in the record
(docs/checkpoint.md, D9).

A streamed message is put back together in the shape of a whole one (its content blocks, stop
reason and usage) and read by the same `parse_response`, so `stream` ends with exactly the
LLMResponse `complete` returns.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from httpx_sse import ServerSentEvent

from agent.errors import ProviderResponseError
from agent.messages import (
    LLMRequest,
    LLMResponse,
    Message,
    StreamChunk,
    ToolCall,
)
from agent.providers._http import (
    JSONEndpoint,
    Redactor,
    check_api_key,
    check_base_url,
    check_timeout,
)

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
_EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


class AnthropicProvider:
    """`POST {base_url}/v1/messages`, one pooled connection set per instance.

    The model sent is this provider's `model` (see OpenAIChatProvider). The key defaults to
    ANTHROPIC_API_KEY, the base URL to ANTHROPIC_BASE_URL. `thinking_budget_tokens` turns on
    extended thinking; it must be below `max_tokens`.
    """

    name = "anthropic"

    def __init__(
        self,
        model: str,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout_s: float = 60.0,
        max_tokens: int = 4096,
        thinking_budget_tokens: int | None = None,
    ) -> None:
        if not model:
            raise ValueError("AnthropicProvider needs a model name")
        self.model = model
        self.max_tokens = max_tokens
        self.thinking_budget_tokens = thinking_budget_tokens
        url_source = "base_url" if base_url is not None else "ANTHROPIC_BASE_URL"
        base = base_url if base_url is not None else os.environ.get("ANTHROPIC_BASE_URL")
        self.base_url = check_base_url(base or DEFAULT_BASE_URL, url_source)
        key_source = "api_key" if api_key is not None else "ANTHROPIC_API_KEY"
        key = api_key if api_key is not None else os.environ.get("ANTHROPIC_API_KEY", "")
        if not key:
            raise ValueError("AnthropicProvider needs an API key (ANTHROPIC_API_KEY or api_key=)")
        key = check_api_key(key, key_source)
        self.timeout_s = check_timeout(timeout_s)
        url = f"{self.base_url}/v1/messages"
        self._endpoint = JSONEndpoint(
            provider=self.name,
            url=url,
            headers={"x-api-key": key, "anthropic-version": API_VERSION},
            timeout_s=self.timeout_s,
            redactor=Redactor(key, [self.base_url, url]),
            key_source="ANTHROPIC_API_KEY",
        )

    def __repr__(self) -> str:
        return f"AnthropicProvider(model={self.model!r})"

    def close(self) -> None:
        """Close the pooled connections; a later call opens new ones."""
        self._endpoint.close()

    def redact(self, text: str) -> str:
        """`text` without this provider's key and endpoint: the runtime runs a tool's error
        text through it before the model sees it."""
        return self._endpoint.redact(text)

    def complete(self, request: LLMRequest) -> LLMResponse:
        return parse_response(self._endpoint.post(self._body(request)))

    def stream(self, request: LLMRequest) -> Iterator[StreamChunk]:
        """The message as it is written: its text deltas, then the whole reply at
        `message_stop`."""
        body = self._body(request)
        body["stream"] = True
        return self._endpoint.stream(
            body, _StreamedMessage(self._endpoint.event_data), parse_response
        )

    def _body(self, request: LLMRequest) -> dict[str, Any]:
        body = build_body(self.model, self.max_tokens, request)
        if self.thinking_budget_tokens is not None:
            body["thinking"] = {"type": "enabled", "budget_tokens": self.thinking_budget_tokens}
        return body


def build_body(model: str, max_tokens: int, request: LLMRequest) -> dict[str, Any]:
    system_parts = [request.system_prompt] if request.system_prompt else []
    messages: list[dict[str, Any]] = []
    tool_results: list[dict[str, Any]] | None = None  # the user turn that tool messages fill
    for message in request.messages:
        role = message.get("role")
        if role == "tool":
            if tool_results is None:  # consecutive tool results share one user turn
                tool_results = []
                messages.append({"role": "user", "content": tool_results})
            tool_results.append(
                {
                    "type": "tool_result",
                    "tool_use_id": message.get("toolCallId"),
                    "content": message.get("content", ""),
                }
            )
            continue
        tool_results = None
        if role == "system":
            # The Messages API has no system role inside the conversation; such messages join
            # the system prompt, in order.
            system_parts.append(message.get("content", ""))
        elif role == "assistant":
            messages.append({"role": "assistant", "content": _assistant_content(message)})
        else:
            messages.append({"role": role, "content": message.get("content", "")})
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "messages": messages}
    if system_parts:
        body["system"] = "\n\n".join(system_parts)
    if request.tools:
        body["tools"] = [
            {
                "name": spec["name"],
                "description": spec.get("description", ""),
                "input_schema": spec.get("inputSchema") or _EMPTY_SCHEMA,
            }
            for spec in request.tools
        ]
    return body


def _assistant_content(message: Message) -> str | list[dict[str, Any]]:
    thinking = message.get("thinkingBlocks") or []
    calls = message.get("toolCalls") or []
    text = message.get("content", "")
    if not thinking and not calls:
        return str(text)
    blocks = [_thinking_to_anthropic(block) for block in thinking]
    if text:  # the API refuses empty text blocks
        blocks.append({"type": "text", "text": text})
    blocks += [
        {"type": "tool_use", "id": call["id"], "name": call["name"], "input": call.get("args", {})}
        for call in calls
    ]
    return blocks


def _thinking_to_anthropic(block: Mapping[str, Any]) -> dict[str, Any]:
    if block.get("type") == "redacted_thinking":
        return {"type": "redacted_thinking", "data": block.get("content", "")}
    out: dict[str, Any] = {"type": "thinking", "thinking": block.get("content", "")}
    if "signature" in block:
        out["signature"] = block["signature"]
    return out


def parse_response(data: Mapping[str, Any]) -> LLMResponse:
    blocks = data.get("content")
    if not isinstance(blocks, list):
        raise _shape("no content list")
    texts: list[str] = []
    calls: list[ToolCall] = []
    thinking: list[dict[str, Any]] = []
    for i, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(_field(block, "text", str, i))
        elif kind == "tool_use":
            calls.append(
                ToolCall(
                    id=_field(block, "id", str, i),
                    name=_field(block, "name", str, i),
                    args=_field(block, "input", dict, i),
                )
            )
        elif kind == "thinking":
            entry = {"type": "thinking", "content": _field(block, "thinking", str, i)}
            if isinstance(block.get("signature"), str):
                entry["signature"] = block["signature"]
            thinking.append(entry)
        elif kind == "redacted_thinking":
            thinking.append({"type": "redacted_thinking", "content": _field(block, "data", str, i)})
        # Other block kinds (server tool results, citations' own blocks) carry no answer text.
    stop_reason = data.get("stop_reason")
    return LLMResponse(
        content="".join(texts),
        tool_calls=tuple(calls),
        usage=_usage(data.get("usage")),
        stop_reason=stop_reason if isinstance(stop_reason, str) else None,
        thinking_blocks=tuple(thinking),
    )


# The delta kinds that add to a block's string field (citations_delta adds no text).
_DELTA_FIELDS = {
    "text_delta": "text",
    "thinking_delta": "thinking",
    "signature_delta": "signature",
}


@dataclass
class _StreamedMessage:
    """The events of a streamed message so far, kept as the content blocks, stop reason and
    usage of a whole message."""

    read: Callable[[ServerSentEvent], dict[str, Any]]
    blocks: dict[int, dict[str, Any]] = field(default_factory=dict)
    partial_json: dict[int, list[str]] = field(default_factory=dict)
    stop_reason: Any = None
    usage: dict[str, Any] = field(default_factory=dict)

    def add(self, sse: ServerSentEvent) -> str | None:
        """Takes one event in: the answer text it adds, or None at `message_stop`."""
        event = self.read(sse)
        kind = str(event.get("type", sse.event))
        if kind == "message_stop":
            return None
        if kind == "message_start":
            message = event.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            self.usage.update(usage if isinstance(usage, dict) else {})
        elif kind == "content_block_start":
            block = event.get("content_block")
            if not isinstance(block, dict):
                raise _shape("content_block_start has no content_block")
            self.blocks[_index(kind, event)] = dict(block)
        elif kind == "content_block_delta":
            return self._add_delta(_index(kind, event), event.get("delta"))
        elif kind == "message_delta":
            delta = event.get("delta")
            if isinstance(delta, dict) and "stop_reason" in delta:
                self.stop_reason = delta["stop_reason"]
            usage = event.get("usage")
            self.usage.update(usage if isinstance(usage, dict) else {})
        # ping and content_block_stop carry nothing the reply needs.
        return ""

    def _add_delta(self, index: int, delta: Any) -> str:
        block = self.blocks.get(index)
        if block is None or not isinstance(delta, dict):
            raise _shape(f"content_block_delta for block {index}, which did not start")
        kind = delta.get("type")
        if kind == "input_json_delta":
            self.partial_json.setdefault(index, []).append(str(delta.get("partial_json", "")))
            return ""
        key = _DELTA_FIELDS.get(str(kind))
        piece = delta.get(key) if key is not None else None
        if key is None or not isinstance(piece, str):
            return ""
        block[key] = str(block.get(key) or "") + piece
        return piece if kind == "text_delta" else ""

    def whole(self) -> dict[str, Any]:
        """The message as `complete` would have received it."""
        for index, parts in self.partial_json.items():
            text = "".join(parts)
            if text:  # a tool without arguments may send none: its start block's `input` holds
                try:
                    self.blocks[index]["input"] = orjson.loads(text)
                except orjson.JSONDecodeError:
                    raise _shape(f"content[{index}].input is not JSON") from None
        return {
            "content": [self.blocks[index] for index in sorted(self.blocks)],
            "stop_reason": self.stop_reason,
            "usage": self.usage or None,
        }


def _index(kind: str, event: Mapping[str, Any]) -> int:
    index = event.get("index")
    if not isinstance(index, int) or isinstance(index, bool):
        raise _shape(f"{kind} has no block index")
    return index


def _field(block: Mapping[str, Any], key: str, kind: type[Any], index: int) -> Any:
    value = block.get(key)
    if not isinstance(value, kind):
        raise _shape(f"content[{index}].{key} is not a {kind.__name__}")
    return value


def _usage(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        return None
    return {
        "inputTokens": raw.get("input_tokens"),
        "outputTokens": raw.get("output_tokens"),
        "raw": raw,
    }


def _shape(problem: str) -> ProviderResponseError:
    return ProviderResponseError(
        f"anthropic provider: unexpected answer shape: {problem}", status=200
    )
