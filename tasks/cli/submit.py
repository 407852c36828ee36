"""`agentjobs submit`: one turn submitted from a shell, through run_turn's own door (the same
checks, the same registration), and, with --wait, its ending.

Exit statuses: 0 submitted (or, with --wait, succeeded); 1 refused (nothing queued),
dead-lettered (a missed deadline included) or cancelled; 2 a bad argument, or --timeout ran
out (the turn goes on); 130 interrupted while waiting (the turn goes on). Standard output holds
only the turn id, the reply's content or, with --json, one JSON object; everything else is one
line on standard error.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import click
import redis
from celery.exceptions import TimeoutError as WaitTimedOut

from tasks.cli.errors import Failure
from tasks.cli.options import Seconds, identity_of, not_empty
from tasks.cli.output import print_json
from tasks.core.errors import InvalidTurnRequest, Reason, TurnCancelled, TurnDeadLettered
from tasks.turn.tasks import run_turn

# run_turn's argument names, as the command line spells them (for a refusal's wording).
_SPELLED = {
    "agent": "AGENT",
    "conversation_id": "CONVERSATION_ID",
    "message": "MESSAGE",
    "deadline_s": "--deadline",
    "identity": "--tenant/--principal",
    "identity.tenant": "--tenant",
    "identity.principal": "--principal",
}


class StillRunning(Failure):
    """--timeout ran out before the turn ended."""

    exit_code = 2


class StoppedWaiting(Failure):
    """Ctrl+C while waiting."""

    exit_code = 130


def _one_line(text: str) -> str:
    return " ".join(text.split())


def refusal_message(exc: InvalidTurnRequest) -> str:
    """run_turn's refusal in the command line's words: the argument, what is wrong with it."""
    problem = str(exc).removeprefix(f"run_turn: {exc.field}: ")
    return f"refused, nothing was queued: {_SPELLED.get(exc.field, exc.field)} {problem}"


def ending_message(turn_id: str, exc: TurnDeadLettered | TurnCancelled) -> str:
    """How a turn that did not succeed ended, in one line naming it and the reason."""
    if isinstance(exc, TurnCancelled):
        why = f" ({exc.reason})" if exc.reason else ""
        return f"turn {turn_id} was cancelled{why}"
    detail = exc.args[2] if len(exc.args) > 2 and exc.args[2] else ""
    what = "missed its deadline: " if exc.reason == Reason.DEADLINE_EXCEEDED else ""
    return _one_line(
        f"turn {turn_id} {what}dead-lettered as {exc.entry_id} ({exc.reason})"
        + (f": {detail}" if detail else "")
        + f"; `agentjobs dlq show {exc.entry_id}` shows it"
    )


@click.command("submit")
@click.argument("agent")
@click.argument("conversation_id")
@click.argument("message")
@click.option("--tenant", default=None, callback=not_empty, help="The identity's tenant.")
@click.option("--principal", default=None, callback=not_empty, help="The identity's principal.")
@click.option(
    "--deadline",
    type=Seconds(),
    default=None,
    help="End within this long of now (90, 90s, 15m, 2h) or be dead-lettered as "
    "deadline_exceeded. Default: AGENTJOBS_TURN_DEADLINE_S.",
)
@click.option(
    "--wait", is_flag=True, help="Wait until the turn ends and print its reply's content."
)
@click.option(
    "--timeout",
    type=Seconds(positive=True),
    default=None,
    help="With --wait: stop waiting after this long (exit 2); the turn goes on.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print {"turnId": ...}, or with --wait the whole result, as JSON.',
)
def submit(
    agent: str,
    conversation_id: str,
    message: str,
    tenant: str | None,
    principal: str | None,
    deadline: float | None,
    wait: bool,
    timeout: float | None,
    as_json: bool,
) -> None:
    """Submit MESSAGE as the next turn of CONVERSATION_ID, run by AGENT, and print its turn
    id; with --wait, its reply instead. MESSAGE '-' reads it from standard input (without
    its trailing newlines)."""
    if timeout is not None and not wait:
        raise click.UsageError("--timeout needs --wait")
    if message == "-":
        message = sys.stdin.read().rstrip("\r\n")  # as the shell's $(...) drops them
    kwargs: dict[str, Any] = {
        "agent": agent,
        "conversation_id": conversation_id,
        "message": message,
    }
    identity = identity_of(tenant, principal)
    if identity:
        kwargs["identity"] = identity
    if deadline is not None:
        kwargs["deadline_s"] = deadline
    try:
        result = run_turn.apply_async(kwargs=kwargs)
    except InvalidTurnRequest as exc:
        raise Failure(refusal_message(exc)) from None
    turn_id = str(result.id)
    if not wait:
        if as_json:
            print_json({"turnId": turn_id})
        else:
            click.echo(turn_id)
        return
    reply = _wait(result, turn_id, timeout)
    if as_json:
        print_json(reply)
    else:
        click.echo(reply.get("content") or "")


def _wait(result: Any, turn_id: str, timeout: float | None) -> dict[str, Any]:
    """The turn's result once it ends; a Failure for any other ending, or for no ending yet."""
    goes_on = f"it goes on: `agentjobs turn watch {turn_id}` follows it"
    try:
        reply: dict[str, Any] = result.get(timeout=timeout)
    except (TurnDeadLettered, TurnCancelled) as exc:
        raise Failure(ending_message(turn_id, exc)) from None
    except WaitTimedOut:
        _stop_listening(result)
        raise StillRunning(f"turn {turn_id} has not ended after {timeout:g} s; {goes_on}") from None
    except KeyboardInterrupt:
        _stop_listening(result)
        raise StoppedWaiting(f"stopped waiting for turn {turn_id}; {goes_on}") from None
    return reply


def _stop_listening(result: Any) -> None:
    """Unsubscribe from the result of a turn that has not ended, now: left to the result's
    __del__ at exit, the unsubscribe reconnects while the interpreter shuts down, and prints a
    traceback."""
    with contextlib.suppress(redis.RedisError):
        result.backend.remove_pending_result(result)
