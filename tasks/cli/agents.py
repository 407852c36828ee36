"""`agentjobs agents`: the agents this configuration registers (celeryconfig.py's AGENTS,
extended by AGENTJOBS_AGENTS, as a worker reads them), each with its factory and whether the
factory builds an agent here and now.

Each factory is called once, in this process, importing from the working directory as a worker
does: run it where the workers run, with their environment. A factory that raises, a module
that does not import or a factory that returns no agent.Agent is shown with its one-line,
redacted error. The listing itself exits 0 whatever it finds; `builds` in the JSON is for
scripts, and AGENTJOBS_STRICT_AGENTS=1 makes a worker refuse to start on the same finding.
"""

from __future__ import annotations

import contextlib
import sys

import click

from tasks.cli.output import Column, format_table, plural, print_json, terminal_width
from tasks.core.settings import load_settings
from tasks.queue.app import app
from tasks.turn.registry import AgentCheck, check_registry

_COLUMNS = [Column("agent"), Column("factory"), Column("builds", flexible=True)]


def registered_checks() -> list[AgentCheck]:
    """The registry a worker started here would load, each agent built once. Only the settings
    are read: no store is connected (a cluster's client would connect at once)."""
    settings = load_settings(registry=app.conf.get("AGENTS"))
    # A factory that prints must not corrupt the listing (or its JSON) on stdout.
    with contextlib.redirect_stdout(sys.stderr):
        return check_registry(settings.agents)


@click.command("agents")
@click.option("--json", "as_json", is_flag=True, help="Print the agents as a JSON array.")
def agents(as_json: bool) -> None:
    """The registered agents, each with its factory and whether it builds (its factory is
    called once, importing from the working directory, as a worker does)."""
    checks = registered_checks()
    if as_json:
        print_json(
            [
                {"name": c.name, "factory": c.factory, "builds": c.builds, "error": c.error}
                for c in checks
            ]
        )
        return
    if not checks:
        click.echo(
            "no agents are registered: a worker started here would dead-letter every turn as "
            "unknown_agent; set AGENTJOBS_AGENTS=name=module:factory,... or fill AGENTS in "
            "celeryconfig.py"
        )
        return
    rows = [[c.name, c.factory, "yes" if c.builds else f"no: {c.error}"] for c in checks]
    click.echo(format_table(_COLUMNS, rows, terminal_width()))
    failing = sum(not c.builds for c in checks)
    summary = plural(len(checks), "agent", "agents")
    if failing:
        summary += (
            f", {failing} not built: their turns dead-letter as agent_unavailable "
            "(AGENTJOBS_STRICT_AGENTS=1 makes a worker refuse to start)"
        )
    click.echo(summary)
