"""`agentjobs web`: the console's HTTP server (tasks/web/), run until stopped."""

from __future__ import annotations

import click

from tasks.cli.errors import Failure

# The `web` extra's modules: without them the command says what to install.
_WEB_EXTRA = frozenset({"starlette", "uvicorn", "sse_starlette"})


@click.command("web")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on; beyond loopback only with AGENTJOBS_WEB_TOKEN set.",
)
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8088, show_default=True, help="TCP port."
)
def web(host: str, port: int) -> None:
    """Serve the console: the overview, turns, a turn's live page with its approvals and
    cancel, the approvals, conversations and dead letters (each page also JSON with Accept:
    application/json); GET /turns/TURN_ID/events streams a turn's events (Server-Sent Events;
    ?tokens=1 adds the streamed text, Last-Event-ID resumes). Sign-in with
    AGENTJOBS_WEB_TOKEN when set."""
    try:
        from tasks.web.server import serve
    except ModuleNotFoundError as missing:
        if missing.name not in _WEB_EXTRA:
            raise
        raise Failure(f"agentjobs web needs {missing.name}: pip install 'agentjobs[web]'") from None
    serve(host, port)
