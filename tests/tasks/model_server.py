"""A model API on 127.0.0.1 for the job system's tests: answers OpenAI chat completions
(`POST .../chat/completions`) and Anthropic messages (`POST .../v1/messages`) with a fixed
answer after `delay_s`, and records what it received (path, headers, JSON body)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]  # lower-cased names
    body: dict[str, Any]


@dataclass
class ModelServer:
    answer: str = "ok"
    delay_s: float = 0.0
    origin: str = ""
    received: list[Received] = field(default_factory=list)

    def reply_for(self, path: str) -> dict[str, Any]:
        if path.endswith("/messages"):
            return {"content": [{"type": "text", "text": self.answer}], "stop_reason": "end_turn"}
        message = {"role": "assistant", "content": self.answer}
        return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}


@contextmanager
def model_server(answer: str = "ok", delay_s: float = 0.0) -> Iterator[ModelServer]:
    model = ModelServer(answer=answer, delay_s=delay_s)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            headers = {k.lower(): v for k, v in self.headers.items()}
            model.received.append(Received(self.path, headers, body))
            time.sleep(model.delay_s)
            data = json.dumps(model.reply_for(self.path)).encode()
            try:
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client timed out and left

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    host, port = server.server_address[:2]
    model.origin = f"http://{host!s}:{port}"
    try:
        yield model
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
