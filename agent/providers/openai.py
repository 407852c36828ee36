"""OpenAI Chat Completions (and compatible servers: vLLM, Ollama, LiteLLM, Azure-style proxies).

Only the keys this mapping knows are sent; anything else on a history message stays in the record
(docs/checkpoint.md, D9) and never reaches the wire.

A streamed completion is put back together in the shape of a whole one and read by the same
`parse_response`, so `stream` ends with exactly the LLMResponse `complete` returns.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
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

DEFAULT_BASE_URL = "https://api.openai.com/v1"
_EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


class OpenAIChatProvider:
    """`POST {base_url}/chat/completions`, one pooled connection set per instance.

    The model sent is this provider's `model`: it is chosen where the credentials are, and an
    Agent's own `model` may be a placeholder. The API key defaults to OPENAI_API_KEY and the base
    URL to OPENAI_BASE_URL. A key is required for the default endpoint only: a self-hosted
    compatible server may need none, and then no Authorization header is sent.
    """

    name = "openai"

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        if not model:
            raise ValueError("OpenAIChatProvider needs a model name")
        self.model = model
        url_source = "base_url" if base_url is not None else "OPENAI_BASE_URL"
        base = base_url if base_url is not None else os.environ.get("OPENAI_BASE_URL")
        self.base_url = check_base_url(base or DEFAULT_BASE_URL, url_source)
        key_source = "api_key" if api_key is not None else "OPENAI_API_KEY"
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        key = check_api_key(key, key_source) if key else ""
        if not key and self.base_url == DEFAULT_BASE_URL:
            raise ValueError("OpenAIChatProvider needs an API key (OPENAI_API_KEY or api_key=)")
        self.timeout_s = check_timeout(timeout_s)
        url = f"{self.base_url}/chat/completions"
        self._endpoint = JSONEndpoint(
            provider=self.name,
            url=url,
            headers={"authorization": f"Bearer {key}"} if key else {},
            timeout_s=self.timeout_s,
            redactor=Redactor(key, [self.base_url, url]),
            key_source="OPENAI_API_KEY",
        )

    def __repr__(self) -> str:
        return f"OpenAIChatProvider(model={self.model!r})"

    def close(self) -> None:
        """Close the pooled connections; a later call opens new ones."""
        self._endpoint.close()

    def redact(self, text: str) -> str:
        """`text` without this provider's key and endpoint: the runtime runs a tool's error
        text through it before the model sees it."""
        return self._endpoint.redact(text)

    def complete(self, request: LLMRequest) -> LLMResponse:
        return parse_response(self._endpoint.post(build_body(self.model, request)))

    def stream(self, request: LLMRequest) -> Iterator[StreamChunk]:
        """The completion as it is written; the stream's own usage chunk is asked for, since
        OpenAI reports usage in a stream only then."""
        body = build_body(self.model, request)
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        return self._endpoint.stream(
            body, _StreamedCompletion(self._endpoint.event_data), parse_response
        )


def build_body(model: str, request: LLMRequest) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    if request.system_prompt:
        messages.append({"role": "system", "content": request.system_prompt})
    messages += [_to_openai(message) for message in request.messages]
    body: dict[str, Any] = {"model": model, "messages": messages}
    if request.tools:  # the API refuses an empty list
        body["tools"] = [_tool(spec) for spec in request.tools]
    return body


def _tool(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": spec["name"],
            "description": spec.get("description", ""),
            "parameters": spec.get("inputSchema") or _EMPTY_SCHEMA,
        },
    }


def _to_openai(message: Message) -> dict[str, Any]:
    role = message.get("role")
    content = message.get("content", "")
    if role == "tool":
        out: dict[str, Any] = {"role": "tool", "content": content}
        if "toolCallId" in message:
            out["tool_call_id"] = message["toolCallId"]
        return out
    calls = message.get("toolCalls") if role == "assistant" else None
    if not calls:
        return {"role": role, "content": content}
    return {
        "role": "assistant",
        # The API's own answers carry null content beside tool calls; echo that shape.
        "content": content or None,
        "tool_calls": [
            {
                "id": call["id"],
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": orjson.dumps(call.get("args", {})).decode(),
                },
            }
            for call in calls
        ],
    }


def parse_response(data: Mapping[str, Any]) -> LLMResponse:
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _shape("no choices[0]")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise _shape("no choices[0].message")
    content = message.get("content")
    if content is None:
        # A refusal (structured outputs) is the model's answer, not a failure.
        content = message.get("refusal") or ""
    if not isinstance(content, str):
        raise _shape("choices[0].message.content is not a string")
    finish_reason = choices[0].get("finish_reason")
    return LLMResponse(
        content=content,
        tool_calls=_tool_calls(message.get("tool_calls") or []),
        usage=_usage(data.get("usage")),
        stop_reason=finish_reason if isinstance(finish_reason, str) else None,
    )


@dataclass
class _StreamedCompletion:
    """The chunks of a streamed completion so far (choice 0, as `complete` reads), kept in the
    shape of a whole completion."""

    read: Callable[[ServerSentEvent], dict[str, Any]]
    content: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: Any = None
    usage: Any = None

    def add(self, event: ServerSentEvent) -> str | None:
        """Takes one chunk in: the answer text it adds, or None at `[DONE]`."""
        if event.data.strip() == "[DONE]":
            return None
        chunk = self.read(event)
        if chunk.get("usage") is not None:  # the last chunk, with `choices` empty
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return ""
        text = ""
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                continue
            for key, parts in (("content", self.content), ("refusal", self.refusal)):
                piece = delta.get(key)
                if isinstance(piece, str) and piece:
                    parts.append(piece)
                    text += piece
            tool_calls = delta.get("tool_calls") or []
            if not isinstance(tool_calls, list):
                raise _shape("delta.tool_calls is not a list")
            for position, item in enumerate(tool_calls):
                self._add_call(position, item)
        return text

    def _add_call(self, position: int, item: Any) -> None:
        """A call's id and name come in its first delta, its arguments across many."""
        function = (item.get("function") or {}) if isinstance(item, dict) else None
        index = item.get("index", position) if isinstance(item, dict) else None
        if not isinstance(function, dict) or not isinstance(index, int):
            raise _shape("a tool_calls delta has no index or function object")
        call = self.calls.setdefault(
            index, {"id": None, "type": "function", "function": {"name": None, "arguments": ""}}
        )
        if call["id"] is None and item.get("id"):
            call["id"] = item["id"]
        if call["function"]["name"] is None and function.get("name"):
            call["function"]["name"] = function["name"]
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            call["function"]["arguments"] += arguments

    def whole(self) -> dict[str, Any]:
        """The completion as `complete` would have received it."""
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self.content) if self.content else None,
        }
        if self.refusal:
            message["refusal"] = "".join(self.refusal)
        if self.calls:
            message["tool_calls"] = [self.calls[index] for index in sorted(self.calls)]
        return {
            "choices": [{"message": message, "finish_reason": self.finish_reason}],
            "usage": self.usage,
        }


def _tool_calls(raw: Sequence[Any]) -> tuple[ToolCall, ...]:
    if not isinstance(raw, list):
        raise _shape("tool_calls is not a list")
    calls: list[ToolCall] = []
    for i, item in enumerate(raw):
        function = item.get("function") if isinstance(item, dict) else None
        if not isinstance(function, dict) or not isinstance(item.get("id"), str):
            raise _shape(f"tool_calls[{i}] has no id or function")
        name = function.get("name")
        arguments = function.get("arguments") or "{}"  # some servers send "" for no arguments
        if not isinstance(name, str) or not isinstance(arguments, str):
            raise _shape(f"tool_calls[{i}].function has no name or arguments string")
        try:
            args = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            args = None
        if not isinstance(args, dict):
            raise ProviderResponseError(
                f"openai provider: the arguments of tool call {i} ({name}) are not a JSON object",
                status=200,
            )
        calls.append(ToolCall(id=item["id"], name=name, args=args))
    return tuple(calls)


def _usage(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        return None
    return {
        "inputTokens": raw.get("prompt_tokens"),
        "outputTokens": raw.get("completion_tokens"),
        "raw": raw,
    }


def _shape(problem: str) -> ProviderResponseError:
    return ProviderResponseError(f"openai provider: unexpected answer shape: {problem}", status=200)
