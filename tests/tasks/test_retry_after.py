"""A provider's `retry-after` reaches the job system (docs/jobs.md, guarantee 4):
a turn on the real
OpenAI provider that gets HTTP 429 with `retry-after: 2` resumes no earlier than 2 s later (the
test settings' own backoff would be 0.1-0.2 s), then succeeds.

The model is a real HTTP server in this process; the worker subprocess reaches it through
AGENTJOBS_TEST_OPENAI_BASE_URL (read by tests.tasks.agents:build_openai_agent)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tasks import run_turn
from tasks.queue.context import job_context
from tests.tasks.agents import TEST_OPENAI_BASE_URL

pytestmark = pytest.mark.integration

RETRY_AFTER_S = 2
ANSWER = "Your order ships on Monday."
# The pump's tick, a worker picking up the wake-up, the HTTP round trip.
LATE_SLACK_S = 2.0


@dataclass
class FakeOpenAI:
    """Answers the first chat completion with 429 + retry-after, every later one normally."""

    requests: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        body = json.loads(handler.rfile.read(int(handler.headers["content-length"])))
        with self.lock:
            self.requests.append((time.monotonic(), body))
            first = len(self.requests) == 1
        if first:
            payload = {"error": {"type": "rate_limit_exceeded", "message": "slow down"}}
            self.reply(handler, 429, payload, {"retry-after": str(RETRY_AFTER_S)})
            return
        completion = {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "model": body.get("model"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": ANSWER},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
        }
        self.reply(handler, 200, completion, {})

    @staticmethod
    def reply(
        handler: BaseHTTPRequestHandler, status: int, payload: Any, headers: dict[str, str]
    ) -> None:
        data = json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("content-type", "application/json")
        handler.send_header("content-length", str(len(data)))
        for name, value in headers.items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(data)


@pytest.fixture
def fake_openai() -> Iterator[tuple[FakeOpenAI, str]]:
    model = FakeOpenAI()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.path != "/v1/chat/completions":
                self.send_error(404)
                return
            model.handle(self)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    yield model, f"http://{host!s}:{port}/v1"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def test_a_429_with_retry_after_resumes_no_earlier_than_asked(
    make_jobs: Any, fake_openai: tuple[FakeOpenAI, str]
) -> None:
    # Given a worker whose agent calls a real OpenAI-compatible server
    server, base_url = fake_openai
    jobs = make_jobs(
        **{
            TEST_OPENAI_BASE_URL: base_url,
            "AGENTJOBS_AGENTS": "openai=tests.tasks.agents:build_openai_agent",
        }
    )
    jobs.worker(pool="threads")
    jobs.pump()

    # When the server answers the turn's first call with 429 and retry-after: 2
    result = run_turn.delay(agent="openai", conversation_id="ra-1", message="where is A-1?")

    # Then the turn succeeds on its second attempt, which called no earlier than 2 s later
    reply = result.get(timeout=30)
    assert reply["content"] == ANSWER
    assert reply["attempts"] == 2

    assert len(server.requests) == 2, [body for _, body in server.requests]
    (first_at, first), (second_at, second) = server.requests
    gap_s = second_at - first_at
    print(f"\nsecond request {gap_s:.3f} s after the 429 (retry-after {RETRY_AFTER_S} s)")
    assert gap_s >= RETRY_AFTER_S
    assert gap_s <= RETRY_AFTER_S + LATE_SLACK_S
    # The resumed attempt sent the same conversation again.
    assert first["model"] == second["model"] == "fake-model"
    assert first["messages"] == second["messages"]
    assert first["messages"][-1] == {"role": "user", "content": "where is A-1?"}

    record = job_context().records.get(result.id)
    assert record is not None
    assert record.state == "succeeded"
    assert record.attempt == 2
    waited_ms = record.due_at_ms - record.first_failed_at_ms
    assert waited_ms >= RETRY_AFTER_S * 1000
    assert record.started_at_ms >= record.due_at_ms
    assert "HTTP 429" in record.last_error
    # docs/jobs.md guarantee 7: the stored error names neither the key nor the endpoint.
    assert "sk-test" not in record.last_error
    assert base_url not in record.last_error
