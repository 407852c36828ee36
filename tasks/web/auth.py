"""Who may use the console, and who did what through it.

With AGENTJOBS_WEB_TOKEN set, every request but the sign-in page and the static files needs
either a session (the signed cookie `/login` sets once given the token, with the operator's
name) or `Authorization: Bearer <token>`. A browser without either is sent to `/login`; JSON
and event-stream requests get 401. Without a token (loopback only, tasks/web/server.py) every
request is let in, and `/login` only records the operator's name.

Every POST from a browser must carry the session's CSRF token (a form field `csrf_token`, or
the `X-CSRF-Token` header htmx sends) and, when the browser says where it comes from (Origin,
else Referer), come from the console's own origin: a page elsewhere cannot act in an
operator's name, even on a console without a token. A bearer request is not a browser's and
needs neither; without a token, neither does a request that carries none of a browser's
headers (a script on the machine).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from starlette.datastructures import FormData, Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"
# Who a request acts as when nobody signed in: no token is set, or a bearer without a name.
ANONYMOUS = "console"
OPERATOR_HEADER = "x-agentjobs-operator"
_OPEN_PATHS = ("/login", "/static/")


def session_secret(token: str) -> str:
    """The key the session cookie is signed with: derived from the token, so sessions outlive
    a restart and end when the token changes; a random one per process without a token."""
    if not token:
        return secrets.token_hex(32)
    return hmac.new(token.encode(), b"agentjobs web session", hashlib.sha256).hexdigest()


def token_mark(token: str) -> str:
    """What a session keeps to show it was given the token (not the token itself)."""
    return hashlib.sha256(b"agentjobs web sign-in:" + token.encode()).hexdigest()


@dataclass(frozen=True)
class Caller:
    operator: str  # recorded as the actor of what they do
    by_bearer: bool


def caller(request: Request) -> Caller:
    found: Caller = request.scope["agentjobs.caller"]
    return found


def csrf_token(request: Request) -> str:
    """The session's CSRF token, made on first use."""
    token = request.session.get("csrf")
    if not isinstance(token, str) or not token:
        token = request.session["csrf"] = secrets.token_urlsafe(24)
    return token


def wants_json(headers: Headers) -> bool:
    accept = headers.get("accept", "")
    return "application/json" in accept and "text/html" not in accept


def same_origin(headers: Headers, scheme: str) -> bool:
    """False when the browser names an origin other than the console's own."""
    host = headers.get("host", "")
    origin = headers.get("origin")
    if origin is None:
        referer = headers.get("referer")
        if not referer:
            return True  # nothing said; the CSRF token still has to match
        parts = urlsplit(referer)
        origin = f"{parts.scheme}://{parts.netloc}"
    return hmac.compare_digest(origin, f"{scheme}://{host}")


class Guard:
    """The sign-in rule of the module docstring as an ASGI middleware (under the session
    middleware, so a stream passes through untouched). It leaves the caller in the scope."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token
        self.mark = token_mark(token) if token else ""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        session = scope.get("session", {})
        named = session.get("operator")
        if self._bearer(headers):
            who = Caller(headers.get(OPERATOR_HEADER) or "api", by_bearer=True)
        elif not self.token or (self.mark and session.get("auth") == self.mark):
            who = Caller(named if isinstance(named, str) and named else ANONYMOUS, False)
        elif scope["path"].startswith(_OPEN_PATHS):
            who = Caller(ANONYMOUS, False)
        else:
            await self._refuse(scope, headers)(scope, receive, send)
            return
        scope["agentjobs.caller"] = who
        await self.app(scope, receive, send)

    def _bearer(self, headers: Headers) -> bool:
        scheme, _, given = headers.get("authorization", "").partition(" ")
        return (
            bool(self.token)
            and scheme.lower() == "bearer"
            and hmac.compare_digest(given.strip().encode(), self.token.encode())
        )

    def _refuse(self, scope: Scope, headers: Headers) -> Response:
        browser = "text/html" in headers.get("accept", "") and scope["method"] == "GET"
        if browser:
            query = scope.get("query_string", b"").decode()
            target = scope["path"] + (f"?{query}" if query else "")
            return RedirectResponse(f"/login?next={_quoted(target)}", status_code=303)
        return JSONResponse(
            {
                "error": "sign in at /login, or send Authorization: Bearer <AGENTJOBS_WEB_TOKEN>",
            },
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
        )


def _quoted(path: str) -> str:
    return quote(path, safe="")


def local_target(next_path: str) -> str:
    """Where to go after signing in: a path of this console only, never another site."""
    if not next_path.startswith("/") or next_path.startswith("//") or "\\" in next_path:
        return "/"
    return next_path


class Refused(Exception):
    """A POST the console will not act on: `status` and the reason shown."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


async def checked_post(request: Request) -> FormData:
    """The form of an action POST, once it passed the cross-site checks (Refused if not)."""
    form = await request.form()
    if caller(request).by_bearer:
        return form
    if not same_origin(request.headers, request.url.scheme):
        raise Refused(403, "refused: this request comes from another site")
    given = request.headers.get(CSRF_HEADER) or form.get(CSRF_FIELD)
    expected = request.session.get("csrf")
    if isinstance(given, str) and isinstance(expected, str) and expected:
        if hmac.compare_digest(given, expected):
            return form
    elif not request.app.state.token and not _from_a_browser(request.headers):
        return form  # a script on this machine (no token to send): nothing a site could forge
    raise Refused(403, "refused: the form has no valid CSRF token; reload the page")


# What a browser sends with every POST (cookies, where it comes from, fetch metadata), and a
# script such as curl does not: a forged cross-site request always carries some of them.
_BROWSER_HEADERS = ("cookie", "origin", "referer", "sec-fetch-site")


def _from_a_browser(headers: Headers) -> bool:
    return any(name in headers for name in _BROWSER_HEADERS)
