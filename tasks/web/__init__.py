"""The `agentjobs web` server, the console (docs/platform.md, "The console"): the Starlette
app and its routes (app), the pages and their JSON forms (pages, from what views reads), the
operators' actions (actions), signing in and the cross-site checks (auth, login), the Jinja2
templates and vendored htmx (templates/, static/), and serving it with uvicorn (server). It
binds to loopback unless AGENTJOBS_WEB_TOKEN is set. What it shows and does goes through
tasks.operate, as the CLI does. Needs the `web` extra (starlette, uvicorn, sse-starlette,
jinja2, itsdangerous, python-multipart); nothing imports this package but the `agentjobs
web` command.

May import: tasks.operate, tasks.queue, tasks.core, tasks.store, tasks.budgets, tasks.turn, agent.
"""
