"""Serving the console with uvicorn: on loopback, unless AGENTJOBS_WEB_TOKEN guards it.

A turn's events hold its answers, tool names and people's decisions: a server anyone on the
network can reach must ask for the token, so binding beyond loopback without one refuses to
start (section 5 of the platform contract).
"""

from __future__ import annotations

import ipaddress

import uvicorn

from tasks.core.redact import log_redacted
from tasks.core.settings import SettingsError
from tasks.queue.context import job_context
from tasks.web.app import create_app


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a name: it may resolve anywhere
        return False


def check_bind(host: str, token: str) -> None:
    """Refuse (SettingsError) to listen beyond loopback without a token."""
    if not token and not is_loopback(host):
        raise SettingsError(
            f"AGENTJOBS_WEB_TOKEN must be set to serve on {host!r}: without it anyone who "
            "reaches the port reads every turn's events; set it, or keep --host 127.0.0.1"
        )


def serve(host: str, port: int) -> None:
    """Run the console until stopped (SIGINT, SIGTERM)."""
    token = job_context().settings.web_token
    check_bind(host, token)
    log_redacted()
    uvicorn.run(create_app(token=token), host=host, port=port, log_level="info")
