"""The console's ASGI app: its routes and the bearer-token guard in front of them.

    GET /turns/{turn_id}/events   Server-Sent Events, one per TurnEvent: `id:` the event id,
                                  `event:` its type, `data:` the TurnEvent as JSON (times in
                                  ISO 8601). `Last-Event-ID` (or `?after=`) resumes after that
                                  event, `?tokens=1` adds the token.delta events, and the
                                  response ends after the terminal event. 404 for an unknown
                                  turn, 400 for an `after` that is not an event id.

The events are read by tasks.operate.events.iter_events, whose blocking reads run in
Starlette's thread pool: each open stream holds one of its threads while it waits.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator

import orjson
from redis.exceptions import RedisError
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from tasks.operate.events import TurnEvent, iter_events

_YES = frozenset({"1", "true", "yes", "on"})


def create_app(*, token: str = "") -> Starlette:
    """The console. With `token` (AGENTJOBS_WEB_TOKEN), every request must carry it as
    `Authorization: Bearer <token>`; others get 401."""
    middleware = [Middleware(BearerToken, token=token)] if token else []
    return Starlette(
        routes=[Route("/turns/{turn_id}/events", turn_events, methods=["GET"])],
        middleware=middleware,
    )


async def turn_events(request: Request) -> Response:
    """A turn's events as Server-Sent Events, until its terminal event."""
    turn_id = request.path_params["turn_id"]
    after = request.headers.get("last-event-id") or request.query_params.get("after") or None
    tokens = request.query_params.get("tokens", "").lower() in _YES
    try:
        events = await run_in_threadpool(iter_events, turn_id, after=after, tokens=tokens)
    except LookupError as exc:
        return JSONResponse({"error": str(exc)}, status_code=404)
    except ValueError as exc:
        return JSONResponse({"error": str(exc)}, status_code=400)
    except RedisError as exc:  # the server stays up; the client may try again
        error = f"the state store is unreachable ({type(exc).__name__}); try again"
        return JSONResponse({"error": error}, status_code=503)
    return EventSourceResponse(_sent(events))


def _sent(events: Iterator[TurnEvent]) -> Iterator[ServerSentEvent]:
    for event in events:
        # orjson writes the dataclass by its field names, `at` in ISO 8601.
        yield ServerSentEvent(data=orjson.dumps(event).decode(), event=event.type, id=event.id)


class BearerToken:
    """Every HTTP request needs `Authorization: Bearer <token>`: a plain ASGI middleware, so a
    stream passes through it untouched."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._allowed(Headers(scope=scope)):
            refused = JSONResponse(
                {"error": "this server needs Authorization: Bearer <AGENTJOBS_WEB_TOKEN>"},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
            await refused(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _allowed(self, headers: Headers) -> bool:
        scheme, _, given = headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), self.token
        )
