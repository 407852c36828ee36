"""The `agentjobs web` server, the console's HTTP side (docs/platform.md, "The console"): the
Starlette app (app) and serving it with uvicorn (server). So far it holds one route, a turn's
events as Server-Sent Events, the streamed text included when asked (`GET
/turns/{turn_id}/events`), and the guard every later page shares: it binds to loopback unless
AGENTJOBS_WEB_TOKEN is set, and with the token every request needs `Authorization: Bearer`.
What it shows it reads through tasks.operate, as the CLI does. Needs the `web` extra
(starlette, uvicorn, sse-starlette); nothing imports this package but the `agentjobs web`
command.

May import: tasks.operate, tasks.queue, tasks.core.
"""
