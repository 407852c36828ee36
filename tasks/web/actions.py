"""What an operator does through the console (POST, each checked by auth.checked_post and
acting as the signed-in operator):

    /turns/{id}/cancel                              form: reason
    /turns/{id}/actions/{request_id}/approve        form: args (JSON object; empty for the
                                                    model's own)
    /turns/{id}/actions/{request_id}/reject         form: message
    /turns/{id}/actions/{request_id}/answer         form: answer
    /dead-letters/{entry_id}/replay
    /dead-letters/{entry_id}/purge
    /dead-letters/bulk                              form: action (replay|purge), reason, agent,
                                                    tenant, confirm (the count shown)

An htmx request gets a fragment to show where it asked (a notice, and for the dead letters the
list again), with `HX-Trigger: turn-changed` so the page's other parts ask again; a JSON request
gets {"ok", "message"}; a plain form post is sent back to the page it came from.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import orjson
from redis.exceptions import RedisError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from tasks.core.errors import ActionConflict
from tasks.operate.control import cancel_turn
from tasks.operate.people import answer_question, approve_action, reject_action
from tasks.queue.context import JobContext, job_context
from tasks.store.dead_letters import ReplayError
from tasks.turn.ending import replay_dead_letter
from tasks.web import views
from tasks.web.auth import Refused, caller, checked_post, local_target, wants_json
from tasks.web.render import JSON, page

Act = Callable[[Request, FormData, str], str]
logger = logging.getLogger("agentjobs.web")


def action(act: Act) -> Callable[[Request], Awaitable[Response]]:
    """A route that checks the POST, runs `act(request, form, operator)` in the thread pool
    and answers with the message it returns (or the Refused it raised)."""

    async def route(request: Request) -> Response:
        try:
            form = await checked_post(request)
            operator = caller(request).operator
            message = await run_in_threadpool(act, request, form, operator)
            logger.info("%s (%s by %s)", message, act.__name__, operator)
        except Refused as refused:
            return _answer(request, refused.reason, ok=False, status_code=refused.status)
        except ActionConflict as conflict:
            return _answer(request, conflict.problem, ok=False, status_code=409)
        except RedisError as exc:
            problem = f"the state store is unreachable ({type(exc).__name__}); try again"
            return _answer(request, problem, ok=False, status_code=503)
        return _answer(request, message, ok=True)

    route.__name__ = act.__name__
    return route


def _answer(request: Request, message: str, *, ok: bool, status_code: int = 200) -> Response:
    if wants_json(request.headers):
        return JSON({"ok": ok, "message": message}, status_code=status_code)
    if request.headers.get("hx-request"):
        context: dict[str, Any] = {"message": message, "ok": ok, "rows": None}
        if request.url.path.startswith("/dead-letters"):
            query = views.DeadLetterQuery.of(request.query_params)
            entries = views.dead_letters(job_context(), query)
            context["rows"] = [views.entry_row(entry) for entry in entries]
            context["query"] = query
        response = page(request, "_notice.html", context, status_code=status_code)
        if ok:
            response.headers["HX-Trigger"] = "turn-changed"
        return response
    if not ok:
        return page(request, "error.html", {"problem": message}, status_code=status_code)
    back = local_target(_referer_path(request))
    return RedirectResponse(back, status_code=303)


def _referer_path(request: Request) -> str:
    parts = urlsplit(request.headers.get("referer", "/"))
    return parts.path + (f"?{parts.query}" if parts.query else "")


def _turn_and_request(request: Request) -> tuple[str, str]:
    return request.path_params["turn_id"], request.path_params.get("request_id", "")


@action
def cancel(request: Request, form: FormData, operator: str) -> str:
    turn_id, _ = _turn_and_request(request)
    given = str(form.get("reason") or "").strip()
    reason = f"cancelled by {operator} from the console" + (f": {given}" if given else "")
    if cancel_turn(turn_id, reason=reason):
        return f"Turn {turn_id} cancelled."
    raise Refused(409, f"turn {turn_id} had already ended (or is unknown); nothing cancelled")


@action
def approve(request: Request, form: FormData, operator: str) -> str:
    turn_id, request_id = _turn_and_request(request)
    text = str(form.get("args") or "").strip()
    edited = None
    if text:
        try:
            edited = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise Refused(400, f"the arguments are not JSON ({exc}); nothing approved") from None
        if not isinstance(edited, dict):
            raise Refused(400, "the arguments must be a JSON object; nothing approved")
    recorded = approve_action(turn_id, request_id, edited_args=edited, actor=operator)
    return _decided("Approved", request_id, recorded)


@action
def reject(request: Request, form: FormData, operator: str) -> str:
    turn_id, request_id = _turn_and_request(request)
    message = str(form.get("message") or "")
    recorded = reject_action(turn_id, request_id, message=message, actor=operator)
    return _decided("Rejected", request_id, recorded)


@action
def answer(request: Request, form: FormData, operator: str) -> str:
    turn_id, request_id = _turn_and_request(request)
    text = str(form.get("answer") or "")
    recorded = answer_question(turn_id, request_id, text, actor=operator)
    return _decided("Answered", request_id, recorded)


def _decided(verb: str, request_id: str, recorded: bool) -> str:
    if recorded:
        return f"{verb} {request_id}."
    return f"{request_id} was already decided this way; nothing changed."


@action
def replay_entry(request: Request, form: FormData, operator: str) -> str:
    del form, operator
    ctx = job_context()
    entry_id = request.path_params["entry_id"]
    return _replay(ctx, entry_id)


def _replay(ctx: JobContext, entry_id: str) -> str:
    try:
        replayed = replay_dead_letter(ctx, entry_id)
    except ReplayError as exc:
        raise Refused(409, f"{entry_id} was not replayed: {exc}") from None
    if not replayed.first:
        return f"{entry_id} was already replayed as turn {replayed.turn_id}."
    return f"Replayed {entry_id} as turn {replayed.turn_id}."


@action
def purge_entry(request: Request, form: FormData, operator: str) -> str:
    del form, operator
    ctx = job_context()
    entry_id = request.path_params["entry_id"]
    found = ctx.dead_letters.find(entry_id)
    if found is None:
        raise Refused(404, f"no dead-letter entry {entry_id} (replayed or purged already?)")
    ctx.dead_letters.remove([found])
    return f"Purged {entry_id}."


@action
def bulk(request: Request, form: FormData, operator: str) -> str:
    """Replay or purge every entry of a filter, once the count was shown and confirmed."""
    del operator
    kind = str(form.get("action") or "")
    if kind not in ("replay", "purge"):
        raise Refused(400, "action must be replay or purge")
    if not str(form.get("confirm") or "").isdigit():
        raise Refused(400, f"{kind} all acts only after Confirm: ask for the count first")
    ctx = job_context()
    query = views.DeadLetterQuery(
        reason=str(form.get("reason") or ""),
        agent=str(form.get("agent") or ""),
        tenant=str(form.get("tenant") or ""),
    )
    entries = views.dead_letters(ctx, query)
    if kind == "purge":
        removed = ctx.dead_letters.remove(entries)
        return f"Purged {removed} dead-letter entries."
    replayed, skipped = 0, []
    for entry in entries:
        try:
            _replay(ctx, entry.entry_id)
            replayed += 1
        except Refused:
            skipped.append(entry.entry_id)
    note = f"; skipped {len(skipped)}: {', '.join(skipped[:10])}" if skipped else ""
    return f"Replayed {replayed} dead-letter entries{note}."
