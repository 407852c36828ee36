"""A real HTTP server on 127.0.0.1 that answers from a script and records what it received.

Providers are tested over the wire, not by mocking httpx: the recorded requests show what a real
provider API would have been sent (paths, headers, bodies, which TCP connection). A plain module
with a unique name (not conftest) so test files can import it without clashing with other suites.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

OPENAI_KEY = "sk-test-0penai-SECRET-key-4f9a2c"
ANTHROPIC_KEY = "sk-ant-test-SECRET-key-77b1e0"


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: bytes
    client_port: int

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Reply:
    status: int = 200
    body: bytes = b"{}"
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


class ScriptedServer:
    """Answers each request with the next queued Reply; with none queued, a loud 500."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self._replies: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._httpd.daemon_threads = True
        # A short poll interval: shutdown() waits up to one interval.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def origin(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def host_port(self) -> str:
        return self.origin.removeprefix("http://")

    def reply(
        self,
        status: int = 200,
        json_body: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
        delay_s: float = 0.0,
    ) -> None:
        body = raw if raw is not None else json.dumps(json_body).encode()
        with self._lock:
            self._replies.append(Reply(status, body, headers or {}, delay_s))

    def next_reply(self, received: Received) -> Reply:
        with self._lock:
            self.received.append(received)
            if self._replies:
                return self._replies.popleft()
        return Reply(500, b'{"error": {"message": "test server: no scripted reply"}}')

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _handler_for(server: ScriptedServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, so connection reuse is observable

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
            if reply.delay_s:
                time.sleep(reply.delay_s)
            try:
                self.send_response(reply.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(reply.body)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(reply.body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout test)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
