"""Streamed model calls of both HTTP providers over a real local server speaking their SSE wire
formats: the deltas, the final LLMResponse (equal to `complete`'s for the same reply), and the
failures before and inside a stream."""

from __future__ import annotations

import contextlib
import json
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any, Literal, cast

import pytest
from provider_servers import ANTHROPIC_KEY, OPENAI_KEY, Received, Reply, ScriptedServer

from agent import Agent, TokenDelta, tool
from agent.errors import (
    ProviderConnectionError,
    ProviderError,
    ProviderHTTPError,
    ProviderResponseError,
    ProviderTimeoutError,
    can_resume,
    not_resumable_reason,
)
from agent.messages import LLMRequest, LLMResponse, StreamChunk, ToolCall
from agent.providers.anthropic import AnthropicProvider
from agent.providers.openai import OpenAIChatProvider

# -- a server whose replies may be event streams -----------------------------------------------

StreamEnd = Literal["close", "cut", "stall"]


@dataclass
class StreamReply(Reply):
    """An event stream sent as chunks of a chunked body, `pause_s` apart. `end`: "close" ends
    the body properly, "cut" closes the connection mid-body, "stall" sends nothing more for
    `stall_s` seconds, then closes."""

    pieces: list[bytes] = field(default_factory=list)
    pause_s: float = 0.0
    end: StreamEnd = "close"
    stall_s: float = 0.0


class StreamingServer(ScriptedServer):
    """ScriptedServer (JSON replies, recorded requests) that can also answer with a stream."""

    def __init__(self) -> None:
        super().__init__()
        self._httpd.RequestHandlerClass = _streaming_handler(self)

    def stream(
        self,
        pieces: list[bytes],
        *,
        pause_s: float = 0.0,
        end: StreamEnd = "close",
        stall_s: float = 0.0,
    ) -> None:
        with self._lock:
            self._replies.append(
                StreamReply(pieces=pieces, pause_s=pause_s, end=end, stall_s=stall_s)
            )


def _streaming_handler(server: StreamingServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def handle(self) -> None:
            # A client that stops reading a stream (it failed mid-reply) closes its connection
            # with the rest unread, which resets it under the next request's wait.
            with contextlib.suppress(ConnectionResetError):
                super().handle()

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            received = Received(
                method="POST",
                path=self.path,
                headers={k.lower(): v for k, v in self.headers.items()},
                body=self.rfile.read(length),
                client_port=self.client_address[1],
            )
            reply = server.next_reply(received)
            try:
                if isinstance(reply, StreamReply):
                    self._stream(reply)
                else:
                    self._whole(reply)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up

        def _whole(self, reply: Reply) -> None:
            self.send_response(reply.status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(reply.body)))
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(reply.body)

        def _stream(self, reply: StreamReply) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream; charset=utf-8")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for piece in reply.pieces:
                if reply.pause_s:
                    time.sleep(reply.pause_s)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.flush()
            if reply.end == "stall":
                time.sleep(reply.stall_s)
            if reply.end == "close":
                self.wfile.write(b"0\r\n\r\n")
            else:
                self.close_connection = True  # the body's last chunk never comes

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def server() -> Iterator[StreamingServer]:
    srv = StreamingServer()
    srv.start()
    yield srv
    srv.stop()


def sse(data: Any, event: str | None = None) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    return (f"event: {event}\n" if event else "").encode() + f"data: {text}\n\n".encode()


def split(pieces: list[bytes], size: int) -> list[bytes]:
    """The same bytes cut every `size` bytes, so events and lines straddle network reads."""
    whole = b"".join(pieces)
    return [whole[i : i + size] for i in range(0, len(whole), size)]


def chunks_of(provider: OpenAIChatProvider | AnthropicProvider) -> list[StreamChunk]:
    return list(provider.stream(REQUEST))


def streamed_failure(provider: OpenAIChatProvider | AnthropicProvider) -> tuple[str, ProviderError]:
    """The text streamed before the failure, and the failure."""
    text: list[str] = []
    with pytest.raises(ProviderError) as info:
        for chunk in provider.stream(REQUEST):
            text.append(chunk.text)
    return "".join(text), info.value


REQUEST = LLMRequest(
    system_prompt="Be brief.",
    messages=[{"role": "user", "content": "Weather in Paris and Rome?"}],
    tools=[
        {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ],
    model="agent-model",
)


# -- OpenAI --------------------------------------------------------------------------------


def make_openai(server: ScriptedServer, timeout_s: float = 5.0) -> OpenAIChatProvider:
    return OpenAIChatProvider(
        "gpt-test", base_url=f"{server.origin}/v1", api_key=OPENAI_KEY, timeout_s=timeout_s
    )


OPENAI_USAGE = {"prompt_tokens": 31, "completion_tokens": 9, "total_tokens": 40}


def openai_chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
    return sse(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            "usage": None,
        }
    )


def openai_stream(
    text: list[str],
    calls: Sequence[tuple[str, str, list[str]]] = (),
    finish_reason: str = "stop",
) -> list[bytes]:
    """The SSE form of a completion: text deltas, then the calls' deltas interleaved (id and
    name first, arguments split across many), the finish, the usage chunk and [DONE]."""
    frames = [openai_chunk({"role": "assistant", "content": ""})]
    frames += [openai_chunk({"content": piece}) for piece in text]
    for index, (call_id, name, _) in enumerate(calls):
        start = {"index": index, "id": call_id, "type": "function"}
        frames.append(
            openai_chunk({"tool_calls": [{**start, "function": {"name": name, "arguments": ""}}]})
        )
    longest = max((len(parts) for _, _, parts in calls), default=0)
    for step in range(longest):
        for index, (_, _, parts) in enumerate(calls):
            if step < len(parts):
                delta = {"index": index, "function": {"arguments": parts[step]}}
                frames.append(openai_chunk({"tool_calls": [delta]}))
    frames.append(openai_chunk({}, finish_reason))
    frames.append(sse({"id": "chatcmpl-1", "choices": [], "usage": OPENAI_USAGE}))
    frames.append(sse("[DONE]"))
    return frames


def openai_whole(
    content: str | None, calls: Sequence[tuple[str, str, str]] = (), finish_reason: str = "stop"
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in calls
        ]
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": OPENAI_USAGE,
    }


def test_openai_text_streams_in_order_and_ends_with_completes_response(
    server: StreamingServer,
) -> None:
    # Given the same reply served whole, then as a stream cut at odd byte boundaries
    pieces = ["Sunny", ", 21 °C", " in ", "Paris."]
    server.reply(200, openai_whole("".join(pieces)))
    server.stream(split(openai_stream(pieces), 7))
    provider = make_openai(server)

    # When it is asked for whole, then streamed
    whole = provider.complete(REQUEST)
    chunks = chunks_of(provider)

    # Then the deltas come in order, only the last chunk carries the response, and that
    # response is the one complete returned
    assert [c.text for c in chunks[:-1]] == pieces
    assert all(c.response is None for c in chunks[:-1])
    assert chunks[-1] == StreamChunk("", whole)
    assert whole == LLMResponse(
        content="Sunny, 21 °C in Paris.",
        usage={"inputTokens": 31, "outputTokens": 9, "raw": OPENAI_USAGE},
        stop_reason="stop",
    )
    # And the stream was asked for, with its usage, on the same endpoint and connection
    streamed = server.received[1]
    assert streamed.path == "/v1/chat/completions"
    assert streamed.headers["accept"] == "text/event-stream"
    assert streamed.json() == {
        **server.received[0].json(),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert server.received[0].client_port == streamed.client_port


def test_openai_parallel_tool_calls_with_arguments_split_across_deltas(
    server: StreamingServer,
) -> None:
    # Given a reply with some text and two tool calls whose argument deltas interleave
    paris = ['{"ci', 'ty"', ': "Pa', "ris", '"}']
    rome = ["{", '"city": ', '"Ro', 'me"', "}"]
    calls = [("call_a", "get_weather", paris), ("call_b", "get_weather", rome)]
    server.reply(
        200,
        openai_whole(
            "Checking.",
            [(i, n, "".join(parts)) for i, n, parts in calls],
            "tool_calls",
        ),
    )
    server.stream(openai_stream(["Check", "ing."], calls, "tool_calls"))
    provider = make_openai(server)

    whole = provider.complete(REQUEST)
    chunks = chunks_of(provider)

    # Then both calls come back whole, in index order, with parsed arguments, as complete's
    assert "".join(c.text for c in chunks) == "Checking."
    final = chunks[-1].response
    assert final == whole
    assert final is not None and final.tool_calls == (
        ToolCall(id="call_a", name="get_weather", args={"city": "Paris"}),
        ToolCall(id="call_b", name="get_weather", args={"city": "Rome"}),
    )
    assert final.stop_reason == "tool_calls"
    assert final.usage is not None and final.usage["inputTokens"] == 31


def test_openai_stream_with_a_call_of_no_arguments(server: StreamingServer) -> None:
    server.reply(200, openai_whole(None, [("call_1", "now", "")], "tool_calls"))
    server.stream(openai_stream([], [("call_1", "now", [])], "tool_calls"))
    provider = make_openai(server)

    whole = provider.complete(REQUEST)
    chunks = chunks_of(provider)

    assert chunks == [StreamChunk("", whole)]
    assert whole.tool_calls == (ToolCall(id="call_1", name="now", args={}),)


def test_openai_server_that_ignores_stream_answers_whole(server: StreamingServer) -> None:
    # Given a compatible server that answers a stream request with one JSON completion
    server.reply(200, openai_whole("Sunny in Paris."))
    provider = make_openai(server)

    chunks = chunks_of(provider)

    # Then its text still arrives as chunks, and the last carries the response
    assert "".join(c.text for c in chunks) == "Sunny in Paris."
    assert chunks[-1].response is not None
    assert chunks[-1].response.content == "Sunny in Paris."


def test_openai_error_object_mid_stream_is_classified_by_its_type(
    server: StreamingServer,
) -> None:
    error = {"error": {"message": "The server had an error", "type": "server_error"}}
    server.stream([openai_chunk({"content": "Sun"}), sse(error)])
    too_long = {
        "error": {
            "message": "This model's maximum context length is 8192 tokens",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }
    }
    server.stream([sse(too_long)])
    provider = make_openai(server)

    text, err = streamed_failure(provider)
    assert text == "Sun"
    assert type(err) is ProviderHTTPError and err.status == 500
    assert can_resume(err) and "server_error" in str(err)

    _, err = streamed_failure(provider)
    assert type(err) is ProviderHTTPError and err.status == 400
    assert not_resumable_reason(err) == "context-window"


# -- Anthropic -----------------------------------------------------------------------------


def make_anthropic(server: ScriptedServer, timeout_s: float = 5.0) -> AnthropicProvider:
    return AnthropicProvider(
        "claude-test", api_key=ANTHROPIC_KEY, base_url=server.origin, timeout_s=timeout_s
    )


ANTHROPIC_USAGE = {"input_tokens": 31, "output_tokens": 9}


def anthropic_event(kind: str, **data: Any) -> bytes:
    return sse({"type": kind, **data}, event=kind)


def anthropic_stream(blocks: list[dict[str, Any]], stop_reason: str) -> list[bytes]:
    """The SSE form of a message: each block started, filled by deltas and stopped."""
    start: dict[str, Any] = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": 31, "output_tokens": 1},
    }
    frames = [anthropic_event("message_start", message=start), anthropic_event("ping")]
    for index, block in enumerate(blocks):
        kind = block["type"]
        if kind == "text":
            opening: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": t} for t in block["pieces"]]
        elif kind == "tool_use":
            opening = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in block["pieces"]]
        else:
            opening = {"type": "thinking", "thinking": ""}
            deltas = [{"type": "thinking_delta", "thinking": t} for t in block["pieces"]]
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        frames.append(anthropic_event("content_block_start", index=index, content_block=opening))
        frames += [anthropic_event("content_block_delta", index=index, delta=d) for d in deltas]
        frames.append(anthropic_event("content_block_stop", index=index))
    frames.append(
        anthropic_event(
            "message_delta",
            delta={"stop_reason": stop_reason, "stop_sequence": None},
            usage={"output_tokens": 9},
        )
    )
    frames.append(anthropic_event("message_stop"))
    return frames


def anthropic_whole(blocks: list[dict[str, Any]], stop_reason: str) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": blocks,
        "stop_reason": stop_reason,
        "usage": ANTHROPIC_USAGE,
    }


def test_anthropic_text_streams_in_order_and_ends_with_completes_response(
    server: StreamingServer,
) -> None:
    pieces = ["Sunny", ", 21 °C", " in ", "Paris."]
    server.reply(200, anthropic_whole([{"type": "text", "text": "".join(pieces)}], "end_turn"))
    server.stream(split(anthropic_stream([{"type": "text", "pieces": pieces}], "end_turn"), 11))
    provider = make_anthropic(server)

    whole = provider.complete(REQUEST)
    chunks = chunks_of(provider)

    assert [c.text for c in chunks[:-1]] == pieces
    assert chunks[-1] == StreamChunk("", whole)
    assert whole.usage == {"inputTokens": 31, "outputTokens": 9, "raw": ANTHROPIC_USAGE}
    assert whole.stop_reason == "end_turn"
    streamed = server.received[1]
    assert streamed.path == "/v1/messages"
    assert streamed.headers["accept"] == "text/event-stream"
    assert streamed.json() == {**server.received[0].json(), "stream": True}


def test_anthropic_thinking_text_and_tool_use_with_split_input(server: StreamingServer) -> None:
    # Given a reply that thinks, says something and calls a tool whose input comes in pieces
    thought = ["Paris: ", "call the tool. ", '"Quotes" 🌦️']
    signature = "ErUBCkYIBxgCKkDx+/9ab=="
    parts = ['{"ci', 'ty": "Pa', 'ris"', "}"]
    server.reply(
        200,
        anthropic_whole(
            [
                {"type": "thinking", "thinking": "".join(thought), "signature": signature},
                {"type": "text", "text": "Checking."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
            ],
            "tool_use",
        ),
    )
    server.stream(
        anthropic_stream(
            [
                {"type": "thinking", "pieces": thought, "signature": signature},
                {"type": "text", "pieces": ["Check", "ing."]},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "pieces": parts},
            ],
            "tool_use",
        )
    )
    provider = make_anthropic(server)

    whole = provider.complete(REQUEST)
    chunks = chunks_of(provider)

    # Then only the answer text streams (not the thinking), and the response is complete's
    assert [c.text for c in chunks[:-1]] == ["Check", "ing."]
    assert chunks[-1].response == whole
    assert whole.tool_calls == (ToolCall(id="toolu_1", name="get_weather", args={"city": "Paris"}),)
    assert whole.thinking_blocks == (
        {"type": "thinking", "content": "".join(thought), "signature": signature},
    )
    assert whole.stop_reason == "tool_use"


def test_anthropic_tool_use_without_input_deltas(server: StreamingServer) -> None:
    use = {"type": "tool_use", "id": "toolu_1", "name": "now", "input": {}}
    server.reply(200, anthropic_whole([use], "tool_use"))
    server.stream(anthropic_stream([{**use, "pieces": []}], "tool_use"))
    provider = make_anthropic(server)

    whole = provider.complete(REQUEST)

    assert chunks_of(provider) == [StreamChunk("", whole)]
    assert whole.tool_calls == (ToolCall(id="toolu_1", name="now", args={}),)


@pytest.mark.parametrize(
    ("error_type", "status", "resumable"),
    [
        ("overloaded_error", 529, True),
        ("api_error", 500, True),
        ("rate_limit_error", 429, True),
        ("authentication_error", 401, False),
        ("invalid_request_error", 400, False),
    ],
)
def test_anthropic_error_event_mid_stream_is_classified_by_its_type(
    server: StreamingServer, error_type: str, status: int, resumable: bool
) -> None:
    frames = anthropic_stream([{"type": "text", "pieces": ["Sun", "ny"]}], "end_turn")
    error = anthropic_event("error", error={"type": error_type, "message": "Overloaded"})
    server.stream([*frames[:4], error])  # after the first text delta
    provider = make_anthropic(server)

    text, err = streamed_failure(provider)

    assert text == "Sun"
    assert type(err) is ProviderHTTPError
    assert err.status == status and err.retry_after_s is None
    assert can_resume(err) is resumable
    assert str(err).startswith("anthropic provider: error in the stream: ")
    assert error_type in str(err)


def test_anthropic_error_event_of_an_unknown_type_is_resumable(server: StreamingServer) -> None:
    server.stream([anthropic_event("error", error={"type": "brand_new_error", "message": "?"})])

    _, err = streamed_failure(make_anthropic(server))

    assert type(err) is ProviderHTTPError and err.status is None and can_resume(err)


# -- failures of both ------------------------------------------------------------------------

Kind = Literal["openai", "anthropic"]


@pytest.fixture(params=["openai", "anthropic"])
def kind(request: pytest.FixtureRequest) -> Kind:
    return cast(Kind, request.param)


def make(kind: Kind, server: ScriptedServer, timeout_s: float = 5.0) -> Any:
    return (make_openai if kind == "openai" else make_anthropic)(server, timeout_s)


def text_stream(kind: Kind, pieces: list[str]) -> list[bytes]:
    if kind == "openai":
        return openai_stream(pieces)
    return anthropic_stream([{"type": "text", "pieces": pieces}], "end_turn")


def error_body(kind: Kind, message: str, type_: str) -> dict[str, Any]:
    if kind == "openai":
        return {"error": {"message": message, "type": type_, "param": None, "code": None}}
    return {"type": "error", "error": {"type": type_, "message": message}}


@pytest.mark.parametrize(
    ("status", "headers", "retry_after_s"),
    [(429, {"retry-after": "7"}, 7.0), (503, {"retry-after-ms": "1500"}, 1.5), (503, {}, None)],
)
def test_http_refusal_before_the_stream_is_the_same_error_as_completes(
    kind: Kind,
    server: StreamingServer,
    status: int,
    headers: dict[str, str],
    retry_after_s: float | None,
) -> None:
    for _ in range(2):
        server.reply(status, error_body(kind, "busy", "rate_limit_error"), headers=headers)
    provider = make(kind, server)

    with pytest.raises(ProviderHTTPError) as whole:
        provider.complete(REQUEST)
    text, err = streamed_failure(provider)

    assert text == ""
    assert type(err) is ProviderHTTPError
    assert (err.status, err.retry_after_s) == (status, retry_after_s)
    assert str(err) == str(whole.value)
    assert can_resume(err)


def test_auth_refusal_before_the_stream_is_not_resumable(
    kind: Kind, server: StreamingServer
) -> None:
    server.reply(401, error_body(kind, "invalid x-api-key", "authentication_error"))

    _, err = streamed_failure(make(kind, server))

    assert err.status == 401 and not_resumable_reason(err) == "auth"


@pytest.mark.parametrize("end", ["cut", "close"])
def test_stream_that_drops_mid_reply_is_a_resumable_connection_error(
    kind: Kind, server: StreamingServer, end: StreamEnd
) -> None:
    # Given a stream that stops after its first text delta: the connection breaks mid-body
    # ("cut"), or the body ends cleanly without the end marker ("close")
    frames = text_stream(kind, ["Sun", "ny"])
    server.stream(frames[: 2 if kind == "openai" else 4], end=end)
    provider = make(kind, server)

    text, err = streamed_failure(provider)

    # Then the text so far came through, and the failure is resumable, chaining nothing
    assert text == "Sun"
    assert type(err) is ProviderConnectionError
    assert err.status is None and can_resume(err)
    assert err.__context__ is None and err.__cause__ is None
    assert str(err).startswith(f"{kind} provider:")


def test_stream_that_stalls_mid_reply_is_a_resumable_timeout(
    kind: Kind, server: StreamingServer
) -> None:
    frames = text_stream(kind, ["Sun", "ny"])
    server.stream(frames[:3], end="stall", stall_s=1.5)
    provider = make(kind, server, timeout_s=0.3)

    started = time.monotonic()
    _, err = streamed_failure(provider)

    assert time.monotonic() - started < 1.2
    assert type(err) is ProviderTimeoutError and can_resume(err)
    assert "stalled" in str(err)
    assert err.__context__ is None


def test_slow_stream_within_the_timeout_between_events_is_not_cut(
    kind: Kind, server: StreamingServer
) -> None:
    # Given a reply whose whole takes longer than timeout_s, each event well within it
    server.stream(text_stream(kind, ["a", "b", "c", "d"]), pause_s=0.1)
    provider = make(kind, server, timeout_s=0.4)

    chunks = chunks_of(provider)

    assert "".join(c.text for c in chunks) == "abcd"
    assert chunks[-1].response is not None


def test_comments_and_events_without_data_are_skipped(kind: Kind, server: StreamingServer) -> None:
    frames = text_stream(kind, ["Sun", "ny"])
    server.stream([b": keep-alive\n\n", b"event: ping\ndata:\n\n", *frames])

    assert "".join(c.text for c in chunks_of(make(kind, server))) == "Sunny"


def test_event_that_is_not_json_is_a_response_error(kind: Kind, server: StreamingServer) -> None:
    server.stream([b"data: {not json\n\n"])

    _, err = streamed_failure(make(kind, server))

    assert type(err) is ProviderResponseError and err.status == 200


def test_stream_error_text_never_holds_the_key_or_the_endpoint(
    kind: Kind, server: StreamingServer
) -> None:
    # Given an error event that echoes the credentials and the endpoint
    key = OPENAI_KEY if kind == "openai" else ANTHROPIC_KEY
    echo = f"bad key {key} (masked {key[:8]}****{key[-4:]}) at {server.origin}/v1"
    body = error_body(kind, echo, "api_error")
    server.stream([sse(body, event=None if kind == "openai" else "error")])

    _, err = streamed_failure(make(kind, server))

    shown = " ".join([str(err), repr(err), repr(vars(err)), *traceback.format_exception(err)])
    assert key not in shown and key[-12:] not in shown
    assert "127.0.0.1" not in shown and "[redacted]" in shown


def test_a_finished_stream_leaves_its_connection_for_the_next_call(
    kind: Kind, server: StreamingServer
) -> None:
    server.stream(text_stream(kind, ["one"]))
    server.stream(text_stream(kind, ["two"]))
    provider = make(kind, server)

    answers = [chunks_of(provider)[-1].response for _ in range(2)]

    assert [a.content for a in answers if a is not None] == ["one", "two"]
    assert len({r.client_port for r in server.received}) == 1


def test_an_abandoned_stream_gives_its_connection_back(kind: Kind, server: StreamingServer) -> None:
    # Given a long stream the caller stops reading after one delta
    server.stream(text_stream(kind, [f"w{i} " for i in range(50)]))
    server.stream(text_stream(kind, ["next"]))
    provider = make(kind, server)
    stream = provider.stream(REQUEST)
    while not next(stream).text:
        pass

    # When it is closed, the next call still works
    stream.close()
    assert chunks_of(provider)[-1].response is not None


# -- a whole agent turn, streamed -------------------------------------------------------------


@tool
def get_weather(city: str) -> dict[str, Any]:
    """Current weather for a city."""
    return {"tempC": 21, "city": city}


def test_streamed_turn_tells_deltas_per_iteration_and_records_what_complete_would(
    server: StreamingServer,
) -> None:
    # Given the same two-call turn served whole and then streamed
    call = ("call_1", "get_weather", ['{"city"', ': "Paris"}'])
    server.reply(
        200,
        openai_whole(
            "Let me check.", [("call_1", "get_weather", '{"city": "Paris"}')], "tool_calls"
        ),
    )
    server.reply(200, openai_whole("Sunny, 21 °C."))
    server.stream(openai_stream(["Let me ", "check."], [call], "tool_calls"))
    server.stream(openai_stream(["Sunny", ", 21 °C."]))

    def agent() -> Agent:
        return Agent(provider=make_openai(server), model="gpt-test", tools=[get_weather])

    # When one agent runs it without on_token and another with it
    whole = agent().run("Weather in Paris?")
    deltas: list[TokenDelta] = []
    streamed = agent().run("Weather in Paris?", on_token=deltas.append)

    # Then the deltas came in order, each with its model call's iteration
    assert deltas == [
        TokenDelta(1, "Let me "),
        TokenDelta(1, "check."),
        TokenDelta(2, "Sunny"),
        TokenDelta(2, ", 21 °C."),
    ]
    # And the turn is the same: answer, history, usage, and what the model was sent
    assert streamed.content == whole.content == "Sunny, 21 °C."
    assert streamed.checkpoint.history == whole.checkpoint.history
    assert streamed.usage == whole.usage
    sent = [r.json() for r in server.received]
    for body in sent[2:]:
        assert body.pop("stream") is True and body.pop("stream_options")
    assert sent[2:] == sent[:2]
