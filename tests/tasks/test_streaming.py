"""Every turn streams (docs/platform.md "Token streaming", docs/operations.md "Streaming"): a
real worker runs an agent whose provider talks to a local model server speaking OpenAI's or
Anthropic's streaming wire format (each test that uses the `chat` fixture runs against both),
and the answer text reaches the turn's events as coalesced token.delta events, in order, for a
reader from the start, one that joins mid-turn and one that reconnects; a stream dropped
mid-reply is discarded before its retry; the deltas are removed a token TTL after the turn
ended, the other events kept.

The model server serves only its own format's endpoint, key header and `stream: true`
requests; anything else is refused, so a turn that did not stream that format fails.
It answers by directives in the turn's message:
  pieces:N   the answer in N pieces (default 20)     pause:S   S seconds between pieces
  drop       the first request of this message is cut off after half of its pieces
  tool       first a text and a call of lookup_order whose arguments come in several
             deltas; once the tool answered, "Order " and what it returned
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from agent import Agent, LLMProvider, tool
from tasks import TurnEvent, iter_events, run_turn, turn_status
from tasks.providers import provider_from_settings
from tasks.queue.context import job_context
from tasks.testing import wait_until

pytestmark = pytest.mark.integration

AGENTS = "streamer=tests.tasks.test_streaming:build_streamer"
OPENAI_KEY = "sk-test-stream-0penai-key-91c2"
ANTHROPIC_KEY = "sk-ant-test-stream-key-5d7e"
FIRST_TEXT = "Let me look that up."
# The tool's arguments as the model writes them, a few characters at a time.
ARGUMENT_PIECES = ['{"ord', "erId", '": "A', "-1", '7"}']


# -- the agent the workers run ------------------------------------------------------------------


@tool(effect="read_only")
def lookup_order(orderId: str) -> str:  # the model's argument name
    """Look an order up."""
    return f"shipped:{orderId}"


@functools.cache
def _provider() -> LLMProvider:
    """The provider of the worker's settings (openai or anthropic, at the test's server)."""
    provider = provider_from_settings(job_context().settings)
    assert provider is not None
    return provider


def build_streamer() -> Agent:
    return Agent(provider=_provider(), model="test-model", tools=[lookup_order])


# -- the model server ---------------------------------------------------------------------------


def _sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


def openai_frames(pieces: list[str], call: bool) -> list[bytes]:
    """A chat completion as chat.completion.chunk events: text, a call's deltas, the end."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return _sse({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [choice]})

    frames = [chunk({"role": "assistant", "content": ""})]
    frames += [chunk({"content": piece}) for piece in pieces]
    if call:
        opening = {"index": 0, "id": "call_1", "type": "function"}
        function = {"name": "lookup_order", "arguments": ""}
        frames.append(chunk({"tool_calls": [{**opening, "function": function}]}))
        for part in ARGUMENT_PIECES:
            frames.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": part}}]}))
    frames.append(chunk({}, "tool_calls" if call else "stop"))
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    frames += [_sse({"id": "chatcmpl-1", "choices": [], "usage": usage}), b"data: [DONE]\n\n"]
    return frames


def anthropic_frames(pieces: list[str], call: bool) -> list[bytes]:
    """A message as Anthropic's events: a text block, a tool_use block, the end."""

    def event(kind: str, **data: Any) -> bytes:
        return _sse({"type": kind, **data}, event=kind)

    message = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    frames = [event("message_start", message={**message, "usage": {"input_tokens": 10}})]
    frames.append(event("content_block_start", index=0, content_block={"type": "text", "text": ""}))
    for piece in pieces:
        delta = {"type": "text_delta", "text": piece}
        frames.append(event("content_block_delta", index=0, delta=delta))
    frames.append(event("content_block_stop", index=0))
    if call:
        block = {"type": "tool_use", "id": "toolu_1", "name": "lookup_order", "input": {}}
        frames.append(event("content_block_start", index=1, content_block=block))
        for part in ARGUMENT_PIECES:
            delta = {"type": "input_json_delta", "partial_json": part}
            frames.append(event("content_block_delta", index=1, delta=delta))
        frames.append(event("content_block_stop", index=1))
    stop = {"stop_reason": "tool_use" if call else "end_turn"}
    frames.append(event("message_delta", delta=stop, usage={"output_tokens": 5}))
    frames.append(event("message_stop"))
    return frames


@dataclass(frozen=True)
class WireFormat:
    """One provider's streaming API: what the server accepts and how it writes a reply."""

    provider: str  # AGENTJOBS_PROVIDER
    path: str  # the endpoint
    key_header: str  # where the key comes, and how
    key_value: str
    head: int  # frames before the first text piece
    frames: Callable[[list[str], bool], list[bytes]]


WIRE_FORMATS = {
    "openai": WireFormat(
        "openai", "/v1/chat/completions", "authorization", f"Bearer {OPENAI_KEY}", 1, openai_frames
    ),
    "anthropic": WireFormat(
        "anthropic", "/v1/messages", "x-api-key", ANTHROPIC_KEY, 2, anthropic_frames
    ),
}


def answer_pieces(count: int) -> list[str]:
    """An answer in `count` pieces, each a word and the space after it (the last without)."""
    words = [f"word{i}" for i in range(count)]
    return [w + " " for w in words[:-1]] + words[-1:]


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(str(b.get("text") or b.get("content") or "") for b in content or ())


@dataclass
class ChatServer:
    """The model API on 127.0.0.1 in one wire format (OpenAI chat completions or Anthropic
    messages), streamed."""

    wire: WireFormat
    origin: str = ""
    requests: Counter[str] = field(default_factory=Counter)

    def refusal(self, path: str, headers: Any, body: dict[str, Any]) -> str | None:
        """Why a request is not one this format's streaming provider sends, or None."""
        if path != self.wire.path:
            return f"not found: {path}"
        if headers[self.wire.key_header] != self.wire.key_value:
            return f"no key in {self.wire.key_header}"
        if body.get("stream") is not True:
            return "not a streamed request"
        return None

    def frames(self, body: dict[str, Any]) -> tuple[list[bytes], float, bool]:
        """What to send for a request: the frames, the pause between them, and whether to cut
        the connection halfway through the text."""
        messages = body["messages"]
        prompt = _text_of(next(m["content"] for m in messages if m["role"] == "user"))
        self.requests[prompt] += 1
        results = [
            _text_of(m["content"])
            for m in messages
            if m["role"] == "tool"
            or (isinstance(m["content"], list) and m["content"][0].get("type") == "tool_result")
        ]
        directives = dict(re.findall(r"\b(pieces|pause):([\d.]+)", prompt))
        pieces = answer_pieces(int(directives.get("pieces", 20)))
        call = False
        if "tool" in prompt.split():
            call = not results
            pieces = [FIRST_TEXT] if call else ["Order ", results[-1]]
        frames = self.wire.frames(pieces, call)
        cut = "drop" in prompt.split() and self.requests[prompt] == 1
        if cut:
            frames = frames[: self.wire.head + len(pieces) // 2]
        return frames, float(directives.get("pause", 0.005)), cut


@contextlib.contextmanager
def chat_server(wire: WireFormat) -> Iterator[ChatServer]:
    chat = ChatServer(wire)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # each chunk goes out when written

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            refusal = chat.refusal(self.path, self.headers, body)
            if refusal is not None:
                self.send_error(404 if refusal.startswith("not found") else 400, refusal)
                return
            frames, pause_s, cut = chat.frames(body)
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            try:
                for frame in frames:
                    time.sleep(pause_s)
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
                    self.wfile.flush()
                if cut:
                    self.close_connection = True  # the body's last chunk never comes
                    return
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the worker gave up

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    host, port = server.server_address[:2]
    chat.origin = f"http://{host!s}:{port}"
    try:
        yield chat
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def provider_env(origin: str, provider: str = "openai") -> dict[str, str]:
    """The settings that point the workers' streamer agent at the model server."""
    env = {"AGENTJOBS_AGENTS": AGENTS, "AGENTJOBS_PROVIDER": provider}
    env["AGENTJOBS_MODEL"] = "test-model"
    if provider == "openai":
        env.update(OPENAI_BASE_URL=f"{origin}/v1", OPENAI_API_KEY=OPENAI_KEY)
    else:
        env.update(ANTHROPIC_BASE_URL=origin, ANTHROPIC_API_KEY=ANTHROPIC_KEY)
    return env


@pytest.fixture(params=list(WIRE_FORMATS))
def chat(request: pytest.FixtureRequest) -> Iterator[ChatServer]:
    """The model server, in each wire format in turn."""
    with chat_server(WIRE_FORMATS[request.param]) as server:
        yield server


@pytest.fixture
def streaming(make_jobs: Any, chat: ChatServer) -> Any:
    """A worker and the pump whose streamer agent calls the model server in its format."""
    jobs = make_jobs(**provider_env(chat.origin, chat.wire.provider))
    jobs.worker()
    jobs.pump()
    return jobs


def deltas(events: list[TurnEvent]) -> list[TurnEvent]:
    return [e for e in events if e.type == "token.delta"]


def text(events: list[TurnEvent]) -> str:
    return "".join(e.data["text"] for e in deltas(events))


def submit(message: str, conversation_id: str) -> Any:
    return run_turn.delay(agent="streamer", conversation_id=conversation_id, message=message)


# -- the tests ----------------------------------------------------------------------------------


def test_deltas_come_in_order_among_the_events_and_join_to_the_reply(streaming: Any) -> None:
    # Given a reply streamed in 60 pieces over about 0.6 s
    result = submit("hello pieces:60 pause:0.01", "c-stream")
    # When a reader follows the turn with tokens=True
    events = list(iter_events(result.id, tokens=True))
    reply = result.get(timeout=30)["content"]
    # Then the deltas come between the start and the end, and join to the reply
    types = [e.type for e in events]
    first, last = types.index("token.delta"), len(types) - 1 - types[::-1].index("token.delta")
    assert types.index("turn.started") < first and last < types.index("turn.succeeded")
    assert set(types[first : last + 1]) == {"token.delta"}
    assert text(events) == reply == "".join(answer_pieces(60))
    written = deltas(events)
    assert all(set(e.data) == {"text"} and e.data["text"] and e.attempt == 1 for e in written)
    # And they were coalesced: at most one write per 50 ms and a last one, not one per piece
    streamed_s = (written[-1].at - written[0].at).total_seconds()
    assert 2 <= len(written) <= streamed_s / 0.05 + 2 < 30
    # And a reader that does not ask for tokens sees the other events only, with the same ids
    plain = list(iter_events(result.id))
    assert [e.id for e in plain] == [e.id for e in events if e.type != "token.delta"]


def test_a_reader_that_joins_mid_turn_gets_every_delta_and_one_can_resume(
    streaming: Any,
) -> None:
    # Given a reply that takes about 2 s to stream
    result = submit("slowly pieces:40 pause:0.05", "c-join")
    wait_until(
        lambda: deltas(list(iter_events(result.id, block_s=0, tokens=True))),
        15,
        "the first delta",
    )
    # When a reader joins while the text is still coming
    status = turn_status(result.id)
    assert status is not None and status.state == "running"
    joined = list(iter_events(result.id, tokens=True))
    reply = result.get(timeout=30)["content"]
    # Then it gets every delta of the attempt in flight, from the first one
    assert text(joined) == reply
    assert joined == list(iter_events(result.id, tokens=True))
    # And one that reconnects after a delta in the middle gets exactly the rest
    middle = deltas(joined)[len(deltas(joined)) // 2]
    rest = list(iter_events(result.id, after=middle.id, tokens=True))
    assert rest == joined[joined.index(middle) + 1 :]
    assert text([middle, *rest]) == reply[reply.index(middle.data["text"]) :]


def test_a_stream_dropped_mid_reply_is_discarded_then_the_retry_streams_again(
    streaming: Any, chat: ChatServer
) -> None:
    # Given a model whose first stream breaks off halfway through the reply
    result = submit("flaky drop pieces:20", "c-drop")
    # When the turn is retried (a dropped stream is a resumable provider error)
    assert result.get(timeout=30)["attempts"] == 2
    events = list(iter_events(result.id, tokens=True))
    reply = result.get(timeout=5)["content"]
    # Then the first attempt's deltas are followed by attempt.discarded, then retry.scheduled
    types = [e.type for e in events]
    discarded = types.index("attempt.discarded")
    assert types[discarded + 1] == "retry.scheduled"
    assert events[discarded].data == {"attempt": 1} and events[discarded].attempt == 1
    first = [e for e in deltas(events) if e.attempt == 1]
    assert first and all(events.index(e) < discarded for e in first)
    assert reply.startswith(text(first)) and text(first) != reply
    # And the second attempt streams the whole reply again, after its start
    second = [e for e in deltas(events) if e.attempt == 2]
    assert events.index(second[0]) > types.index("turn.started", discarded)
    assert text(second) == reply
    assert chat.requests["flaky drop pieces:20"] == 2


def test_tool_call_arguments_split_across_deltas_make_the_right_call(
    make_jobs: Any, chat: ChatServer
) -> None:
    # Given a model that streams a text and a call whose arguments come in five deltas
    jobs = make_jobs(**provider_env(chat.origin, chat.wire.provider))
    jobs.worker()
    result = submit("find my order tool", "c-tool")
    # When the turn runs
    reply = result.get(timeout=30)["content"]
    events = list(iter_events(result.id, tokens=True))
    # Then the call ran with the arguments whole (the tool's answer is in the reply)
    assert reply == "Order shipped:A-17"
    started = next(e for e in events if e.type == "tool.started")
    assert started.data["tool"] == "lookup_order"
    assert chat.requests["find my order tool"] == 2  # the call, then the answer
    # And each model call's text streamed in its own iteration, before what followed from it
    assert text(events) == FIRST_TEXT + reply
    before_tool = [e for e in deltas(events) if events.index(e) < events.index(started)]
    assert text(before_tool) == FIRST_TEXT
    assert {e.iteration for e in before_tool}.isdisjoint(
        e.iteration for e in deltas(events) if e not in before_tool
    )


@pytest.mark.parametrize("chat", ["openai"], indirect=True)  # the sweep is the same for both
def test_deltas_are_removed_a_token_ttl_after_the_turn_ended(
    make_jobs: Any, chat: ChatServer
) -> None:
    # Given a token TTL of one second
    jobs = make_jobs(**provider_env(chat.origin, chat.wire.provider), AGENTJOBS_TOKEN_TTL_S="1")
    jobs.worker()
    jobs.pump()
    result = submit("brief pieces:30", "c-ttl")
    result.get(timeout=30)
    everything = list(iter_events(result.id, tokens=True))
    assert deltas(everything)  # just ended: all there
    # When the pump has swept after the TTL
    wait_until(lambda: not deltas(list(iter_events(result.id, tokens=True))), 15, "deltas removed")
    # Then the other events are still there, all of them, and nothing is left to sweep
    kept = list(iter_events(result.id, tokens=True))
    assert kept == [e for e in everything if e.type != "token.delta"]
    assert kept[-1].type == "turn.succeeded"
    keys = job_context().keys
    assert sum(jobs.redis.zcard(shard.tokens) for shard in keys.all_shards()) == 0
