"""`GET /turns/{turn_id}/events` on `agentjobs web` (tasks/web/): a turn's events as
Server-Sent Events, read with httpx from a real uvicorn server on a free port while a real
worker runs the turn: each event's id, type and TurnEvent JSON, the streamed text with
`?tokens=1`, a resume by Last-Event-ID or `?after=`, the end after the terminal event; the
bearer token when one is set, and the command that refuses to listen beyond loopback without
one."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import orjson
import pytest
import uvicorn
from click.testing import CliRunner
from httpx_sse import ServerSentEvent, connect_sse

from tasks import iter_events
from tasks.cli import main
from tasks.core.settings import SettingsError
from tasks.queue.context import reset
from tasks.testing import wait_until
from tasks.web.app import create_app
from tasks.web.server import check_bind
from tests.tasks.test_streaming import WIRE_FORMATS, ChatServer, chat_server, provider_env, submit

pytestmark = pytest.mark.integration

WEB_TOKEN = "web-test-token-7f3e21c9"


@contextlib.contextmanager
def serving(token: str = "") -> Iterator[str]:
    """The console app under uvicorn in a thread, on a free port of 127.0.0.1: its origin."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(token=token), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    try:
        wait_until(lambda: server.started, 10, "uvicorn to start")
        host, port = sock.getsockname()
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture
def chat() -> Iterator[ChatServer]:
    with chat_server(WIRE_FORMATS["openai"]) as server:
        yield server


@pytest.fixture
def web(make_jobs: Any, chat: ChatServer) -> Iterator[str]:
    """A worker whose agent streams from the model server, and the console serving events."""
    jobs = make_jobs(**provider_env(chat.origin))
    jobs.worker()
    with serving() as origin:
        yield origin


def read(url: str, headers: dict[str, str] | None = None) -> list[ServerSentEvent]:
    """Every event of one response, which ends by itself after the turn's terminal event."""
    with (
        httpx.Client(timeout=30) as client,
        connect_sse(client, "GET", url, headers=dict(headers or {})) as es,
    ):
        assert es.response.status_code == 200
        assert es.response.headers["content-type"].startswith("text/event-stream")
        return list(es.iter_sse())


def test_a_turns_events_stream_as_sse_with_the_text_and_end_after_the_terminal_one(
    web: str,
) -> None:
    # Given a turn whose reply streams for about half a second
    result = submit("over http pieces:40 pause:0.01", "c-web")
    # When a client reads its events with ?tokens=1, from the start (the turn still running)
    sent = read(f"{web}/turns/{result.id}/events?tokens=1")
    reply = result.get(timeout=30)["content"]
    # Then each event's id and type are the TurnEvent's, and its data the TurnEvent as JSON
    expected = list(iter_events(result.id, tokens=True))
    assert [(s.id, s.event) for s in sent] == [(e.id, e.type) for e in expected]
    for message, event in zip(sent, expected, strict=True):
        data = orjson.loads(message.data)
        assert data["id"] == event.id and data["type"] == event.type
        assert data["turn_id"] == result.id and data["data"] == event.data
        assert (data["attempt"], data["iteration"]) == (event.attempt, event.iteration)
        assert datetime.fromisoformat(data["at"]) == event.at
    # And the text is there, in order, and the response ended after the terminal event
    text = "".join(orjson.loads(s.data)["data"]["text"] for s in sent if s.event == "token.delta")
    assert text == reply
    assert sent[-1].event == "turn.succeeded"


def test_without_tokens_the_stream_has_the_other_events_and_resumes_by_last_event_id(
    web: str,
) -> None:
    result = submit("resumable pieces:20", "c-web-resume")
    result.get(timeout=30)
    # A client that does not ask for tokens gets the other events only
    plain = read(f"{web}/turns/{result.id}/events")
    assert [s.id for s in plain] == [e.id for e in iter_events(result.id)]
    assert "token.delta" not in {s.event for s in plain}
    # One that reconnects with Last-Event-ID gets exactly what followed, and so with ?after=
    everything = read(f"{web}/turns/{result.id}/events?tokens=1")
    middle = next(i for i, s in enumerate(everything) if s.event == "token.delta") + 1
    rest = [s.id for s in everything[middle + 1 :]]
    url = f"{web}/turns/{result.id}/events?tokens=1"
    assert [s.id for s in read(url, {"Last-Event-ID": everything[middle].id})] == rest
    assert [s.id for s in read(f"{url}&after={everything[middle].id}")] == rest


def test_an_unknown_turn_is_404_and_a_bad_event_id_400(make_jobs: Any) -> None:
    make_jobs()
    with serving() as origin:
        assert httpx.get(f"{origin}/turns/no-such-turn/events").status_code == 404
        result = submit("never run", "c-web-bad")  # no worker: it stays queued
        bad = httpx.get(f"{origin}/turns/{result.id}/events", headers={"Last-Event-ID": "x"})
        assert bad.status_code == 400 and "event id" in bad.json()["error"]


def test_a_store_that_cannot_be_reached_is_503_and_the_server_stays_up(
    make_jobs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_jobs()
    # Given a server whose state store is a port nobody listens on
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    monkeypatch.setenv("AGENTJOBS_STATE_URL", f"redis://127.0.0.1:{dead}/0")
    reset()
    with serving() as origin:
        # When a reader asks for a turn's events, twice
        answers = [httpx.get(f"{origin}/turns/t-1/events") for _ in range(2)]
    # Then each gets a 503 that says why, and the server answered both
    assert [a.status_code for a in answers] == [503, 503]
    assert "state store is unreachable" in answers[1].json()["error"]


def test_with_a_token_every_request_needs_it_as_a_bearer(make_jobs: Any) -> None:
    make_jobs()
    with serving(WEB_TOKEN) as origin:
        url = f"{origin}/turns/no-such-turn/events"
        refused = httpx.get(url)
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(url, headers={"Authorization": f"Bearer {WEB_TOKEN}"}).status_code == 404


def test_the_command_refuses_to_listen_beyond_loopback_without_a_token(make_jobs: Any) -> None:
    make_jobs()
    result = CliRunner().invoke(main, ["web", "--host", "0.0.0.0"])
    assert result.exit_code == 1
    assert "AGENTJOBS_WEB_TOKEN must be set" in result.output
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"):
        check_bind(host, "")
    check_bind("0.0.0.0", WEB_TOKEN)
    with pytest.raises(SettingsError):
        check_bind("example.com", "")
