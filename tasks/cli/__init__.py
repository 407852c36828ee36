"""The `agentjobs` command: what an operator needs to see and steer the job system.

    agentjobs --version | -V | version
    agentjobs submit AGENT CONVERSATION_ID MESSAGE [--tenant T] [--principal P] [--deadline S]
                     [--wait [--timeout S]] [--json]
    agentjobs agents [--json]
    agentjobs stats [--json]
    agentjobs usage [--tenant T] [--since DURATION] [--json]
    agentjobs turn list [--state S] [--conversation C] [--agent A] [--limit N] [--json]
    agentjobs turn show TURN_ID [--json]
    agentjobs turn watch|cancel TURN_ID, turn pending, turn approve|reject|answer ...
    agentjobs conversation show ID [--tenant T] [--principal P] [--json]
    agentjobs dlq list [--reason R] [--json]
    agentjobs dlq show ID [--json]
    agentjobs dlq replay ID | --all [--reason R]
    agentjobs dlq purge --reason R | --older-than DURATION | --all [--yes]
    agentjobs pump
    agentjobs metrics [--port 9808] [--host 0.0.0.0]
    agentjobs web [--host 127.0.0.1] [--port 8088]
    agentjobs demo

This package owns the command line only: parsing arguments, wording what is printed, and
exit statuses. What the commands read or change is done by the packages below it. This module
holds the root group (`main`, the console script's entry) and adds the commands of the other
modules to it: submit.py, agents.py, stats.py, usage.py, turns.py with decisions.py (`turn ...`),
conversations.py, dlq.py, processes.py (pump, metrics, demo), web.py (web); options.py holds
the shared argument types, output.py the printing helpers. An expected failure (Redis
unreachable, a bad setting, an unknown id, a bad argument) is one line on stderr and a non-zero
exit status, for every command at once (errors.py). Nothing outside this package imports it.

May import: tasks.operate, tasks.turn, tasks.queue, tasks.budgets, tasks.store, tasks.core,
tasks.telemetry, tasks.demo, tasks.web, agent.
"""

from __future__ import annotations

from importlib.metadata import version as installed_version

import click

from tasks.cli import agents, conversations, dlq, processes, stats, submit, turns, usage, web
from tasks.cli.errors import AgentjobsGroup
from tasks.cli.options import parse_duration_s


@click.group(
    cls=AgentjobsGroup, name="agentjobs", context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(
    None,
    "-V",
    "--version",
    package_name="agentjobs",
    prog_name="agentjobs",
    message="%(prog)s %(version)s",
)
def main() -> None:
    """agentjobs: durable agent turns on Celery."""


@click.command("version")
def version() -> None:
    """Print the installed agentjobs version (as --version does)."""
    click.echo(f"agentjobs {installed_version('agentjobs')}")


for _command in (
    version,
    submit.submit,
    agents.agents,
    stats.stats,
    usage.usage,
    turns.turn,
    conversations.conversation,
    dlq.dlq,
    processes.pump,
    processes.metrics,
    processes.demo,
    web.web,
):
    main.add_command(_command)

__all__ = ["main", "parse_duration_s"]
