"""Turning what a route found into a response: an HTML page or fragment from the package's
Jinja2 templates (autoescaped), or its JSON form when the caller asks for JSON."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import jinja2
import orjson
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from tasks.web.auth import caller, csrf_token

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("tasks.web", "templates"),
    autoescape=jinja2.select_autoescape(default=True),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def _ago(value: datetime | None) -> str:
    if value is None:
        return ""
    seconds = (datetime.now(UTC) - value).total_seconds()
    if seconds < 60:
        return f"{max(0, int(seconds))}s ago"
    if seconds < 3600:
        return f"{int(seconds // 60)}m ago"
    if seconds < 86400:
        return f"{int(seconds // 3600)}h ago"
    return f"{int(seconds // 86400)}d ago"


def _iso(value: datetime | None) -> str:
    return value.isoformat(timespec="seconds") if value is not None else ""


def _json_text(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


_ENV.filters["ago"] = _ago
_ENV.filters["iso"] = _iso
_ENV.filters["json"] = _json_text


def page(
    request: Request, template: str, context: Mapping[str, Any], status_code: int = 200
) -> HTMLResponse:
    """A template rendered with what every page needs: the operator and the CSRF token."""
    who = caller(request)
    html = _ENV.get_template(template).render(
        request=request,
        operator=who.operator,
        csrf=csrf_token(request),
        signed_in=bool(request.session.get("auth")),
        **context,
    )
    return HTMLResponse(html, status_code=status_code)


class JSON(Response):
    """orjson's JSON: dataclasses by their field names, datetimes in ISO 8601."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS)
