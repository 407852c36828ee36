"""Signing in to the console (`/login`) and out (`/logout`): the form takes the token and the
operator's name, recorded as the actor of what they do; a wrong token is refused, and so is a
sign-in posted from another site."""

from __future__ import annotations

import hmac
import secrets

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from tasks.web.auth import local_target, same_origin, token_mark
from tasks.web.render import page

MAX_NAME = 80


async def form_page(request: Request) -> Response:
    return _form(request, "", request.query_params.get("next", "/"))


async def sign_in(request: Request) -> Response:
    form = await request.form()
    target = local_target(str(form.get("next") or "/"))
    if not same_origin(request.headers, request.url.scheme):
        return _form(request, "refused: this sign-in comes from another site", target, 403)
    name = " ".join(str(form.get("operator") or "").split())[:MAX_NAME]
    if not name:
        return _form(request, "give your name: it is recorded with what you do", target, 400)
    token: str = request.app.state.token
    given = str(form.get("token") or "")
    if token and not hmac.compare_digest(given.encode(), token.encode()):
        return _form(request, "that is not the console's token (AGENTJOBS_WEB_TOKEN)", target, 401)
    request.session.clear()
    mark = token_mark(token) if token else ""
    request.session.update({"operator": name, "auth": mark, "csrf": secrets.token_urlsafe(24)})
    return RedirectResponse(target, status_code=303)


async def sign_out(request: Request) -> Response:
    if not same_origin(request.headers, request.url.scheme):
        return _form(request, "refused: this sign-out comes from another site", "/", 403)
    request.session.clear()
    return RedirectResponse("/login", status_code=303)


def _form(request: Request, problem: str, target: str, status_code: int = 200) -> Response:
    needs_token = bool(request.app.state.token)
    context = {"problem": problem, "next": local_target(target), "needs_token": needs_token}
    return page(request, "login.html", context, status_code=status_code)
