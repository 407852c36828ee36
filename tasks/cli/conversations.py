"""`agentjobs conversation show`: a stored conversation (its last messages, five unless --last N
or --all says otherwise, and how many earlier ones were left out) and the unfinished turns in
its queue."""

from __future__ import annotations

from typing import Any

import click
import orjson

from tasks.cli.errors import Failure
from tasks.cli.options import identity_of, not_empty
from tasks.cli.output import plural, print_json
from tasks.cli.turns import listed
from tasks.operate.inspect import ConversationView, conversation_view, summary_of
from tasks.queue.context import job_context

# The messages `conversation show` prints unless --last or --all says otherwise.
LAST_MESSAGES = 5


@click.group("conversation")
def conversation() -> None:
    """Stored conversations."""


def _message_line(message: dict[str, Any], width: int = 100) -> str:
    content = message.get("content")
    text = content if isinstance(content, str) else orjson.dumps(content).decode()
    if not text and message.get("toolCalls"):
        names = [str(call.get("name", "?")) for call in message["toolCalls"]]
        text = f"[calls {', '.join(names)}]"
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


@conversation.command("show")
@click.argument("conversation_id")
@click.option("--tenant", default=None, callback=not_empty, help="The identity's tenant.")
@click.option("--principal", default=None, callback=not_empty, help="The identity's principal.")
@click.option(
    "--last",
    "last",
    type=click.IntRange(min=0),
    default=None,
    metavar="N",
    help=f"Show the last N messages (default {LAST_MESSAGES}).",
)
@click.option("--all", "every", is_flag=True, help="Show every message.")
@click.option("--json", "as_json", is_flag=True, help="Print the conversation as JSON.")
def conversation_show(
    conversation_id: str,
    tenant: str | None,
    principal: str | None,
    last: int | None,
    every: bool,
    as_json: bool,
) -> None:
    """Show a stored conversation (its last messages) and its unfinished turns."""
    if every and last is not None:
        raise click.UsageError("give --last N or --all, not both")
    identity = identity_of(tenant, principal)
    view = conversation_view(job_context(), conversation_id, identity or None)
    if not view.known:
        who = f" of {', '.join(f'{k} {v!r}' for k, v in identity.items())}" if identity else ""
        hint = "" if identity else " (--tenant/--principal select another identity's)"
        raise Failure(f"no conversation {conversation_id!r}{who} is stored or queued{hint}")
    data = _shown(view, None if every else LAST_MESSAGES if last is None else last)
    if as_json:
        print_json(data)
    else:
        _echo_shown(view, data)


def _history(view: ConversationView) -> list[dict[str, Any]]:
    return (view.checkpoint.history or []) if view.checkpoint else []


def _last(history: list[dict[str, Any]], count: int | None) -> list[dict[str, Any]]:
    """The last `count` messages of `history` (all of them for None)."""
    return history if count is None else history[max(0, len(history) - count) :]


def _shown(view: ConversationView, count: int | None) -> dict[str, Any]:
    """The conversation as `--json` prints it, with its last `count` messages (None: all)."""
    history = _history(view)
    checkpoint = view.checkpoint
    return {
        "conversationId": view.conversation_id,
        "namespace": view.namespace,
        "stored": checkpoint is not None,
        "unreadable": view.unreadable or None,
        "turns": sum(1 for m in history if m.get("role") == "user"),
        "turnNumber": checkpoint.turn_number if checkpoint else None,
        "lastRunId": checkpoint.run_id if checkpoint else None,
        "historyLength": len(history),
        "lastMessages": [
            {"role": m.get("role"), "content": _message_line(m, 500)} for m in _last(history, count)
        ],
        "unfinishedTurns": [listed(summary_of(r)) for r in view.unfinished],
    }


def _echo_shown(view: ConversationView, data: dict[str, Any]) -> None:
    """The conversation as lines: what is stored (or why nothing can be read), its last
    messages, and its unfinished turns."""
    history = _history(view)
    click.echo(f"conversation {view.conversation_id} (namespace {view.namespace})")
    if view.unreadable:
        click.echo(f"stored: unreadable: {view.unreadable}")
    elif view.checkpoint is None:
        click.echo("stored: nothing yet (its first turn has not finished)")
    else:
        number = f" (turnNumber {data['turnNumber']})" if data["turnNumber"] else ""
        click.echo(
            f"stored: {plural(data['turns'], 'turn', 'turns')}{number}, "
            f"{plural(len(history), 'message', 'messages')}, last runId {data['lastRunId']}"
        )
        shown = len(data["lastMessages"])
        left_out = len(history) - shown
        if left_out:
            earlier = plural(left_out, "earlier message", "earlier messages")
            click.echo(f"  ... {earlier} not shown (--last N or --all shows more)")
        for message in history[len(history) - shown :]:
            click.echo(f"  {message.get('role')}: {_message_line(message, 70)}")
    unfinished = data["unfinishedTurns"]
    click.echo(f"unfinished turns: {len(unfinished)}")
    for record in unfinished:
        click.echo(f"  {record['turnId']}  {record['describe']}")
