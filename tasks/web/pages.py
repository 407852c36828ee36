"""The console's pages (GET), each an HTML page, or its JSON form with
`Accept: application/json` (times in ISO 8601):

    /                       overview: turns per state, oldest runnable age, workers, dead
                            letters per reason, budgets in use, tokens by tenant, state lost
    /turns                  turns newest first, filters state, tenant, agent, conversation
                            (with principal), paged by `after` (JSON: {"turns": [TurnStatus],
                            "next": cursor})
    /turns/{id}             one turn: status, live timeline, journal, pending actions, cancel
                            (JSON: the TurnStatus fields)
    /approvals              every pending action, oldest first (JSON: {"actions": [...]})
    /conversations/{tenant}/{principal}/{id}    the transcript, paged by `start` (`_` for
                            no tenant or principal)
    /dead-letters           entries, filters reason, agent, tenant (JSON: {"entries": [...]})
    /dead-letters/bulk      what "Replay all" or "Purge all" would act on, to confirm

The turn page's parts (`/turns/{id}/status`, `/turns/{id}/actions`) are fragments the page's
script asks for again as the turn's events arrive.
"""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from tasks.core.errors import Reason
from tasks.queue.context import job_context
from tasks.store.records import TurnState
from tasks.web import views
from tasks.web.auth import wants_json
from tasks.web.render import JSON, page


async def overview(request: Request) -> Response:
    figures = await run_in_threadpool(views.overview, job_context())
    if wants_json(request.headers):
        return JSON(figures)
    return page(request, "overview.html", {"figures": figures})


async def turns(request: Request) -> Response:
    query = views.TurnsQuery.of(request.query_params)
    try:
        found = await run_in_threadpool(views.turns, job_context(), query)
    except ValueError as exc:
        return _bad(request, str(exc))
    statuses = [views.status_of(record) for record in found.turns]
    if wants_json(request.headers):
        return JSON({"turns": statuses, "next": found.cursor})
    return page(
        request,
        "turns.html",
        {"query": query, "turns": statuses, "cursor": found.cursor, "states": _STATES},
    )


async def turn(request: Request) -> Response:
    view = await _turn_view(request)
    if view is None:
        return _missing(request, "turn")
    if wants_json(request.headers):
        return JSON(view.status)
    return page(request, "turn.html", {"view": view})


async def turn_status_part(request: Request) -> Response:
    view = await _turn_view(request)
    if view is None:
        return _missing(request, "turn")
    return page(request, "_turn_status.html", {"view": view})


async def turn_actions_part(request: Request) -> Response:
    view = await _turn_view(request)
    if view is None:
        return _missing(request, "turn")
    return page(request, "_turn_actions.html", {"view": view})


async def _turn_view(request: Request) -> views.TurnView | None:
    return await run_in_threadpool(views.turn, job_context(), request.path_params["turn_id"])


async def approvals(request: Request) -> Response:
    pending = await run_in_threadpool(views.approvals, job_context())
    if wants_json(request.headers):
        return JSON({"actions": [action for _, action in pending]})
    return page(request, "approvals.html", {"pending": pending})


async def conversation(request: Request) -> Response:
    params = request.path_params
    try:
        start = int(request.query_params.get("start", "0"))
    except ValueError:
        return _bad(request, "start must be a whole number (the first message shown)")
    found = await run_in_threadpool(
        views.conversation,
        job_context(),
        params["tenant"],
        params["principal"],
        params["conversation_id"],
        start,
    )
    if wants_json(request.headers):
        return JSON(
            {
                "conversationId": found.conversation_id,
                "messages": found.messages,
                "total": found.total,
                "start": found.start,
                "unfinished": [views.status_of(r) for r in found.unfinished],
                "unreadable": found.unreadable or None,
            }
        )
    unfinished = [views.status_of(r) for r in found.unfinished]
    return page(
        request, "conversation.html", {"found": found, "unfinished": unfinished, "page": views.PAGE}
    )


async def dead_letters(request: Request) -> Response:
    query = views.DeadLetterQuery.of(request.query_params)
    entries = await run_in_threadpool(views.dead_letters, job_context(), query)
    rows = [views.entry_row(entry) for entry in entries]
    if wants_json(request.headers):
        return JSON({"entries": rows})
    reasons = [str(reason) for reason in Reason]
    return page(request, "dead_letters.html", {"query": query, "rows": rows, "reasons": reasons})


async def dead_letters_bulk(request: Request) -> Response:
    """The confirmation step of "Replay all" / "Purge all": how many entries it acts on."""
    action = request.query_params.get("action", "")
    if action not in ("replay", "purge"):
        return _bad(request, "action must be replay or purge")
    query = views.DeadLetterQuery.of(request.query_params)
    entries = await run_in_threadpool(views.dead_letters, job_context(), query)
    context: dict[str, Any] = {"action": action, "query": query, "count": len(entries)}
    if wants_json(request.headers):
        return JSON({"action": action, "count": len(entries), **query.params()})
    return page(request, "_bulk_confirm.html", context)


_STATES = tuple(str(state) for state in TurnState)


def _bad(request: Request, problem: str) -> Response:
    if wants_json(request.headers):
        return JSON({"error": problem}, status_code=400)
    return page(request, "error.html", {"problem": problem}, status_code=400)


def _missing(request: Request, what: str) -> Response:
    problem = f"no such {what} (finished turns are kept for AGENTJOBS_RECORD_TTL_S)"
    if wants_json(request.headers):
        return JSON({"error": problem}, status_code=404)
    return page(request, "error.html", {"problem": problem}, status_code=404)
