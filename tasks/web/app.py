"""The console's ASGI app: its routes (pages.py, actions.py, the event stream here), the
session and sign-in in front of them (auth.py), and the vendored static files.

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

import contextlib
from collections.abc import AsyncIterator, Iterator
from importlib import resources

import orjson
from anyio import to_thread
from redis.exceptions import RedisError
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from tasks.operate.events import TurnEvent, iter_events
from tasks.web import actions, login, pages
from tasks.web.auth import Guard, session_secret

_YES = frozenset({"1", "true", "yes", "on"})


def create_app(*, token: str = "") -> Starlette:
    """The console. With `token` (AGENTJOBS_WEB_TOKEN), every request needs a signed-in
    session or `Authorization: Bearer <token>` (auth.py)."""
    middleware = [
        Middleware(
            SessionMiddleware,
            secret_key=session_secret(token),
            session_cookie="agentjobs_console",
            same_site="lax",
            max_age=12 * 3600,
        ),
        Middleware(Guard, token=token),
    ]
    static = resources.files("tasks.web") / "static"
    routes = [
        Route("/", pages.overview),
        Route("/login", login.form_page, methods=["GET"]),
        Route("/login", login.sign_in, methods=["POST"]),
        Route("/logout", login.sign_out, methods=["POST"]),
        Route("/turns", pages.turns),
        Route("/turns/{turn_id}", pages.turn),
        Route("/turns/{turn_id}/status", pages.turn_status_part),
        Route("/turns/{turn_id}/actions", pages.turn_actions_part),
        Route("/turns/{turn_id}/events", turn_events, methods=["GET"]),
        Route("/turns/{turn_id}/cancel", actions.cancel, methods=["POST"]),
        Route("/turns/{turn_id}/actions/{request_id}/approve", actions.approve, methods=["POST"]),
        Route("/turns/{turn_id}/actions/{request_id}/reject", actions.reject, methods=["POST"]),
        Route("/turns/{turn_id}/actions/{request_id}/answer", actions.answer, methods=["POST"]),
        Route("/approvals", pages.approvals),
        Route("/conversations/{tenant}/{principal}/{conversation_id:path}", pages.conversation),
        Route("/dead-letters", pages.dead_letters),
        Route("/dead-letters/bulk", pages.dead_letters_bulk, methods=["GET"]),
        Route("/dead-letters/bulk", actions.bulk, methods=["POST"]),
        Route("/dead-letters/{entry_id}/replay", actions.replay_entry, methods=["POST"]),
        Route("/dead-letters/{entry_id}/purge", actions.purge_entry, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(static)), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=middleware,
        lifespan=_lifespan,
        exception_handlers={RedisError: _store_away},
    )
    app.state.token = token
    return app


# Each open event stream holds a thread of the pool while it waits for the next event (as
# every blocking read here does while it runs): room for that many open turn pages beside the
# page loads, where anyio's default is 40 threads in all.
STREAM_THREADS = 200


@contextlib.asynccontextmanager
async def _lifespan(app: Starlette) -> AsyncIterator[None]:
    to_thread.current_default_thread_limiter().total_tokens = STREAM_THREADS
    yield


async def _store_away(request: Request, exc: Exception) -> Response:
    """Any page while the state store cannot be reached: 503 with one line, the server stays
    up and the next request tries again."""
    error = f"the state store is unreachable ({type(exc).__name__}); try again"
    return JSONResponse({"error": error}, status_code=503)


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
