"""`agentjobs turn pending|approve|reject|answer`: the decisions paused turns wait for, listed
and made by a person. The commands are registered on the `turn` group (tasks/cli/turns.py)."""

from __future__ import annotations

from typing import Any

import click
import orjson

from tasks.cli.options import by_identity, json_args
from tasks.cli.output import Column, format_table, plural, print_json, short_time, terminal_width
from tasks.operate.people import answer_question, approve_action, paused_turns, reject_action
from tasks.queue.context import job_context


@click.command("pending")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of paused turns.")
def turn_pending(as_json: bool) -> None:
    """List the paused turns and the decisions each waits for, soonest to expire first."""
    ctx = job_context()
    found: list[dict[str, Any]] = [
        {
            "turnId": record.turn_id,
            "agent": record.agent,
            "conversationId": record.conversation_id,
            "pending": [action.as_dict() for action in actions],
        }
        for record, actions in paused_turns(ctx)
    ]
    if as_json:
        print_json(found)
        return
    if not found:
        click.echo("no turn is waiting for a decision.")
        return
    columns = [
        Column("turn id"),
        Column("request id"),
        Column("kind", drop=2),
        Column("tool", drop=3),
        Column("expires", drop=1),
        Column("asks", flexible=True),
    ]
    rows = [
        [
            turn["turnId"],
            action["requestId"],
            action["kind"],
            action["tool"],
            short_time(action["expiresAt"]),
            action["question"] or orjson.dumps(action["args"]).decode(),
        ]
        for turn in found
        for action in turn["pending"]
    ]
    click.echo(format_table(columns, rows, terminal_width()))
    actions = sum(len(turn["pending"]) for turn in found)
    click.echo(
        f"{plural(len(found), 'paused turn', 'paused turns')}, "
        f"{plural(actions, 'decision', 'decisions')} to make: `agentjobs turn approve|reject "
        "TURN_ID REQUEST_ID`, or `agentjobs turn answer TURN_ID REQUEST_ID TEXT` for a question."
    )


def _decided(turn_id: str, request_id: str, recorded: bool, what: str) -> None:
    if recorded:
        click.echo(f"{what} request {request_id} of turn {turn_id}.")
    else:
        click.echo(
            f"request {request_id} of turn {turn_id} was already decided that way; no change."
        )


@click.command("approve")
@click.argument("turn_id")
@click.argument("request_id")
@click.option(
    "--args",
    "edited_args",
    callback=json_args,
    default=None,
    help="The call's arguments to run instead of the model's, as a JSON object.",
)
@click.option("--actor", default="", help="Who decides (kept in the record and the event).")
@by_identity
def turn_approve(
    turn_id: str, request_id: str, edited_args: Any, actor: str, identity: dict[str, str] | None
) -> None:
    """Approve a paused turn's tool call; the turn resumes once all its requests are decided."""
    job_context()  # settings and Redis first: their failures read as such
    recorded = approve_action(
        turn_id, request_id, edited_args=edited_args, actor=actor, identity=identity
    )
    _decided(turn_id, request_id, recorded, "approved")


@click.command("reject")
@click.argument("turn_id")
@click.argument("request_id")
@click.option("--message", default="", help="What the model is told ([rejected] <message>).")
@click.option("--actor", default="", help="Who decides (kept in the record and the event).")
@by_identity
def turn_reject(
    turn_id: str, request_id: str, message: str, actor: str, identity: dict[str, str] | None
) -> None:
    """Reject a paused turn's tool call: it does not run, and the model is told why."""
    job_context()  # settings and Redis first: their failures read as such
    recorded = reject_action(turn_id, request_id, message=message, actor=actor, identity=identity)
    _decided(turn_id, request_id, recorded, "rejected")


@click.command("answer")
@click.argument("turn_id")
@click.argument("request_id")
@click.argument("text")
@click.option("--actor", default="", help="Who answers (kept in the record and the event).")
@by_identity
def turn_answer(
    turn_id: str, request_id: str, text: str, actor: str, identity: dict[str, str] | None
) -> None:
    """Answer a paused turn's question: the model gets TEXT, verbatim, as the answer."""
    job_context()  # settings and Redis first: their failures read as such
    recorded = answer_question(turn_id, request_id, text, actor=actor, identity=identity)
    _decided(turn_id, request_id, recorded, "answered")


# The commands the `turn` group adds.
COMMANDS = (turn_pending, turn_approve, turn_reject, turn_answer)
